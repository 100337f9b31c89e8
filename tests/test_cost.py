"""The one cost model (asap/cost): formulas written once and shared, attention TP with its all-reduce,
rank groups, and contention only while communication overlaps compute."""
import pytest

from asap.cost import ops
from asap.cost.hardware import get_hardware
from asap.cost.model import CostModel
from asap.cost.flops import attention_flops, prefill_flops
from asap.sim.run import get_model, uniform_shares
from asap.workers.costs import CostTable


@pytest.fixture(scope="module")
def cfg():
    return get_model("deepseek-v3")


def test_workers_and_simulator_answer_from_the_same_functions(cfg):
    cost = CostModel(cfg, get_hardware("h800"))
    table = CostTable(cost)
    chunks = [(3000, 0), (1000, 5000)]
    assert table.attention_layer(chunks, True) == cost.attention_seconds(True, *ops.chunk_work(chunks))
    assert table.experts(4096, 9) == cost.expert_gemm_seconds(4096, 9)
    # the FLOP counter of asap.model is the cost model's formula
    s = ops.attention_shape(cfg)
    assert attention_flops(cfg, 512, 100) == 2 * 512 * s.proj_params + s.core_flops_per_pair * ops.causal_pairs(512, 100)
    assert prefill_flops(cfg, 1024) > cfg.num_layers * attention_flops(cfg, 1024)


def test_attention_tp_splits_the_work_and_pays_an_all_reduce(cfg):
    hw = get_hardware("h100")
    one, eight = CostModel(cfg, hw), CostModel(cfg, hw, attn_tp=8)
    T = 16384
    a1, a8 = one.attention_ops(True, T, ops.causal_pairs(T, 0), T), eight.attention_ops(True, T, ops.causal_pairs(T, 0), T)
    assert "attn_tp" not in a1 and a8["attn_tp"] > 0
    assert a8["attn_core"] == pytest.approx(a1["attn_core"] / 8, rel=0.05)
    assert a8["attn_proj"] == pytest.approx(a1["attn_proj"] / 8, rel=0.05)
    # all-reduce bytes: 2 (tp-1)/tp of T x D BF16 at the profile's bus rate
    expected = 2 * hw.link.latency_s + 2 * 7 / 8 * T * cfg.hidden_size * 2 / hw.link.allreduce_bytes_per_s
    assert a8["attn_tp"] == pytest.approx(expected, rel=0.01)
    assert sum(a8.values()) < sum(a1.values())
    with pytest.raises(ValueError, match="node"):
        CostModel(cfg, hw, attn_tp=16)


def test_contention_only_while_overlapped(cfg):
    hw = get_hardware("h800")
    over, alone = CostModel(cfg, hw), CostModel(cfg, hw, overlapped=False)
    assert over.rates["experts"].flops_per_s == pytest.approx(alone.rates["experts"].flops_per_s
                                                              * (1 - hw.comm_compute_share))
    T = 16384
    assert over.attention_seconds(True, T, ops.causal_pairs(T, 0), T) > alone.attention_seconds(
        True, T, ops.causal_pairs(T, 0), T)


def test_a_rank_group_spreads_its_experts_and_traffic_over_its_devices(cfg):
    hw = get_hardware("h800")
    per_device, grouped = CostModel(cfg, hw), CostModel(cfg, hw, attn_tp=8, rank_devices=8)
    tokens = 32 * 16384
    e32 = per_device.expert_seconds(0, tokens, uniform_shares(cfg, 32))
    e4 = grouped.expert_seconds(0, tokens, uniform_shares(cfg, 4))
    assert e4 == pytest.approx(e32, rel=0.05)
    # one group sends its tokens from 8 devices: a copy costs 1/8 of one device's
    assert grouped.seconds_per_copy(4, True, 4, 1.0) == pytest.approx(
        per_device.seconds_per_copy(32, True, 32, 1.0) / 8, rel=1e-9)
