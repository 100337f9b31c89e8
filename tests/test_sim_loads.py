"""Per-step expert loads (asap.cost.loads): seeded draws reproduce bit for bit, a batch's busiest worker
is at least the expected one, the skew is the published statistic's, and the calibration holds its points."""
import numpy as np
import pytest

from asap.cost.loads import LoadModel
from asap.scheduler.request import Request
from asap.studies.calibrate import ERROR_BAND, SKEW, TRTLLM_EPLB, calibrate, trtllm_check
from asap.sim.experts import load_model, plan_experts, zipf_loads
from asap.sim.run import get_model, run

DSV3 = get_model("deepseek-v3")


def shares(workers=32, redundant=32, skew=0.0, seed=0, zipf=0.0, model=DSV3):
    n_moe = sum(model.moe_layers)
    return plan_experts(zipf_loads(n_moe, model.num_experts, zipf, 1), workers, redundant,
                        LoadModel("drawn", skew, seed), model)


def test_draws_are_seeded_and_reproduce_bit_for_bit():
    a, b, c = shares(seed=3).draws, shares(seed=3).draws, shares(seed=4).draws
    ra = [a.rows(layer % 58, 5000.0 + layer) for layer in range(300)]
    rb = [b.rows(layer % 58, 5000.0 + layer) for layer in range(300)]
    rc = [c.rows(layer % 58, 5000.0 + layer) for layer in range(300)]
    assert all(np.array_equal(x, y) for x, y in zip(ra, rb))
    assert not all(np.array_equal(x, y) for x, y in zip(ra, rc))
    reqs = [Request(i, 3000 + 97 * i, 0.001 * i) for i in range(48)]
    for engine in ("sync", "async"):
        kw = dict(token_budget=8192, expert_load="drawn", expert_skew=0.3, seed=7)
        one = [r.ttft for r in run(reqs, engine, "deepseek-v3", "h800", 16, **kw).results]
        two = [r.ttft for r in run(reqs, engine, "deepseek-v3", "h800", 16, **kw).results]
        other = [r.ttft for r in run(reqs, engine, "deepseek-v3", "h800", 16, **{**kw, "seed": 8}).results]
        assert one == two and one != other


@pytest.mark.parametrize("skew", [0.0, SKEW, 0.5])
def test_a_batchs_busiest_worker_is_at_least_the_expected_one(skew):
    s = shares(workers=63, redundant=None, skew=skew, zipf=1.0)
    for moe_idx in (0, 30):
        for tokens in (200, 20000, 262144):
            rows = np.array([s.draws.rows(moe_idx, tokens) for _ in range(200)])
            expected = s.max_share[moe_idx] * tokens * DSV3.top_k
            assert rows.max(axis=1).mean() >= expected * 0.999
            assert rows.sum(axis=1).mean() == pytest.approx(tokens * DSV3.top_k, rel=0.02)   # no rows lost
    # more skew, more imbalance
    lo, hi = shares(skew=0.0).draws, shares(skew=0.5).draws
    assert np.mean([hi.max_rows(5, 50000) for _ in range(300)]) > 1.05 * np.mean([lo.max_rows(5, 50000)
                                                                                  for _ in range(300)])


def test_expected_mode_has_no_draws_and_keeps_the_old_cost():
    s = plan_experts(zipf_loads(58, 256, 0.0), 32, 32, load_model("expected"), DSV3)
    assert s.draws is None
    from asap.cost.model import CostModel
    from asap.sim.hardware import get_hardware
    cost = CostModel(DSV3, get_hardware("h800"))
    assert cost.batch_expert_seconds(3, 30000, s, 1e-9) == cost.expert_seconds(3, 30000, s, 1e-9)
    with pytest.raises(ValueError, match="mode"):
        LoadModel("sometimes")
    with pytest.raises(ValueError, match="skew"):
        LoadModel("drawn", -1.0)


def test_qwen3_plain_top_k_draws():
    qwen = get_model("qwen3-235b-a22b")
    s = shares(workers=16, redundant=0, skew=SKEW, model=qwen)
    rows = np.array([s.draws.rows(10, 8192) for _ in range(100)])
    assert rows.sum(axis=1).mean() == pytest.approx(8192 * qwen.top_k, rel=0.02)


def test_skew_reproduces_the_published_eplb_statistic_it_is_derived_from():
    out = trtllm_check(SKEW, samples=20)
    assert out["imbalance"] == pytest.approx(TRTLLM_EPLB["imbalance"], rel=0.1)
    assert out["std_rows"] == pytest.approx(TRTLLM_EPLB["std_rows"], rel=0.1)


def test_calibration_points_and_the_prompt_series_shape():
    out = calibrate(verbose=False)
    points = {p["name"]: p for p in out["points"]}
    assert abs(points["DeepSeek profile (H800, balanced)"]["error"]) <= ERROR_BAND
    # balanced routing is an upper bound: SGLang's default is simulated slower than its perfect EPLB
    assert points["SGLang default (H100)"]["simulated_tokens_per_device_s"] \
        < points["SGLang perfect EPLB (H100)"]["simulated_tokens_per_device_s"]
    for s in out["prompt_series"]:        # 1K / 2K / 4K, relative to 4K, within 5% of SGLang's
        assert s["simulated_ratio_to_4k"] == pytest.approx(s["published_ratio_to_4k"], rel=0.05)
    lo, hi = out["tbo_gain_band"]
    assert lo <= out["tbo_gain"] <= hi


def test_the_tabulated_busiest_worker_agrees_with_the_full_draws():
    d = shares(workers=63, redundant=None, skew=SKEW).draws
    # the table holds 64 of the 64 x 64 (drift, noise) pairs per layer: a sample, so small batches (where the
    # noise decides) agree within 5%, the batches an expert pool sees (thousands of tokens) within 2%
    for tokens, rel in ((30, 0.05), (300, 0.05), (2000, 0.02), (20000, 0.02), (262144, 0.02)):
        fast = np.mean([d.max_rows(7, tokens) for _ in range(2000)])
        full = np.mean([d.rows(7, tokens).max() for _ in range(2000)])
        assert fast == pytest.approx(full, rel=rel)
