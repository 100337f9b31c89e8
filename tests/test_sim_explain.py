"""`asap sim explain`: every die's window is accounted for exactly once (busy + stall + idle = the window),
for both engines, and the breakdown agrees with the run it explains."""
import re

import pytest

from asap.scheduler.request import Request
from asap.studies.explain import explain, format_explain
from asap.studies.tune import EngineConfig
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
