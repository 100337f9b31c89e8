"""A short-prompt lane (issue 24 point 4): a few replicas that take only prompts under `short_below_tokens`,
so that no short prompt waits behind a long prompt's step there. One router (asap.scheduler.length_router,
one_way) for the runtime and the simulator; in sync, the lane is a deployment of its own in a fleet
(asap.sim.run.sync_fleet_parts). Real compute equals the reference engine; bad lanes are refused."""
import dataclasses

import pytest
import torch

import asap
from asap.config import RuntimeConfig
from asap.scheduler.length_router import LengthRouter
from asap.scheduler.request import Request
from asap.scheduler.router import ReplicaLoad, make_router
from asap.sim.run import build_engine, run, sync_fleet_parts
from asap.sim.spec import EngineSpec
from asap.studies.config import EngineConfig
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


@pytest.mark.timeout(180)
def test_a_lane_equals_the_reference_engine_and_takes_only_short_prompts(same_as_reference):
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 900, 37, 99, 100, 400, 3)]
    with asap.LLM("tiny-deepseek-v3", engine="reference") as ref:
        expect = ref.prefill(prompts)
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, colocated=True,
                  token_budget=256, short_replicas=1, short_below_tokens=100) as llm:
        router, picks = llm.engine.router, []
        assert isinstance(router, LengthRouter) and router.one_way
        route = router.route
        router.route = lambda req, loads, now: picks.append(route(req, loads, now)) or picks[-1]
        outs = [f.result(timeout=90) for f in [llm.submit(p) for p in prompts]]
        assert llm.healthy()
    assert picks == [int(len(p) >= 100) for p in prompts]       # replica 0 is the lane
    same_as_reference(prompts, outs, expect)


def _loads(queued):
    return [ReplicaLoad(i, len(q), sum(n for n, _ in q), q) for i, q in enumerate(queued)]


def test_short_prompts_overflow_out_of_a_full_lane_and_long_ones_never_enter_it():
    lane = LengthRouter(make_router("queue-aware"), make_router("queue-aware"), {1, 2}, 4096, one_way=True)
    busy = [(60000, 0)]                                         # ~4 s of queued work on the default cost
    full_lane = _loads([busy, [], []])
    # a short prompt with room to spare stays in the (busy) lane only if the lane meets its deadline
    assert lane.route(Request(0, 1000, 0.0, deadline=100.0), full_lane, 0.0) == 0
    assert lane.route(Request(1, 1000, 0.0, deadline=1.0), full_lane, 0.0) in (1, 2)
    assert lane.num_overflowed == 1
    # a long prompt predicted to miss in its own group does not spill into an idle lane
    full_rest = _loads([[], busy, busy])
    assert lane.route(Request(2, 8000, 0.0, deadline=1.0), full_rest, 0.0) in (1, 2)
    # nested as a length-aware fleet's narrow group, it predicts with its groups' routers
    fleet = LengthRouter(lane, make_router("queue-aware"), {3}, 32768)
    loads = _loads([[], [], [], []])
    assert fleet.can_predict and fleet.overflow
    assert fleet.route(Request(3, 500, 0.0), loads, 0.0) == 0
    assert fleet.route(Request(4, 9000, 0.0), loads, 0.0) in (1, 2)
    assert fleet.route(Request(5, 40000, 0.0), loads, 0.0) == 3


def test_simulated_async_lane_routes_by_length_and_loses_no_request():
    reqs = parse_slo("2s+1ms/tok").apply(workload_requests("conversation", 200))
    c = EngineConfig("async", attention_tp=1, token_budget=8192, colocated=True, wide_replicas=5, wide_tp=4,
                     wide_token_budget=32768, short_replicas=1, short_below_tokens=4096)
    spec = c.spec("deepseek-v3", "cloudmatrix384", 32)
    eng = build_engine(spec)
    lane = eng.router.narrow
    assert isinstance(lane, LengthRouter) and lane.wide_ids == frozenset(range(1, 12))
    res = run(reqs, spec)
    assert sorted(r.request_id for r in res.results) == sorted(r.id for r in reqs)
    assert all(r.ok for r in res.results)
    assert "short lane 1 x TP1 for prompts < 4K" in c.describe(32)
    # without the lane the same requests run on the same fleet: the lane changes where prompts go, not what runs
    base = run(reqs, dataclasses.replace(c, short_replicas=0).spec("deepseek-v3", "cloudmatrix384", 32))
    assert sum(r.num_tokens for r in base.results) == sum(r.num_tokens for r in res.results)


def test_a_sync_lane_is_a_deployment_of_its_own():
    reqs = parse_slo("2s+1ms/tok").apply(workload_requests("conversation", 300))
    spec = EngineSpec(engine="sync", devices=64, attention_tp=8, token_budget=16384, wide_replicas=2, wide_tp=16,
                      wide_token_budget=32768, short_replicas=2, short_below_tokens=4096)
    parts = {name: (mine, s) for name, mine, s in sync_fleet_parts(reqs, spec)}
    assert set(parts) == {"narrow", "wide", "short"}
    assert [parts[n][1].devices for n in ("short", "narrow", "wide")] == [16, 16, 32]
    assert all(r.num_tokens < 4096 for r in parts["short"][0])
    assert all(r.num_tokens >= 32768 for r in parts["wide"][0])
    assert sorted(r.id for mine, _ in parts.values() for r in mine) == sorted(r.id for r in reqs)
    res = run(reqs, spec)
    assert len(res.results) == len(reqs) and res.stats["fleet"].keys() <= {"narrow", "wide", "short"}
    # at 32 dies a TP8 lane would be an 8-die deployment: it cannot hold DeepSeek-V3's weights
    with pytest.raises(ValueError, match="weights"):
        run(reqs[:20], dataclasses.replace(spec, devices=32, wide_replicas=1, short_replicas=1))


@pytest.mark.parametrize("kw,match", [
    (dict(attention_workers=2, expert_workers=2, colocated=True, short_replicas=2), "must leave at least one"),
    (dict(attention_workers=2, expert_workers=2, colocated=True, short_replicas=1, short_below_tokens=0),
     "short_below_tokens >= 1"),
])
def test_bad_runtime_lanes_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        RuntimeConfig(**kw)


@pytest.mark.parametrize("kw,match", [
    (dict(engine="sync", short_replicas=1), "length-aware fleets"),
    (dict(engine="async", colocated=True, wide_replicas=2, wide_tp=4, short_replicas=1, short_below_tokens=32768),
     "must be under wide_from_tokens"),
    (dict(engine="async", short_replicas=-1), "short_replicas >= 0"),
])
def test_bad_simulated_lanes_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        EngineSpec(**kw)


def test_a_lane_filling_every_narrow_replica_is_refused():
    with pytest.raises(ValueError, match="must leave at least one"):
        build_engine(EngineSpec(engine="async", colocated=True, wide_replicas=4, wide_tp=4, short_replicas=16))


def test_the_runtime_lane_maps_to_the_simulator():
    from asap.sim.from_runtime import engine_spec
    rt = RuntimeConfig(compute="emulated", attention_workers=4, expert_workers=4, colocated=True, short_replicas=1,
                       short_below_tokens=2048)
    spec = engine_spec(rt, "async")
    assert (spec.short_replicas, spec.short_below_tokens) == (1, 2048)


def test_the_planner_prints_a_lane_in_its_serve_commands():
    from asap.studies.deploy import deployment_lines, deployments
    a = EngineConfig("async", attention_tp=1, token_budget=8192, colocated=True, wide_replicas=5, wide_tp=4,
                     short_replicas=1, short_below_tokens=4096)
    assert any("--short-replicas 1" in line for line in deployment_lines(a, 32, "deepseek-v3", "cloudmatrix384"))
    s = EngineConfig("sync", attention_tp=8, token_budget=16384, wide_replicas=2, wide_tp=16, short_replicas=2)
    parts = deployments(s, 64, 256, compute="emulated", hardware="cloudmatrix384")
    assert [(d.devices, d.serves) for d in parts] == [(16, "prompts of 4096 to 32768 tokens"),
                                                    (32, "prompts of 32768 tokens or more"),
                                                    (16, "prompts under 4096 tokens")]


def test_the_search_tries_lanes_only_where_asked_and_only_where_a_layout_holds_one():
    from asap.studies.space import buildable, secondary, space
    a = EngineConfig("async", attention_tp=1, token_budget=8192, instances=1, attention_workers=32, colocated=True)
    s = EngineConfig("sync", attention_tp=8, token_budget=16384, wide_replicas=1, wide_tp=16)
    assert not any(v.short_replicas for v in secondary(a) + secondary(s))           # the default search: none
    lanes = ((1, 4096), (2, 8192))
    assert [(v.short_replicas, v.short_below_tokens) for v in secondary(a, lanes=lanes) if v.short_replicas] \
        == [(1, 4096), (2, 8192)]
    assert not any(v.short_replicas for v in secondary(EngineConfig("sync", 8), lanes=lanes))   # sync: fleets only
    assert buildable(dataclasses.replace(a, short_replicas=1), 32)
    # at 32 dies a sync lane would be a deployment too small for the weights; at 64 a 16-die one holds them
    assert not buildable(dataclasses.replace(s, short_replicas=1), 32)
    assert buildable(dataclasses.replace(s, wide_replicas=2, short_replicas=2), 64)
    with_lanes = space("async", 32, lanes=((1, 4096),))
    assert any(c.short_replicas for c in with_lanes)
    assert all(buildable(c, 32) for c in with_lanes if c.short_replicas)


def test_the_headline_records_lanes_and_refuses_resuming_under_others():
    from asap.studies.headline import DEFAULT_SLO, run_headline
    from asap.workload.slo import parse_slo
    with pytest.raises(ValueError, match="lanes must be"):
        run_headline((8,), ("fixed-4k",), lanes=((0, 4096),), out_dir=None, verbose=False)
    earlier = {"slo": str(parse_slo(DEFAULT_SLO)), "model": "deepseek-v3", "hardware": "cloudmatrix384",
               "rows": []}                                  # recorded before lanes were: none
    with pytest.raises(ValueError, match=r"lanes: \[\] there, \[\[1, 4096\]\] here"):
        run_headline((8,), ("fixed-4k",), resume=earlier, lanes=((1, 4096),), out_dir=None, verbose=False)
    from asap.cli import main
    with pytest.raises(SystemExit):
        main(["sim", "headline", "--lanes", "1:x"])


def test_a_lane_keeps_its_share_when_a_row_is_scaled_to_more_devices():
    """The headline's larger rows scale a 32-die fleet to one instance of N dies keeping its wide share; its
    short-prompt lane keeps its share likewise (one TP1 lane replica per 32 dies is two at 64), so a lane
    found at 32 dies is not diluted by scaling."""
    from asap.studies.headline import scale_config
    from asap.studies.space import buildable
    a = EngineConfig("async", attention_tp=1, token_budget=8192, colocated=True, wide_replicas=5, wide_tp=4,
                     short_replicas=1, short_below_tokens=4096)
    a64 = scale_config(a, 64, 32, "deepseek-v3", "cloudmatrix384")
    assert (a64.instances, a64.wide_replicas, a64.short_replicas, a64.short_below_tokens) == (1, 10, 2, 4096)
    assert buildable(a64, 64)
    assert scale_config(dataclasses.replace(a, short_replicas=0), 64, 32, "deepseek-v3",
                        "cloudmatrix384").short_replicas == 0
    c = EngineConfig("async", attention_tp=1, token_budget=8192, instances=1, attention_workers=32, colocated=True,
                     short_replicas=1, short_below_tokens=2048)
    assert scale_config(c, 128, 32, "deepseek-v3", "cloudmatrix384").short_replicas == 4
    p = EngineConfig("async", attention_tp=1, token_budget=8192, attention_workers=16, short_replicas=1,
                     short_below_tokens=4096)
    p64 = scale_config(p, 64, 32, "deepseek-v3", "cloudmatrix384")
    assert (p64.attention_workers, p64.short_replicas) == (32, 2) and buildable(p64, 64)
    s = EngineConfig("sync", attention_tp=8, token_budget=16384, wide_replicas=2, wide_tp=16, short_replicas=2,
                     short_below_tokens=4096)
    s128 = scale_config(s, 128, 64, "deepseek-v3", "cloudmatrix384")
    assert (s128.wide_replicas, s128.short_replicas) == (4, 4) and buildable(s128, 128)
