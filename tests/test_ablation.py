"""`asap ablation`: one row per configuration with the documented keys, each toggle really reaches the
simulator as a different policy object, and the SIMULATED table is deterministic for a seed."""
import dataclasses
import json
from types import SimpleNamespace

import pytest

from asap.bench.ablation import ROW_KEYS, AdmittingRouter, Settings, ablation, configs, fill_slots
from asap.bench.ablation_report import format_ablation
from asap.measure.metrics import RequestResult
from asap.cli import main
from asap.scheduler.expert_select import AggregationWindow, DeadlineFirst, OldestFirst
from asap.scheduler.router import QueueAwareRouter, RoundRobinRouter

TINY = Settings(model="small-deepseek-v3", hardware="h800", devices=4, attention_workers=2, workload="poisson",
                num_requests=30, max_prompt=4096, token_budget=4096, zipf=1.0, redundant=4, tolerance=0.2,
                max_iters=8)


def capture():
    """A stand-in simulator that records what each row passed (rows are separated by the log lines)."""
    calls = []

    def sim(requests, engine, model, hardware, devices, attention_workers=None, **kw):
        calls.append((engine, attention_workers, kw))
        span = requests[-1].arrival - requests[0].arrival
        ttft = 0.5 if span == 0 else 0.1 * (len(requests) - 1) / span
        return SimpleNamespace(results=[RequestResult.of(r, ttft) for r in requests])

    return calls, sim


def test_each_toggle_reaches_the_simulator_as_a_different_policy_object():
    calls, sim = capture()
    rows = {}
    res = ablation(TINY, sim=sim, log=lambda msg: rows.setdefault(msg.split("] ")[1].rsplit(":", 1)[0],
                                                                   [c for c in calls if "router" in c[2]]))
    seen, done = {}, 0
    for label, upto in rows.items():          # each row's calls: those after the previous row's
        seen[label], done = upto[done:], len(upto)
    assert [r["name"] for r in res["rows"]] == [c.name for c in configs()]

    def kws(label):
        assert seen[label], label
        return [kw for _, _, kw in seen[label]]

    for kw in kws("async plain"):
        assert type(kw["router"]) is RoundRobinRouter and type(kw["selector"]) is OldestFirst
        assert (kw["microbatches"], kw["order"], kw["redundant_experts"]) == (1, "fcfs", 0)
    assert all(type(kw["router"]) is QueueAwareRouter for kw in kws("async plain + queue-aware routing"))
    assert all(isinstance(kw["router"], AdmittingRouter) for kw in kws("async plain + SLO admission (demote)"))
    assert all(kw["order"] == "edf" for kw in kws("async plain + EDF replica order"))
    assert all(kw["microbatches"] == 2 for kw in kws("async plain + micro-batch ping-pong (k=2)"))
    assert all(kw["microbatches"] == "adaptive" for kw in kws("async plain + adaptive depth (k=2..4)"))
    assert all(type(kw["selector"]) is DeadlineFirst for kw in kws("async plain + deadline-first expert selection"))
    assert all(isinstance(kw["selector"], AggregationWindow) for kw in kws("async plain + expert aggregation window"))
    assert all(kw["redundant_experts"] == 4 for kw in kws("async plain + redundant experts (EPLB)"))
    # sync rows run the sync engine on all devices; async rows share one A
    assert {(e, a) for e, a, _ in seen["sync baseline"]} == {("sync", None)}
    assert {a for label in seen if label.startswith("async") for _, a, _ in seen[label]} == {2}
    # policy objects keep state: every simulation gets fresh ones
    routers = [kw["router"] for kw in kws("async plain + queue-aware routing")]
    assert len({id(r) for r in routers}) == len(routers) > 1


def test_sim_ablation_rows_have_the_documented_keys_and_are_deterministic(tmp_path, capsys):
    out = tmp_path / "ablation.json"
    flags = ["--model", "small-deepseek-v3", "--hardware", "h800", "--devices", "4", "--attention-workers", "2",
             "--workload", "poisson", "--num-requests", "30", "--max-prompt", "4096", "--token-budget", "4096",
             "--zipf", "1", "--redundant", "4", "--tolerance", "0.2", "--max-iters", "8"]
    assert main(["ablation", *flags, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "Zipf 1" in text and "30 requests" in text
    data = json.loads(out.read_text())
    assert data["label"] == "SIMULATED" and data["settings"]["seed"] == 0
    assert [r["name"] for r in data["rows"]] == [c.name for c in configs()]
    for row in data["rows"]:
        assert set(ROW_KEYS) <= set(row)
        assert row["ref_rate"] == data["ref_rate"] and row["max_slo_rate"] > 0
    again = ablation(TINY)
    assert [r["max_slo_rate"] for r in again["rows"]] == [r["max_slo_rate"] for r in data["rows"]]
    assert [r["ttft_p90_ms_at_ref"] for r in again["rows"]] == pytest.approx(
        [r["ttft_p90_ms_at_ref"] for r in data["rows"]])
    assert format_ablation(again).count("\n") > len(configs())


def test_leave_one_out_adds_one_row_per_optimization_and_bad_settings_fail():
    names = [c.name for c in configs(leave_one_out=True)]
    assert len(names) == len(set(names)) == len(configs()) + 8
    with pytest.raises(ValueError, match="backend"):
        Settings(backend="gpu")
    assert fill_slots(256, 12, 0) == 8 and fill_slots(256, 12, 32) == 32 and fill_slots(32, 2, 3) == 4
    with pytest.raises(ValueError, match="--slo"):
        ablation(dataclasses.replace(TINY, slo="soon"), sim=capture()[1])


def test_emulated_rows_map_each_toggle_onto_the_runtime_config():
    from asap.bench.ablation import ALL_ON, EMULATED, PLAIN, runtime_config
    plain = runtime_config(PLAIN, "async", EMULATED, 2, 32)
    assert (plain.router, plain.order, plain.microbatches, plain.adaptive_depth, plain.selector) == \
        ("round-robin", "fcfs", 1, False, "oldest")
    assert (plain.aggregation_window_ms, plain.redundant_experts, plain.admission) == (0.0, 0, "off")
    assert (plain.compute, plain.attention_workers, plain.expert_workers) == ("emulated", 2, 2)
    on = runtime_config(ALL_ON, "async", EMULATED, 2, 32)
    assert (on.router, on.order, on.microbatches, on.adaptive_depth, on.selector) == \
        ("queue-aware", "edf", 2, True, "deadline")
    assert (on.aggregation_window_ms, on.redundant_experts, on.admission) == (EMULATED.window_ms, 2, "demote")
    assert runtime_config(PLAIN, "sync", EMULATED, 2, 32).microbatches == 2     # two-batch overlap
