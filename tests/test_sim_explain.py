"""`asap sim explain`: every die's window is accounted for exactly once (busy + stall + idle = the window),
for both engines, and the breakdown agrees with the run it explains."""
import re

import pytest

from asap.scheduler.request import Request
from asap.studies.explain import explain, format_explain
from asap.studies.config import EngineConfig
from asap.workload.slo import SLO

SMALL = dict(model="small-deepseek-v3", hardware="h800")


def _requests():
    return SLO(0.05, 1e-5).apply([Request(i, 500 + 1500 * (i % 5), 0.004 * i) for i in range(200)])


@pytest.mark.parametrize("config", [
    EngineConfig("sync", 1, 4096), EngineConfig("sync", 2, 4096, instances=2),
    EngineConfig("async", 1, 4096, attention_workers=4), EngineConfig("async", 1, 2048, attention_workers=2,
                                                                      instances=2, microbatches=3)])
def test_busy_stall_and_idle_add_up_to_the_window_for_every_die(config):
    x = explain(_requests(), config, 8, rate=150.0, **SMALL, window=(0.2, 0.9))
    assert x["label"] == "SIMULATED" and x["wall_s"] == pytest.approx(0.7)
    per = 8 // config.instances
    assert sum(u["dies"] for u in x["units"]) == per          # every die of the explained instance
    for u in x["units"]:
        assert min(u["busy_s"], u["stall_s"], u["idle_s"]) >= -1e-9
        assert u["busy_s"] + u["stall_s"] + u["idle_s"] == pytest.approx(x["wall_s"], abs=1e-9)
    assert any(u["busy_s"] > 0 for u in x["units"])
    assert x["link"]["seconds"] > 0 and x["expert_batches"]["mean_tokens"] > 0
    if config.engine == "async":
        assert [u["role"] for u in x["units"]].count("experts") == 1
        assert x["expert_batches"]["count"] > 0 and x["expert_batches"]["max_tokens"] >= x["expert_batches"]["p50_tokens"]
    else:       # a lock-step rank computes only inside a forward: what is not busy there is stall
        assert all(u["role"] == "attention+experts" for u in x["units"])
    text = format_explain(x)
    assert text.count("[SIMULATED]") == len(text.splitlines()) and "busy" in text and "<4K" in text


def test_a_heavier_load_keeps_the_dies_busier_and_bad_input_is_refused():
    light = explain(_requests(), EngineConfig("sync", 1, 4096), 8, rate=20.0, **SMALL, window=(0.5, 2.0))
    heavy = explain(_requests(), EngineConfig("sync", 1, 4096), 8, rate=150.0, **SMALL, window=(0.2, 0.9))
    busy = lambda x: sum(u["busy_s"] for u in x["units"]) / (x["wall_s"] * len(x["units"]))   # noqa: E731
    assert busy(heavy) > busy(light)
    with pytest.raises(ValueError, match="deadlines"):
        explain([Request(0, 100)], EngineConfig("sync"), 8, 1.0, **SMALL)
    with pytest.raises(ValueError, match="rate"):
        explain(_requests(), EngineConfig("sync"), 8, 0.0, **SMALL)


def test_the_explain_command_prints_a_simulated_breakdown(capsys, tmp_path):
    from asap.studies.__main__ import main
    out = tmp_path / "x.json"
    assert main(["explain", "--engine", "async", "--devices", "8", "--rate", "50", "--workload", "fixed-2k",
                 "--num-requests", "100", "--model", "small-deepseek-v3", "--hardware", "h800",
                 "--attention-workers", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[SIMULATED]" in printed and "expert pool" in printed and out.stat().st_size > 0


def test_without_attention_workers_async_is_explained_at_its_balanced_split(capsys):
    from asap.studies.__main__ import main
    assert main(["explain", "--engine", "async", "--devices", "8", "--rate", "50", "--workload", "fixed-2k",
                 "--num-requests", "100", "--model", "small-deepseek-v3", "--hardware", "h800"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    a, e = (int(x) for x in re.search(r"\[A=(\d+) x TP1 \+ E=(\d+)\]", head).groups())
    assert a >= 1 and e >= 1 and a + e == 8


def test_a_colocated_run_is_explained_with_every_die_counted_once_and_a_window_merges_batches():
    """Co-located: the pool is every replica's die, so its unit shares the dies (not added to them); an
    expert window makes the expert batches larger."""
    kw = dict(rate=150.0, **SMALL, window=(0.2, 0.9))
    plain = explain(_requests(), EngineConfig("async", 1, 4096, attention_workers=8, colocated=True), 8, **kw)
    held = explain(_requests(), EngineConfig("async", 1, 4096, attention_workers=8, colocated=True,
                                             window_s=0.002), 8, **kw)
    pool = [u for u in plain["units"] if u["unit"] == "expert pool"]
    assert len(pool) == 1 and pool[0]["dies"] == 8 and pool[0]["role"] == "experts, co-located"
    assert sum(u["dies"] for u in plain["units"] if u["unit"] != "expert pool") == 8
    for u in plain["units"]:
        assert u["busy_s"] + u["stall_s"] + u["idle_s"] == pytest.approx(plain["wall_s"], abs=1e-9)
    assert plain["stats"]["attention_stretch_s"] > 0
    assert held["expert_batches"]["mean_tokens"] > plain["expert_batches"]["mean_tokens"]
    assert "co-located" in format_explain(plain) and "expert window 2 ms" in held["describe"]


def _mixed():
    """Short prompts and a few long ones (>= the fleets' 4K threshold below)."""
    return SLO(0.05, 1e-5).apply([Request(i, 6000 if i % 10 == 0 else 600, 0.004 * i) for i in range(200)])


def test_a_sync_fleet_is_explained_per_deployment_with_every_die_and_request_once():
    fleet = EngineConfig("sync", 1, 2048, wide_replicas=1, wide_tp=4, wide_from_tokens=4096)
    x = explain(_mixed(), fleet, 8, rate=100.0, **SMALL, window=(0.2, 0.7))
    names = [d["deployment"] for d in x["deployments"]]
    assert names == ["narrow", "wide"] and "fleet" in x["describe"]
    assert sum(d["num_requests"] for d in x["deployments"]) == x["num_requests"] == 200
    assert sum(u["dies"] for d in x["deployments"] for u in d["units"]) == 8      # DP4 x TP1 + DP1 x TP4
    for d in x["deployments"]:
        for u in d["units"]:
            assert u["busy_s"] + u["stall_s"] + u["idle_s"] == pytest.approx(x["wall_s"], abs=1e-9)
    assert x["deployments"][1]["buckets"]["<4K"]["num_requests"] <= x["deployments"][0]["buckets"]["<4K"]["num_requests"]
    text = format_explain(x)
    assert text.count("deployment ") == 2 and text.count("[SIMULATED]") == len(text.splitlines())


def test_an_async_fleet_names_its_wide_replicas_and_counts_their_dies():
    fleet = EngineConfig("async", 1, 2048, colocated=True, wide_replicas=1, wide_tp=4, wide_from_tokens=4096)
    x = explain(_mixed(), fleet, 8, rate=100.0, **SMALL, window=(0.2, 0.7))
    attention = [u for u in x["units"] if u["role"].startswith("attention")]
    assert [u["role"] for u in attention].count("attention >= 4K") == 1
    assert sum(u["dies"] for u in attention) == 8 and [u["dies"] for u in attention][-1] == 4
    assert "attention >= 4K" in format_explain(x)


def test_the_explain_command_takes_a_whole_configuration_as_json(capsys):
    from asap.cli import main
    small = ["--devices", "8", "--rate", "50", "--workload", "fixed-2k", "--num-requests", "100",
             "--model", "small-deepseek-v3", "--hardware", "h800"]
    assert main(["sim", "explain", "--config", '{"engine": "async", "attention_workers": 4}', *small]) == 0
    assert "A=4 x TP1 + E=4" in capsys.readouterr().out
    for bad, why in (("[1]", "JSON object"), ('{"engine": "sync", "nope": 1}', "EngineConfig fields"), ("{", "JSON")):
        assert main(["sim", "explain", "--config", bad, *small]) == 2
        assert why in capsys.readouterr().err
    assert main(["sim", "explain", *small]) == 2 and "--engine" in capsys.readouterr().err


def test_a_rate_the_engine_cannot_sustain_is_flagged_by_its_last_third():
    """Past capacity the queue grows over the run: the last third of the arrivals misses far more than the
    first, and the printed breakdown says the rate is not sustained; under capacity the thirds agree."""
    reqs = SLO(0.05, 1e-5).apply([Request(i, 500 + 1500 * (i % 5), 0.004 * i) for i in range(300)])
    light = explain(reqs, EngineConfig("sync", 1, 4096), 8, rate=150.0, **SMALL)
    over = explain(reqs, EngineConfig("sync", 1, 4096), 8, rate=3000.0, **SMALL)
    assert light["by_arrival_third"] == [1.0, 1.0, 1.0] and "not sustained" not in format_explain(light)
    first, _, last = over["by_arrival_third"]
    assert first > last + 0.5 and "not sustained" in format_explain(over)


def test_the_rate_is_set_against_the_work_ceiling():
    """explain prints the rate as a share of `asap sim bound`'s ceiling; above it, it says no engine sustains
    it. Every run's throughput is under the ceiling: the busiest rate here finishes later than its arrivals."""
    reqs = SLO(0.05, 1e-5).apply([Request(i, 500 + 1500 * (i % 5), 0.004 * i) for i in range(300)])
    light = explain(reqs, EngineConfig("sync", 1, 4096), 8, rate=150.0, **SMALL)
    assert light["rate"] < light["ceiling"] and "ABOVE" not in format_explain(light)
    over = explain(reqs, EngineConfig("sync", 1, 4096), 8, rate=2 * light["ceiling"], **SMALL)
    assert over["ceiling"] == light["ceiling"]              # the same requests, the same ceiling
    text = format_explain(over)
    assert "work ceiling" in text and "ABOVE: no engine sustains it" in text


def test_a_backlog_left_when_arrivals_stop_is_flagged_by_the_drain():
    """Past capacity the run goes on long after its last arrival (longer than any TTFT budget): flagged.
    Under capacity what arrives last finishes within about its budget."""
    reqs = SLO(0.05, 1e-5).apply([Request(i, 500 + 1500 * (i % 5), 0.004 * i) for i in range(300)])
    light = explain(reqs, EngineConfig("sync", 1, 4096), 8, rate=150.0, **SMALL)
    over = explain(reqs, EngineConfig("sync", 1, 4096), 8, rate=3000.0, **SMALL)
    assert light["drain_s"] <= light["max_budget_s"] and "not sustained" not in format_explain(light)
    assert over["drain_s"] > over["max_budget_s"]
    assert "still queued when arrivals stopped" in format_explain(over)
