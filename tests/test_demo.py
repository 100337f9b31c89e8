"""Promise of `asap demo --quick`: three labelled parts (REAL, EMULATED, SIMULATED) and a summary, the
exactness verdict from comparing the engines with the reference, a verdict and explanation computed from the
run's own numbers (whatever the stored tuning says), no raw warnings, emulated figures flagged when the
machine is too loaded, and a JSON of everything that parses."""
import json
import re

import pytest

from asap.cli import main
from asap.demo.real import compare
from asap.demo.report import compare as verdict
from asap.demo.tuning import TUNED, headline_key, key, worker_processes
from asap.demo.settings import FULL, QUICK
from asap.studies.config import EngineConfig


def test_the_shipped_tuning_covers_the_demo_so_it_never_tunes_live():
    table = json.loads(TUNED.read_text())
    for k in (key(FULL, FULL.devices, True), key(QUICK, QUICK.devices, True), headline_key(FULL), headline_key(QUICK)):
        entry = table[k]
        assert entry["sync"]["config"]["engine"] == "sync" and entry["async"]["config"]["engine"] == "async"
        if "/emulatable" in k:       # the runtime emulates attention TP but runs one instance, and two cores
            devices = FULL.devices if k == key(FULL, FULL.devices, True) else QUICK.devices     # keep up with one
            for e in ("sync", "async"):                                                        # process per die
                c = EngineConfig(**entry[e]["config"])
                assert c.instances == 1 and worker_processes(c, devices) <= devices


def test_the_headline_entry_comes_only_from_a_headline_of_the_demo_case_on_this_code(tmp_path, monkeypatch, capsys):
    import asap.demo.tuning as tuning
    from asap.studies.code_version import fingerprint
    table = tmp_path / "tuned.json"
    monkeypatch.setattr(tuning, "TUNED", table)

    def engine(e, rate):
        return {"config": {"engine": e}, "describe": e, "max_slo_rate": rate, "num_requests": 375, "num_sims": 9,
                "num_screened": 4, "every_bucket": {"max_slo_rate": rate / 2}}
    doc = {"model": FULL.model, "hardware": FULL.hardware, "slo": FULL.sim_slo, "num_requests": 1500,
           "code_fingerprint": fingerprint(), "sustained": tuning.headline_rule(FULL),
           "fleet_fractions": list(FULL.sim_fleet_fractions), "orders": list(FULL.sim_orders),
           "lanes": [list(x) for x in FULL.sim_lanes], "rows": [{"workload": FULL.sim_workload, "devices": FULL.sim_devices,
                     "sync": engine("sync", 1.5), "async": engine("async", 2.0)}]}
    for change, why in (({"code_fingerprint": "0" * 12}, "other simulation code"), ({"slo": "5s"}, "demo's case"),
                        ({"rows": []}, "no conversation row"), ({"sustained": False}, "another search rule"),
                        ({"fleet_fractions": [0.5]}, "wide shares"), ({"num_requests": 3000}, "sampled 3000"),
                        ({"orders": ["fcfs"]}, "queue orders"),
                        ({"lanes": []}, "short-prompt lanes"),
                        ({"num_requests": None}, "sampled None")):       # sized per row, and the row does not say
        (tmp_path / "h.json").write_text(json.dumps({**doc, **change}))
        assert tuning.main(["--from-headline", str(tmp_path / "h.json")]) == 2
        assert why in capsys.readouterr().err and not table.exists()
    sized = {**doc, "num_requests": None, "rows": [{**doc["rows"][0], "requests_available": 1500}]}
    (tmp_path / "h.json").write_text(json.dumps(sized))     # a headline that sized its row's sample: 1,500 here
    assert tuning.main(["--from-headline", str(tmp_path / "h.json")]) == 0
    assert "/vet" in headline_key(FULL) and "re-ranked" in tuning.headline_rule(FULL)
    table.unlink()
    (tmp_path / "h.json").write_text(json.dumps(doc))
    assert tuning.main(["--from-headline", str(tmp_path / "h.json")]) == 0
    entry = json.loads(table.read_text())[headline_key(FULL)]
    assert entry["sync"]["max_slo_rate"] == 1.5 and entry["async"]["every_bucket_rate"] == 1.0
    assert entry["fingerprint"] == fingerprint() and entry["rule"] == tuning.headline_rule(FULL)
    assert "STALE" not in tuning.headline_configs(FULL)["source"]
    older = json.loads(table.read_text())       # made under a rule the headline no longer records: STALE
    older[headline_key(FULL)]["rule"] = "drain ...; each maximum confirmed on 2x its requests"
    table.write_text(json.dumps(older))
    assert "older search rule: STALE" in tuning.headline_configs(FULL)["source"]


def test_the_code_fingerprint_ignores_docstrings_and_comments_but_not_code():
    from asap.studies.code_version import code_text as _code
    a = '"""module doc"""\nclass C:\n    """doc"""\n    def f(self):\n        """doc"""\n        return 1  # note\n'
    b = 'class C:\n    def f(self):\n        return 1\n'
    assert _code(a) == _code(b)
    assert _code(b) != _code(b.replace("return 1", "return 2"))
    assert _code('def g():\n    """only a docstring"""\n') != _code('def g():\n    return None\n')


def test_a_stored_result_is_current_through_recorded_equivalences_only(tmp_path, monkeypatch):
    from asap.studies import code_version
    now = code_version.fingerprint()
    ledger = tmp_path / "equivalent.json"
    monkeypatch.setattr(code_version, "EQUIVALENT", ledger)
    assert code_version.is_current(now) and not code_version.is_current("a" * 12)
    assert not code_version.is_current(None)
    ledger.write_text(json.dumps([{"from": "a" * 12, "to": "b" * 12}, {"from": "b" * 12, "to": now},
                                  {"from": "c" * 12, "to": "d" * 12}, {"from": now, "to": "e" * 12}]))
    assert code_version.is_current("a" * 12) and code_version.is_current("b" * 12)     # a -> b -> this code
    assert not code_version.is_current("c" * 12)        # equivalent to other code, not to this
    assert code_version.is_current("e" * 12)            # the same bit for bit: either way


def test_verdicts_follow_the_numbers():
    a = {"slo_attainment": 0.95, "ttft_p90_ms": 500.0}
    s = {"slo_attainment": 0.40, "ttft_p90_ms": 2000.0}
    assert "async ahead" in verdict("x", s, a) and "4.0x" in verdict("x", s, a)
    assert re.search(r"\bsync ahead", verdict("x", a, s)) and "async ahead" not in verdict("x", a, s)
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


@pytest.mark.timeout(480)     # 2-4 min on two cores shared with other jobs
def test_quick_demo_tells_the_three_part_story_and_writes_json(tmp_path, capsys):
    out = tmp_path / "demo-out"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    stdout = captured.out
    heads = ["1. REAL: exactness on this CPU", f"2. EMULATED: DeepSeek-V3 on {QUICK.devices}",
             f"3. SIMULATED: the emulated run replayed, and the headline case on {QUICK.sim_devices} dies", "SUMMARY"]
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
    rt = doc["emulated"]["engines"]["async"]["runtime"]
    attention_dies = rt["attention_workers"] * rt["attention_tp"]     # every die is used, once per role
    if rt["colocated"]:     # each die an attention share and an expert shard
        assert attention_dies == rt["expert_workers"] == QUICK.devices
    else:
        assert attention_dies + rt["expert_workers"] == QUICK.devices
    assert (out / "demo.png").stat().st_size > 0
    # no raw warnings (a "file.py:123: SomeWarning" line) anywhere in what the user sees
    assert not re.search(r"\.py:\d+: \w*Warning", stdout + captured.err)
    # the verdict is the run's own: an explanation of async's lead only where the run showed one
    verdict = next(x for x in doc["summary"] if x.startswith("VERDICT"))
    assert ("Why async can lead" in stdout) == ("async ahead in" in verdict)
    assert ("Where sync leads" in stdout) == bool(re.search(r"\bsync ahead in", verdict))   # not "async ahead in"
    assert doc["emulated"]["dilation"] >= QUICK.dilation and "machine: load average" in stdout
    assert ("FLAGGED" in stdout) == (doc["emulated"]["flag"] is not None)


def test_the_ratio_printed_is_computed_from_the_stored_tuning_and_a_stale_one_gives_none():
    import re

    from asap.demo.report import _throughput
    rs, ra = 13.0, 29.0                     # any stored rates: the line must follow them
    tuned = {"sync": {"max_slo_rate": rs}, "async": {"max_slo_rate": ra}}
    fresh = _throughput(tuned, "tuned offline (asap/demo/tuned.json)")
    assert f"async {ra / rs:.2f}x" in fresh and "sync ahead" not in fresh
    assert re.search(r"\bsync ahead", _throughput({"sync": {"max_slo_rate": ra}, "async": {"max_slo_rate": rs}}))
    runs = [{"rate": r, "engines": {"sync": {"slo_attainment": 1.0}, "async": {"slo_attainment": att}}}
            for r, att in ((rs, 1.0), (ra, 0.5))]
    stale = _throughput(tuned, "tuned offline on older code: STALE (...)", runs)
    assert "STALE" in stale and not re.search(r"\d\.\d+x", stale)        # no ratio claimed
    assert f"at {ra:g} req/s sync 100% and async 50% within SLO" in stale    # only the live runs


def test_a_retune_with_no_best_leaves_the_stored_entry_and_exits_2(monkeypatch, tmp_path, capsys):
    import asap.demo.tuning as tuning
    table = tmp_path / "tuned.json"
    table.write_text('{"kept": 1}\n')
    monkeypatch.setattr(tuning, "TUNED", table)

    def no_best(*a, **k):
        raise RuntimeError("the tuner found no valid sync configuration on 20 devices: more requests are needed")
    monkeypatch.setattr(tuning, "tune_now", no_best)
    assert tuning.main(["--devices", str(QUICK.devices)]) == 2
    assert table.read_text() == '{"kept": 1}\n'
    err = capsys.readouterr().err
    assert "more requests are needed" in err and "left as it was" in err and "Traceback" not in err


def test_a_lower_bound_gives_a_one_sided_ratio_and_only_where_it_leads():
    from asap.demo.report import _throughput
    from asap.demo.tuning import rate_text
    lb, n = 50.0, 3600
    bound = {"max_slo_rate": None, "lower_bound": lb, "num_requests": n}
    line = _throughput({"sync": bound, "async": {"max_slo_rate": 40.0}})
    assert f"sync >= {lb:.1f}" in line and f"async <= {40 / lb:.2f}x" in line and re.search(r"\bsync ahead", line)
    line = _throughput({"sync": {"max_slo_rate": 60.0}, "async": bound})
    assert "cannot rank" in line and "x" not in line.split("cannot rank")[1]
    line = _throughput({"sync": {"max_slo_rate": 20.0}, "async": bound})
    assert f"async >= {lb:.1f}" in line and f"async >= {lb / 20:.2f}x" in line
    assert rate_text(bound).startswith(f">= {lb:.1f} req/s (a lower bound") and f"{n} requests" in rate_text(bound)
    assert rate_text({"max_slo_rate": 35.69}, 2) == "35.69 req/s"


def _run(async_att=1.0, sync_att=1.0, flagged=None, tuned=(10.0, 10.0), source="tuned offline", live=()):
    """The parts of a demo run the verdict reads: emulated attainments, stored rates, live simulated runs."""
    def cfg(engine):
        return {"engine": engine, "instances": 1, "attention_tp": 1, "attention_workers": 9 if engine == "async"
                else None}
    rates = dict(zip(("sync", "async"), tuned))
    t = {e: {"max_slo_rate": rates[e], "config": cfg(e)} for e in ("sync", "async")}
    emulated = {"devices": 24, "model": "deepseek-v3", "hardware": "cloudmatrix384", "flag": flagged,
                "tuned": t, "tuned_source": source,
                "engines": {"async": {"summary": {"slo_attainment": async_att}},
                            "sync": {"summary": {"slo_attainment": sync_att}}}}
    simulated = {"devices": 32, "tuned": t, "tuned_source": source,
                 "runs": [{"rate": r, "engines": {"async": {"slo_attainment": a}, "sync": {"slo_attainment": b}}}
                          for r, a, b in live]}
    return emulated, simulated


def test_the_summary_explains_only_what_the_run_showed():
    from asap.demo.report import verdict_lines
    tie = "\n".join(verdict_lines(*_run()))
    assert "Nothing in this run separates the engines" in tie and "Why async" not in tie and "sync leads" not in tie
    win = "\n".join(verdict_lines(*_run(live=[(30.0, 0.97, 0.40)])))
    assert "async ahead in: both engines live at 30 req/s" in win and "Why async can lead" in win
    assert "sync leads" not in win
    lose = "\n".join(verdict_lines(*_run(tuned=(20.0, 10.0))))              # sync's stored rate is higher
    assert re.search(r"\bsync ahead in", lose) and "Where sync leads" in lose and "Why async" not in lose
    assert "at least" in lose and "expert pool" in lose                     # the computed why, from the configs
    stale = "\n".join(verdict_lines(*_run(tuned=(20.0, 10.0), source="STALE")))
    assert not re.search(r"\b(a?sync) ahead", stale)                                       # a stale tuning ranks nothing


def test_the_summary_names_the_prompts_that_pay_from_the_live_buckets():
    from asap.demo.report import summary_lines, verdict_lines
    def engine(att, short):
        return {"slo_attainment": att, "buckets": {"<4K": {"slo_attainment": short}, "4-16K": {"slo_attainment": 1.0},
                                                    ">64K": {"slo_attainment": None}}}
    emulated, simulated = _run(live=[(1.5, 0.98, 0.88)], flagged="loaded")
    simulated["runs"][0]["engines"] = {"async": engine(0.98, 0.93), "sync": engine(0.88, 0.66)}
    why = "\n".join(verdict_lines(emulated, simulated))
    assert "at 1.5 req/s on 32 dies the prompts that pay on sync are the <4K-token ones: 66% within SLO on sync, " \
        "93% on async" in why and "Async's" not in why
    simulated["runs"][0]["engines"]["async"]["buckets"]["4-16K"]["slo_attainment"] = 0.8     # async pays there
    assert "Async's 4-16K-token prompts pay instead: 80% within SLO, against sync's 100%" in \
        "\n".join(verdict_lines(emulated, simulated))
    simulated["runs"][0]["engines"]["async"]["buckets"]["4-16K"]["slo_attainment"] = 1.0
    simulated["runs"][0]["engines"]["sync"] = engine(0.91, 0.66)        # sync holds 90% overall: no lead, no why
    assert "prompts that pay" not in "\n".join(verdict_lines(emulated, simulated))
    for e, rate in (("sync", 0.5), ("async", 2.0)):
        simulated["tuned"][e]["every_bucket_rate"] = rate
    emulated["engines"] = {k: dict(v, stall_fraction=0.1) for k, v in emulated["engines"].items()}
    simulated["emulated_check"] = {"engines": {k: {"slo_attainment": 1.0} for k in ("sync", "async")}}
    line = next(x for x in summary_lines({"model": "m", "exact": True}, emulated, simulated) if x.startswith("SIMULATED"))
    assert "every prompt-length bucket, async 2.00 vs sync 0.50 req/s (4.00x)" in line
    simulated["tuned_source"] = "STALE"
    line = next(x for x in summary_lines({"model": "m", "exact": True}, emulated, simulated) if x.startswith("SIMULATED"))
    assert "every prompt-length bucket" not in line


def test_flagged_emulated_figures_give_no_verdict():
    from asap.demo.report import summary_lines, verdict_lines
    emulated, simulated = _run(async_att=0.2, sync_att=0.9, flagged="the demo got about 1/12 of a core")
    assert "EMULATED runs" not in "\n".join(verdict_lines(emulated, simulated))
    emulated.update(engines={k: dict(v, stall_fraction=0.1) for k, v in emulated["engines"].items()})
    simulated["emulated_check"] = {"engines": {k: {"slo_attainment": 1.0} for k in ("sync", "async")}}
    line = next(x for x in summary_lines({"model": "m", "exact": True}, emulated, simulated)
                if x.startswith("EMULATED"))
    assert "not judged: the figures are FLAGGED" in line and "sync ahead: 90%" not in line


def test_load_raises_dilation_up_to_a_cap_and_flags_what_it_cannot_cover():
    from asap.demo.load import MAX_RAISE, Load, flag, raised_dilation
    assert raised_dilation(8.0, Load(0.5, 2)) == 8.0                        # idle: the settings' dilation
    assert raised_dilation(8.0, Load(3.0, 2)) == 12.0                        # 1.5 runnables a core: 1.5x
    assert raised_dilation(8.0, Load(5.0, 2)) == 8.0 * MAX_RAISE            # capped
    assert raised_dilation(8.0, Load(40.0, 2)) == 8.0       # the cap cannot cover it: flagged, not lengthened
    assert flag(8.0, 8.0, 1.1, None, 1000.0) is None
    assert "contention" in flag(16.0, 8.0, 12.0, None, 1000.0)
    assert flag(8.0, 8.0, 1.0, 20.0, 1000.0) is None                        # a lag small against the TTFTs
    assert "behind its schedule" in flag(8.0, 8.0, 1.0, 300.0, 1000.0)


def test_a_retune_whose_best_outruns_the_sample_stores_the_candidate_as_a_lower_bound(monkeypatch):
    import asap.demo.tuning as tuning
    import asap.studies.tune as tune_mod
    from asap.demo.settings import FULL
    from asap.studies.config import EngineConfig
    from asap.studies.tune import Tuned

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
