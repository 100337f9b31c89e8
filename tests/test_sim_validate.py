"""`asap sim validate`: one workload through the emulated runtime, the simulator and the real
runtime, with the errors between them computed as stated (the accuracy targets are a benchmark,
not a test)."""
import json

import pytest

from asap.config import ModelConfig
from asap.model.presets import preset_config
from asap.sim.hardware import PROFILE_DIR, get_hardware
from asap.bench.validate import LABELS, PAIRS, STATS, errors, report, validate, workload

SHIPPED = str(PROFILE_DIR / "cpu.json")


def _summary(mean, p50, p90):
    return {"ttft_mean_ms": mean, "ttft_p50_ms": p50, "ttft_p90_ms": p90}


def test_errors_are_relative_to_the_second_of_each_pair():
    e = errors({"EMULATED": _summary(100, 80, 200), "SIMULATED": _summary(105, 60, 240),
                "REAL": _summary(50, 40, 100)})
    assert set(e) == {f"{a} vs {b}" for a, b in PAIRS}
    sim_emu = e["SIMULATED vs EMULATED"]
    assert sim_emu["ttft_mean_ms"] == pytest.approx(0.05) and sim_emu["ttft_p50_ms"] == pytest.approx(-0.25)
    assert sim_emu["ttft_p90_ms"] == pytest.approx(0.20) and not sim_emu["met"]     # P90 off by more than 15%
    assert e["EMULATED vs REAL"]["ttft_mean_ms"] == pytest.approx(1.0)
    assert errors({"EMULATED": _summary(100, 80, 200), "SIMULATED": _summary(109, 99, 229)})[
        "SIMULATED vs EMULATED"]["met"]                                    # 9% on the mean, 14.5% on P90


def test_default_rate_scales_with_utilization_on_the_same_requests():
    cfg = ModelConfig.from_hf(preset_config("small-deepseek-v3"))
    hw = get_hardware(SHIPPED)
    wl1, r1 = workload(cfg, hw, 10, None, 0.25, 64, 1024, 0, 1, 1)
    wl2, r2 = workload(cfg, hw, 10, None, 0.5, 64, 1024, 0, 1, 1)
    assert r2 == pytest.approx(2 * r1)
    a, b = wl1.build(), wl2.build()
    assert [r.num_tokens for r in a] == [r.num_tokens for r in b]
    assert [2 * y.arrival for y in b] == pytest.approx([x.arrival for x in a])


def test_validate_runs_one_workload_three_ways(tiny_dirs):
    out = validate(tiny_dirs["tiny-deepseek-v3"], num_requests=3, rate=4.0, min_tokens=8, max_tokens=48,
                   hardware=SHIPPED, progress=False, log=lambda *a: None)
    s = out["summaries"]
    assert tuple(s) == LABELS
    for label in LABELS:
        assert s[label]["num_requests"] == 3 and s[label]["num_failed"] == 0 and len(out["ttft_s"][label]) == 3
    for a, b in PAIRS:
        for stat in STATS:
            assert out["errors"][f"{a} vs {b}"][stat] == pytest.approx(s[a][stat] / s[b][stat] - 1)
    assert out["setting"]["devices"] == 2 and out["setting"]["hardware"] == SHIPPED
    assert not out["setting"]["hardware_calibrated"]
    assert set(out["machine"]) == {"EMULATED", "REAL"} and all(m["our_cores"] >= 0 for m in out["machine"].values())
    json.dumps(out)                                     # --json writes exactly this
    text = report(out)
    assert all(label in text for label in LABELS) and "SIMULATED vs REAL" in text
