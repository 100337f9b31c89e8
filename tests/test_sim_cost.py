"""The cost model: causal attention grows as L^2, ops switch between memory- and compute-bound,
profiles round-trip through JSON, and op-rate fits recover known rates."""
import json

import pytest

from asap.studies.calibrate import fit_op_rate
from asap.sim.cost import CostModel
from asap.sim.hardware import OP_NAMES, OpRate, from_json, get_hardware, load_profile
from asap.sim.run import get_model, uniform_shares


@pytest.fixture(scope="module")
def dsv3():
    return CostModel(get_model("deepseek-v3"), get_hardware("h800"))


def core(cost, n, ctx=0):
    pairs = n * ctx + n * (n + 1) // 2
    return cost.attention_ops(True, n, pairs, ctx + n)["attn_core"]


def test_attention_core_grows_as_length_squared(dsv3):
    t8, t16, t32 = core(dsv3, 8192), core(dsv3, 16384), core(dsv3, 32768)
    assert t16 / t8 == pytest.approx(4, rel=0.02)
    assert t32 / t16 == pytest.approx(4, rel=0.02)


def test_chunk_with_context_costs_n_times_context(dsv3):
    # the second 8K chunk of a 16K prompt attends to 8K earlier tokens: 3x the first chunk's pairs
    first, second = core(dsv3, 8192, 0), core(dsv3, 8192, 8192)
    assert second / first == pytest.approx(3, rel=0.02)
    # and the two chunks together cost what the whole prompt costs (minus one op overhead)
    assert first + second == pytest.approx(core(dsv3, 16384) + dsv3.rates["attn_core"].overhead_s, rel=1e-3)


def test_roofline_switches_from_memory_to_compute_bound(dsv3):
    rate = dsv3.rates["attn_proj"]
    weights = dsv3.proj_params * dsv3.hw.weight_bytes
    small = dsv3.attention_ops(True, 1, 1, 1)["attn_proj"]
    assert small == pytest.approx(rate.overhead_s + weights / rate.bytes_per_s, rel=0.01)   # weight-load bound
    big = dsv3.attention_ops(True, 16384, 1, 1)["attn_proj"]
    assert big == pytest.approx(rate.overhead_s + 2 * 16384 * dsv3.proj_params / rate.flops_per_s, rel=0.01)
    # experts: a few tokens cost about the same (loading weights), many tokens scale linearly
    shares = uniform_shares(dsv3.model, 32)
    e = [dsv3.expert_seconds(0, t, shares) for t in (8, 16, 262144, 524288)]
    assert e[1] / e[0] < 1.3
    assert e[3] / e[2] == pytest.approx(2, rel=0.05)


def test_breakdown_names_every_op_and_gqa_models_work(dsv3):
    ops = dsv3.attention_ops(True, 1024, 1024 * 1025 // 2, 1024)
    assert set(ops) == {"elementwise", "attn_proj", "attn_core", "gate", "shared_expert"}
    assert set(dsv3.attention_ops(False, 1024, 1, 1024)) == {"elementwise", "attn_proj", "attn_core", "dense_ffn"}
    qwen = CostModel(get_model("qwen3-235b-a22b"), get_hardware("cloudmatrix384"))
    q = qwen.attention_ops(True, 4096, 4096 * 4097 // 2, 4096)
    assert "shared_expert" not in q and q["attn_core"] > 0
    br = dsv3.step_breakdown([(4096, 0)] * 4, 16384 * 32, uniform_shares(dsv3.model, 32), 32, True, 32)
    assert {"dispatch", "combine", "experts", "attn_core"} <= set(br)


def test_dispatch_to_more_nodes_costs_more_per_copy(dsv3):
    d = dsv3.hw.dispatch_bytes
    inside = dsv3.seconds_per_copy(8, True, 8, d)          # NVLink only
    across = dsv3.seconds_per_copy(32, True, 32, d)        # 4 nodes over RDMA
    assert across > inside > 0
    assert dsv3.seconds_per_copy(32, True, 32, 2.0) == pytest.approx(2 * across)


def test_profile_json_round_trip_and_errors(tmp_path):
    hw = get_hardware("cloudmatrix384")
    hw.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    assert back.ops == hw.ops and back.link == hw.link and back.memory_bytes == hw.memory_bytes
    d = json.loads((tmp_path / "p.json").read_text())
    del d["ops"]["experts"]
    with pytest.raises(ValueError, match="experts"):
        from_json(d)
    with pytest.raises(ValueError, match="schema"):
        from_json({**d, "schema": "nope"})
    with pytest.raises(ValueError, match="unknown hardware"):
        get_hardware("tpu")


def test_default_cpu_profile_is_marked_uncalibrated():
    cpu = get_hardware("cpu")
    assert cpu.calibrated is False and "UNCALIBRATED" in cpu.source
    assert set(OP_NAMES) <= set(cpu.ops)


def test_fit_op_rate_recovers_a_roofline():
    true = OpRate(flops_per_s=2e12, bytes_per_s=5e10, overhead_s=3e-5)
    samples = [(f, b, true.seconds(f, b)) for f, b in
               [(1e9, 1e3), (1e10, 1e3), (4e10, 1e3), (1e3, 1e8), (1e3, 1e9), (1e3, 4e9)]]
    fit = fit_op_rate(samples)
    assert fit.flops_per_s == pytest.approx(2e12, rel=0.05)
    assert fit.bytes_per_s == pytest.approx(5e10, rel=0.05)
    assert fit.overhead_s == pytest.approx(3e-5, rel=0.2)
