"""`asap plan`: the A:E recommendation is the candidate with the highest SLO-compliant throughput,
every feasible split is listed, and the figures are labelled SIMULATED."""
import json
from types import SimpleNamespace

import pytest

from asap.measure.metrics import RequestResult
from asap.cli import main
from asap.scheduler.request import Request
from asap.studies.plan import apply_slo, plan

# DeepSeek-V3 on 16 CloudMatrix dies: experts need >= 12 dies, so A is 1..4.
CAPACITY = {1: 1.0, 2: 4.0, 3: 3.0, 4: 2.0}      # req/s each split sustains, in a stand-in simulator


def fake_sim(requests, engine, model, hardware, devices, attention_workers=None, **kw):
    """TTFT grows with load / capacity; a request meets its 1 s budget while rate <= capacity."""
    cap = CAPACITY[attention_workers] if engine == "async" else 0.5
    span = requests[-1].arrival - requests[0].arrival
    ttft = len(requests) / cap if span == 0 else 0.9 * (len(requests) - 1) / span / cap
    return SimpleNamespace(results=[RequestResult.of(r, ttft) for r in requests])


def requests(n=20):
    return [Request(i, 1000, float(i), deadline=float(i) + 1.0) for i in range(n)]


@pytest.mark.parametrize("check", [0, 1])
def test_plan_recommends_the_split_with_the_highest_slo_rate_and_lists_every_split(check):
    p = plan(requests(), 16, "deepseek-v3", "cloudmatrix384", check=check, tol=0.02, sim=fake_sim)
    assert [(c.attention_workers, c.expert_workers) for c in p.candidates] == [(1, 15), (2, 14), (3, 13), (4, 12)]
    assert p.best.attention_workers == 2                    # the screen at the reference rate finds it too
    assert p.best.max_slo_rate == pytest.approx(CAPACITY[2] / 0.9, rel=0.03)
    searched = [c for c in p.candidates if c.max_slo_rate is not None]
    analytic = {c.attention_workers for c in p.candidates if c.analytic}
    assert {c.attention_workers for c in searched} == ({1, 2, 3, 4} if check == 0 else {2} | analytic)
    assert all(p.best.max_slo_rate >= c.max_slo_rate for c in searched)
    assert sum(c.analytic for c in p.candidates) == 1
    assert p.sync["max_slo_rate"] == pytest.approx(0.5 / 0.9, rel=0.03)


def test_plan_needs_deadlines_and_enough_devices_for_the_experts():
    with pytest.raises(ValueError, match="deadlines"):
        plan([Request(0, 100)], 16, sim=fake_sim)
    with pytest.raises(ValueError, match="expert workers"):
        plan(requests(), 8, "deepseek-v3", "cloudmatrix384", sim=fake_sim)


def test_plan_refuses_a_workload_that_meets_its_slo_at_any_rate():
    def always_in_time(requests, *args, **kw):
        return SimpleNamespace(results=[RequestResult.of(r, 0.1) for r in requests])
    with pytest.raises(ValueError, match="unbounded"):
        plan(requests(), 16, "deepseek-v3", "cloudmatrix384", sim=always_in_time)


def test_slo_spec_is_a_multiple_of_the_idle_sync_ttft_or_seconds():
    fixed = apply_slo(requests(3), "10s", "small-deepseek-v3", "h800", 4)
    assert [r.deadline - r.arrival for r in fixed] == [10.0] * 3
    five, ten = (apply_slo(requests(3), spec, "small-deepseek-v3", "h800", 4) for spec in ("5x", "10x"))
    assert ten[0].deadline - ten[0].arrival == pytest.approx(2 * (five[0].deadline - five[0].arrival))
    both = apply_slo(requests(3), "2s+1ms/tok", "small-deepseek-v3", "h800", 4)    # the one syntax: a sum
    assert [r.deadline - r.arrival for r in both] == pytest.approx([2.0 + 1e-3 * r.num_tokens for r in both])
    for bad in ("5", "x", "-1s", "fast", "0x"):
        with pytest.raises(ValueError, match="SLO"):
            apply_slo(requests(3), bad, "small-deepseek-v3", "h800", 4)


def test_plan_cli_prints_a_simulated_table_and_writes_every_candidate(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--devices", "4", "--model", "small-deepseek-v3", "--hardware", "h800",
                 "--workload", "poisson", "--num-requests", "30", "--slo", "1x", "--max-prompt", "4096",
                 "--token-budget", "4096", "--check", "0",
                 "--no-sync", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "recommendation" in text
    data = json.loads(out.read_text())
    assert [c["attention_workers"] for c in data["candidates"]] == [1, 2, 3]
    assert data["best"]["max_slo_rate"] == max(c["max_slo_rate"] for c in data["candidates"])


def test_best_configs_tunes_both_engines_for_the_demo(tmp_path):
    import json as _json

    import numpy as np

    from asap.studies.plan import best_configs
    rng = np.random.default_rng(1)
    trace = tmp_path / "t.jsonl"
    times = np.cumsum(rng.exponential(100.0, 120)).astype(int)
    trace.write_text("".join(_json.dumps({"timestamp": int(t), "input_length": int(n), "output_length": 1}) + "\n"
                             for t, n in zip(times, rng.integers(500, 6000, 120))))
    out = best_configs("small-deepseek-v3", "h800", 4, str(trace), "0.005s+0.001ms/tok", 120)
    for engine in ("sync", "async"):
        cfg, res = out[engine], out["results"][engine]
        assert cfg is not None and cfg.engine == engine and res.max_slo_rate > 0
        spec = cfg.spec("small-deepseek-v3", "h800", 4)
        assert (spec.engine, spec.attention_tp, spec.token_budget, spec.instances) == \
            (engine, cfg.attention_tp, cfg.token_budget, cfg.instances)


def test_plan_cli_refuses_fewer_than_two_devices_with_one_line(capsys):
    for devices in ("1", "0", "-3"):
        assert main(["plan", "--devices", devices]) == 2
        err = capsys.readouterr().err
        assert "--devices must be >= 2" in err and "Traceback" not in err


def test_plan_tune_recommends_the_faster_engine_with_its_serve_command(monkeypatch, capsys):
    """`asap plan --tune` names the engine with the higher SLO-compliant rate and prints the command that serves
    its configuration (here a stand-in for the tuner's results: the search itself is tested above)."""
    import shlex
    from types import SimpleNamespace

    import asap.studies.plan as plan
    from asap.studies.config import EngineConfig

    def tuned(c, rate):
        return SimpleNamespace(best=c, max_slo_rate=rate, reason=None, tokens_per_s_per_device=1.0,
                               ttft_p90_s=1.0, num_sims=1)
    for sync_rate, async_rate, winner in ((10.0, 9.0, "sync"), (10.0, 12.5, "async")):
        results = {"sync": tuned(EngineConfig("sync", 4, 8192, instances=2), sync_rate),
                   "async": tuned(EngineConfig("async", 1, 8192, attention_workers=16, selector="fullest"),
                                  async_rate)}
        monkeypatch.setattr(plan, "best_configs", lambda *a, **k: {**{e: r.best for e, r in results.items()},
                                                                   "results": results})
        assert main(["plan", "--devices", "32", "--tune", "conversation", "--slo", "2s+1ms/tok"]) == 0
        text = capsys.readouterr().out
        lead = max(sync_rate, async_rate) / min(sync_rate, async_rate)
        assert f"recommended for this workload: the {winner} engine ({lead:.2f}x the best" in text
        serve = [line.strip() for line in text.splitlines() if line.strip().startswith("asap serve")]
        assert len(serve) == 1 and shlex.split(serve[0])[3:5] == ["--engine", winner]
        if winner == "sync":        # two instances of 16 devices, DP4 x TP4 each: emulated compute (TP > 1)
            assert "2 independent instances of 16 devices" in text
            assert "--devices 16 --attention-tp 4" in serve[0] and "--compute emulated" in serve[0]
        else:
            assert "--attention-workers 16 --expert-workers 16" in serve[0] and "--selector fullest" in serve[0]
            assert "--compute" not in serve[0]


def test_plan_tune_recommends_nothing_when_one_search_gave_no_rate(monkeypatch, capsys):
    """One engine without a rate: a recommendation only where no layout of it fits, not where its search did not
    converge (e.g. too few requests to rank the candidates)."""
    from types import SimpleNamespace

    import asap.studies.plan as plan
    from asap.studies.config import EngineConfig

    sync = SimpleNamespace(best=EngineConfig("sync", 1, 4096), max_slo_rate=10.0, reason=None,
                           tokens_per_s_per_device=1.0, ttft_p90_s=1.0, num_sims=1)
    for reason, says in (("no feasible configuration", "recommended for this workload: the sync engine (no async "
                                                        "layout fits)"),
                         ("X still passes at 40 (a burst): more requests are needed to rank them",
                          "no recommendation: the async search gave no rate to compare (X still passes")):
        results = {"sync": sync, "async": SimpleNamespace(best=None, max_slo_rate=None, reason=reason, num_sims=3)}
        monkeypatch.setattr(plan, "best_configs", lambda *a, **k: {"sync": sync.best, "async": None,
                                                                   "results": results})
        assert main(["plan", "--devices", "32", "--tune", "conversation", "--slo", "2s+1ms/tok"]) == 0
        text = capsys.readouterr().out
        assert says in text
        assert ("asap serve" in text) == (reason == "no feasible configuration")


def test_best_configs_sustained_uses_the_headline_rule(monkeypatch):
    """--sustained: both engines' searches use the sustained criterion on the first N requests, and confirm on
    CONFIRM x N of the same workload (the headline's rule)."""
    import asap.studies.tune as tune_mod
    from asap.studies.plan import best_configs
    calls = []

    def fake_tune(requests, engine, devices, model, hardware, **kw):
        calls.append((engine, len(requests), kw.get("criterion", "requests"), len(kw.get("longer") or []),
                      kw.get("vet", False)))
        return tune_mod.Tuned(engine, devices, None, None, None, None, reason="stub")
    monkeypatch.setattr(tune_mod, "tune", fake_tune)
    best_configs(devices=32, workload="fixed-4k", num_requests=50, sustained=True)
    assert calls == [(e, 50, "requests-sustained", 50 * tune_mod.CONFIRM, False) for e in ("sync", "async")]
    calls.clear()
    best_configs(devices=32, workload="fixed-4k", num_requests=50, sustained=True, vet=True)
    assert calls == [(e, 50, "requests-sustained", 50 * tune_mod.CONFIRM, True) for e in ("sync", "async")]
    calls.clear()
    best_configs(devices=32, workload="fixed-4k", num_requests=50)
    assert calls == [(e, 50, "requests", 0, False) for e in ("sync", "async")]
    with pytest.raises(ValueError, match="set sustained too"):
        best_configs(devices=32, workload="fixed-4k", num_requests=50, vet=True)


def test_plan_sustained_needs_tune(capsys):
    assert main(["plan", "--devices", "32", "--sustained"]) == 2
    assert "--sustained is a rule of --tune's search" in capsys.readouterr().err
    assert main(["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "5s", "--vet"]) == 2
    assert "--vet re-ranks on the sample --sustained confirms on" in capsys.readouterr().err


def test_plan_tune_sizes_its_sample_as_the_headline_does(monkeypatch):
    """Without --num-requests, --tune samples what asap sim headline samples for a row of that many devices
    (asap.studies.sample_size); a given --num-requests is used as it is, and one below 2 is refused."""
    import asap.studies.tune as tune_mod
    from asap.studies.sample_size import sample_size
    from asap.studies.headline import NUM_REQUESTS
    from asap.sim.cost import CostModel
    from asap.sim.run import get_hardware, get_model
    from asap.workload.presets import workload_requests
    from asap.workload.slo import parse_slo
    seen = []

    def stub(requests, engine, devices, model, hardware, **kw):
        seen.append(len(requests))
        raise SystemExit(0)
    monkeypatch.setattr(tune_mod, "tune", stub)
    for argv in ([], ["--num-requests", "4000"]):
        with pytest.raises(SystemExit):
            main(["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "2s+1ms/tok", *argv])
    slo, cost = parse_slo("2s+1ms/tok"), CostModel(get_model("deepseek-v3"), get_hardware("cloudmatrix384"))
    auto = sample_size(lambda k: slo.apply(workload_requests("fixed-4k", k)), 32, cost, NUM_REQUESTS)
    assert seen == [auto, 4000] and auto > NUM_REQUESTS


def test_plan_tune_passes_the_search_flags_to_both_engines(monkeypatch, capsys):
    """`asap plan --tune` widens both engines' search as `asap sim headline` does: --orders, --lanes and
    --fleet-fractions reach each engine's tune alike; without --tune they are refused, not ignored, and a
    malformed lane or fraction gets one line."""
    import asap.studies.tune as tune_mod
    seen = []

    def stub(requests, engine, devices, model, hardware, **kw):
        seen.append((engine, kw["orders"], kw["lanes"], kw["fleet_fractions"]))
        return tune_mod.Tuned(engine, devices, None, None, None, None, reason="stub")
    monkeypatch.setattr(tune_mod, "tune", stub)
    assert main(["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "2s+1ms/tok", "--num-requests", "50",
                 "--orders", "fcfs", "srpt", "--lanes", "1:4096", "2:2048", "--fleet-fractions", "0.25", "0.5"]) == 0
    assert seen == [(e, ("fcfs", "srpt"), ((1, 4096), (2, 2048)), (0.25, 0.5)) for e in ("sync", "async")]
    seen.clear()
    assert main(["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "2s+1ms/tok", "--num-requests", "50"]) == 0
    assert seen == [(e, ("fcfs",), (), (0.5,)) for e in ("sync", "async")]
    seen.clear()
    capsys.readouterr()
    assert main(["plan", "--devices", "32", "--lanes", "1:4096"]) == 2
    assert "--lanes widen --tune's search: give --tune WORKLOAD" in capsys.readouterr().err
    argv = ["plan", "--devices", "32", "--tune", "fixed-4k", "--slo", "5s", "--num-requests", "50"]
    with pytest.raises(SystemExit) as e:        # argparse's one-line usage error
        main([*argv, "--lanes", "1x4096"])
    assert e.value.code == 2 and "a lane is N:TOKENS" in capsys.readouterr().err
    assert main([*argv, "--fleet-fractions", "1.0"]) == 2
    err = capsys.readouterr().err
    assert "fleet fractions must be shares in (0, 1)" in err and "Traceback" not in err
    assert not seen


def test_plan_and_headline_check_the_search_flags_alike_before_any_simulation():
    from asap.studies.headline import run_headline
    from asap.studies.plan import best_configs
    from asap.studies.space import check_search
    assert check_search((0.5,), ("fcfs", "srpt"), [["1", "4096"]]) == ((1, 4096),)
    for bad, match in [(dict(fleet_fractions=(1.0,)), "fleet fractions"), (dict(orders=("lifo",)), "orders must be"),
                       (dict(lanes=((0, 4096),)), "lanes must be"), (dict(lanes=((1,),)), "lanes must be")]:
        with pytest.raises(ValueError, match=match):
            best_configs(devices=8, workload="fixed-4k", num_requests=10, **bad)
        with pytest.raises(ValueError, match=match):
            run_headline((8,), ("fixed-4k",), out_dir=None, verbose=False, **bad)
