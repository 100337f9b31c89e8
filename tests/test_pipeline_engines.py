"""Every driver follows the one step pipeline, and the simulator is built from the RuntimeConfig it names."""
import dataclasses

import pytest

from asap.bench.targets import sim_target
from asap.config import RuntimeConfig
from asap.pipeline.depth import expert_batch_cap
from asap.pipeline.step import Attend, order
from asap.scheduler.request import Request
from asap.sim.from_runtime import HONOURED, MECHANICS, engine_spec
from asap.sim.run import build_engine, run
from asap.sim.spec import EngineSpec

SMALL = dict(model_cfg="small-deepseek-v3", hardware="h800")


def _attention_order(spans, group):
    names = [s[2] for s in sorted(spans, key=lambda s: s[3]) if s[0] == group and s[1] == 0
             and s[2].startswith("attn")]
    return [tuple(int(x.lstrip("Lmb")) for x in n.split()[1:]) for n in names]      # "attn L3 mb1" -> (3, 1)


@pytest.mark.parametrize("engine,extra", [("async", dict(devices=3, attention_workers=1)), ("sync", dict(devices=2))])
def test_the_simulated_engines_attend_in_the_pipeline_order(engine, extra):
    eng = build_engine(EngineSpec(engine, SMALL["model_cfg"], SMALL["hardware"], **extra, token_budget=4096,
                                  router="round-robin"))
    out = run([Request(0, 4096)], engine, **SMALL, **extra, token_budget=4096, router="round-robin",
              trace_window=(0.0, 1e9))
    group = "attention" if engine == "async" else "rank"
    want = [(a.layer, a.mb) for a in order(2, eng.model.moe_layers) if isinstance(a, Attend)]
    assert _attention_order(out.spans, group) == want


def test_every_runtime_field_is_mapped_or_named_as_mechanics():
    names = {f.name for f in dataclasses.fields(RuntimeConfig)}
    unclassified = names - HONOURED - MECHANICS - {"admission", "admission_slack"}
    assert not unclassified, f"classify these RuntimeConfig fields in asap/sim/from_runtime.py: {unclassified}"


def test_the_engine_spec_carries_the_policies_and_the_one_batch_cap():
    rt = RuntimeConfig(attention_workers=2, expert_workers=3, token_budget=512, adaptive_depth=True,
                       redundant_experts=2, selector="largest", aggregation_window_ms=2.0, order="sjf")
    kw = engine_spec(rt, "async")
    assert kw.devices == 5 and kw.attention_workers == 2 and kw.microbatches == "adaptive"
    assert kw.redundant_experts == 2 and kw.selector == "largest" and kw.window_s == pytest.approx(0.002)
    assert kw.max_batch_tokens == expert_batch_cap(512) and kw.order == "sjf"
    assert kw.max_wait_s is None                        # the age bound belongs to the fullest selector only
    fullest = engine_spec(RuntimeConfig(attention_workers=2, expert_workers=2, selector="fullest",
                                        expert_max_wait_ms=7.0), "async")
    assert fullest.selector == "fullest" and fullest.max_wait_s == pytest.approx(0.007)
    sync = engine_spec(RuntimeConfig(devices=4, microbatches=1), "sync")
    assert sync.devices == 4 and sync.two_batch_overlap is False


def test_a_field_the_simulator_cannot_honour_is_an_error_naming_it():
    with pytest.raises(ValueError, match="RuntimeConfig.admission"):
        engine_spec(RuntimeConfig(admission="reject"), "async")
    with pytest.raises(ValueError, match="RuntimeConfig.admission"):
        sim_target("async", "tiny-deepseek-v3", RuntimeConfig(admission="demote"), 2)
    with pytest.raises(ValueError, match="RuntimeConfig.microbatches"):
        engine_spec(RuntimeConfig(microbatches=6, adaptive_depth=True), "async")
    with pytest.raises(ValueError, match="engine"):
        engine_spec(RuntimeConfig(), "both")


def test_an_unknown_queue_order_is_refused_when_configured():
    with pytest.raises(ValueError, match="order must be one of fcfs, sjf, edf, srpt, edf-preempt"):
        RuntimeConfig(order="lifo")
    assert engine_spec(RuntimeConfig(order="srpt"), "async").order == "srpt"


def test_sim_target_runs_the_mapped_engine():
    rt = RuntimeConfig(attention_workers=1, expert_workers=1, token_budget=256, hardware="h800")
    t = sim_target("async", "tiny-deepseek-v3", rt, 2)
    res = t.run([Request(i, 100 + 50 * i, arrival=0.01 * i) for i in range(4)])
    assert "SIMULATED" in t.label and all(r.ttft is not None and r.ttft > 0 for r in res)


def test_the_fullest_selectors_age_bound_has_one_default_and_reaches_the_demos_runtime():
    from asap.demo.emulated import runtime_for
    from asap.demo.settings import QUICK
    from asap.scheduler.expert_select import FullestLayer
    from asap.studies.config import EngineConfig
    assert RuntimeConfig().expert_max_wait_ms == pytest.approx(FullestLayer().max_wait_s * 1e3)
    c = EngineConfig("async", 1, 4096, attention_workers=2, selector="fullest", max_wait_s=0.005)
    rt = runtime_for(c, QUICK, devices=18)
    assert rt.selector == "fullest" and rt.expert_max_wait_ms == pytest.approx(5.0)
    assert engine_spec(rt, "async").max_wait_s == pytest.approx(0.005)
