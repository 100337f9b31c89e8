"""Promise of `asap demo --quick`: three labelled parts (REAL, EMULATED, SIMULATED) and a summary, the
exactness verdict from comparing the engines with the reference, and a JSON of everything that parses."""
import json

import pytest

from asap.cli import main
from asap.demo.real import compare
from asap.demo.report import compare as verdict
from asap.demo.tuning import TUNED, key
from asap.demo.settings import FULL, QUICK


def test_the_shipped_tuning_covers_the_demo_so_it_never_tunes_live():
    table = json.loads(TUNED.read_text())
    for s, devices, emulatable in ((FULL, FULL.devices, True), (QUICK, QUICK.devices, True),
                                   (FULL, FULL.sim_devices, False)):
        entry = table[key(s, devices, emulatable)]
        assert entry["sync"]["config"]["engine"] == "sync" and entry["async"]["config"]["engine"] == "async"
        if emulatable:      # the runtime emulates attention TP but runs one instance
            assert all(entry[e]["config"]["instances"] == 1 for e in ("sync", "async"))


def test_verdicts_follow_the_numbers():
    a = {"slo_attainment": 0.95, "ttft_p90_ms": 500.0}
    s = {"slo_attainment": 0.40, "ttft_p90_ms": 2000.0}
    assert "async ahead" in verdict("x", s, a) and "4.0x" in verdict("x", s, a)
    assert "sync ahead" in verdict("x", a, s)
    assert "a tie" in verdict("x", a, dict(a, slo_attainment=0.93))


def test_exactness_comparison_sees_a_difference():
    import torch

    class Out:
        def __init__(self, tok, logit, kv):
            self.first_token, self.logits, self.kv = tok, torch.tensor([logit, 0.0]), [{"k": torch.tensor([kv])}]
    same = compare([Out(1, 0.5, 0.1)], [Out(1, 0.5, 0.1)])
    assert same == {"first_tokens_equal": True, "max_logits_diff": 0.0, "max_kv_diff": 0.0}
    off = compare([Out(2, 0.6, 0.3)], [Out(1, 0.5, 0.1)])
    assert not off["first_tokens_equal"] and off["max_logits_diff"] == pytest.approx(0.1)
    assert off["max_kv_diff"] == pytest.approx(0.2)


@pytest.mark.timeout(240)
def test_quick_demo_tells_the_three_part_story_and_writes_json(tmp_path, capsys):
    out = tmp_path / "demo-out"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    heads = ["1. REAL: exactness on this CPU", f"2. EMULATED: DeepSeek-V3 on {QUICK.devices}",
             f"3. SIMULATED: the same workload on {QUICK.sim_devices} dies", "SUMMARY"]
    positions = [stdout.index(h) for h in heads]
    assert positions == sorted(positions)
    assert "verdict: EXACT" in stdout and "NOT EXACT" not in stdout
    assert "sync (EMULATED)" in stdout and "async (EMULATED)" in stdout
    summary = stdout[positions[-1]:]
    for label in ("REAL (measured on this CPU", "EMULATED (measured", "SIMULATED (discrete-event simulator"):
        assert label in summary, label
    doc = json.loads((out / "demo.json").read_text())
    assert doc["real"]["exact"] is True and set(doc["real"]["engines"]) == {"async", "sync"}
    for engine in ("sync", "async"):
        e = doc["emulated"]["engines"][engine]["summary"]
        assert e["num_requests"] == QUICK.num_requests and e["num_failed"] == 0
        assert 0 <= e["slo_attainment"] <= 1
        assert all(run["engines"][engine]["num_requests"] == QUICK.sim_requests for run in doc["simulated"]["runs"])
    assert doc["emulated"]["engines"]["sync"]["runtime"]["compute"] == "emulated"
    assert doc["emulated"]["engines"]["async"]["runtime"]["attention_workers"] + \
        doc["emulated"]["engines"]["async"]["runtime"]["expert_workers"] == QUICK.devices
    assert (out / "demo.png").stat().st_size > 0


def test_a_stale_stored_tuning_gives_no_ratio_only_the_live_runs():
    from asap.demo.report import _throughput
    tuned = {"sync": {"max_slo_rate": 96.1}, "async": {"max_slo_rate": 171.0}}
    fresh = _throughput(tuned, "tuned offline (asap/demo/tuned.json)")
    assert "async 1.78x" in fresh
    runs = [{"rate": 96.1, "engines": {"sync": {"slo_attainment": 1.0}, "async": {"slo_attainment": 1.0}}},
            {"rate": 171.0, "engines": {"sync": {"slo_attainment": 1.0}, "async": {"slo_attainment": 0.92}}}]
    stale = _throughput(tuned, "tuned offline on older code: STALE (...)", runs)
    assert "x" not in stale.split("are not a result")[0].split("req/s")[-1]    # no ratio claimed
    assert "1.78" not in stale and "STALE" in stale
    assert "at 171 req/s sync 100% and async 92% within SLO" in stale


def test_a_retune_with_no_best_leaves_the_stored_entry_and_exits_2(monkeypatch, tmp_path, capsys):
    import asap.demo.tuning as tuning
    table = tmp_path / "tuned.json"
    table.write_text('{"kept": 1}\n')
    monkeypatch.setattr(tuning, "TUNED", table)

    def no_best(*a, **k):
        raise RuntimeError("the tuner found no valid sync configuration on 18 devices: more requests are needed")
    monkeypatch.setattr(tuning, "tune_now", no_best)
    assert tuning.main(["--devices", "18"]) == 2
    assert table.read_text() == '{"kept": 1}\n'
    err = capsys.readouterr().err
    assert "more requests are needed" in err and "left as it was" in err and "Traceback" not in err


def test_a_lower_bound_gives_a_one_sided_ratio_and_only_where_it_leads():
    from asap.demo.report import _throughput
    from asap.demo.tuning import rate_text
    bound = {"max_slo_rate": None, "lower_bound": 188.7, "num_requests": 3600}
    line = _throughput({"sync": bound, "async": {"max_slo_rate": 171.0}})
    assert "sync >= 188.7" in line and "async <= 0.91x" in line and "sync ahead" in line
    line = _throughput({"sync": {"max_slo_rate": 200.0}, "async": bound})
    assert "cannot rank" in line and "x" not in line.split("cannot rank")[1]
    line = _throughput({"sync": {"max_slo_rate": 94.35}, "async": bound})
    assert "async >= 188.7" in line and "async >= 2.00x" in line
    assert rate_text(bound).startswith(">= 188.7 req/s (a lower bound") and "3600 requests" in rate_text(bound)
    assert rate_text({"max_slo_rate": 35.69}, 2) == "35.69 req/s"


def test_a_retune_whose_best_outruns_the_sample_stores_the_candidate_as_a_lower_bound(monkeypatch):
    import asap.demo.tuning as tuning
    import asap.sim.tune as tune_mod
    from asap.demo.settings import FULL
    from asap.sim.tune import EngineConfig, Tuned

    def fake(requests, engine, devices, *a, candidates=None, **k):
        if engine == "sync":
            return Tuned(engine, devices, None, None, None, None, num_sims=3, num_requests=len(requests),
                         lower_bound=9.5, lower_bound_config=candidates[-1], reason="more requests are needed")
        return Tuned(engine, devices, candidates[0], 4.0, 1.0, 10.0, num_sims=2, num_requests=len(requests))
    monkeypatch.setattr(tune_mod, "tune", fake)
    entry = tuning.tune_now(FULL, FULL.devices, emulatable_only=True)
    sync, asyn = entry["sync"], entry["async"]
    assert sync["max_slo_rate"] is None and sync["lower_bound"] == 9.5 and "more requests" in sync["reason"]
    assert EngineConfig(**sync["config"]).engine == "sync" and sync["describe"].startswith("sync ")
    assert asyn["max_slo_rate"] == 4.0 and "lower_bound" not in asyn
    assert tuning.rate_of(sync) == 9.5 and tuning.rate_of(asyn) == 4.0
