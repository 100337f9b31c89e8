"""The co-located async mode of the simulator: every device an attention replica's and an expert shard's,
joined by the async exchange, expert work first on a device (asap.sim.async_engine)."""
import dataclasses
import random

import pytest

from asap.scheduler.request import Request
from asap.sim.async_engine import PoolTime
from asap.sim.run import run
from asap.sim.spec import EngineSpec
from asap.studies.config import EngineConfig
from asap.studies.space import space


def test_pool_time_stretches_an_attention_op_by_the_pool_time_inside_it():
    p = PoolTime()
    p.add(1.0, 2.0)
    p.add(3.0, 3.5)
    assert p.busy_until(0.5) == 0.0
    assert p.busy_until(1.5) == pytest.approx(0.5)
    assert p.busy_until(10.0) == pytest.approx(1.5)
    # 1 s of work from t=0.5: 0.5 s before the first batch, its 1 s pause, 0.5 s after it -> 2.5
    assert p.stretched(0.5, 1.0) == pytest.approx(2.5)
    # 2 s of work from t=0.5 crosses both batches: 0.5 + 1 + 1 + 0.5 (second batch) -> ends at 4.0
    assert p.stretched(0.5, 2.0) == pytest.approx(4.0)
    # an op entirely between batches is not stretched
    assert p.stretched(2.0, 0.5) == pytest.approx(2.5)


def test_a_resumed_stretch_is_the_same_float_as_one_started_over():
    """restretched continues an op's iteration after pool batches are added: bit for bit what a fresh
    iteration gives (the simulated TTFTs must not move when the simulator gets faster)."""
    rng = random.Random(7)
    for _ in range(200):
        p, t = PoolTime(), 0.0
        start, work = rng.uniform(0, 1), rng.uniform(0.01, 2)
        for _ in range(rng.randrange(4)):           # batches before the op started
            t += rng.uniform(0, 0.3)
            p.add(t, t + rng.uniform(0.001, 0.2))
            t = p.ends[-1]
        t = max(t, start)       # the pool runs one batch at a time
        s = p.stretch(start, work)
        for i in range(rng.randrange(1, 8)):        # batches added while it runs, each before its end
            if i or rng.random() < 0.7:             # else the first starts as soon as it can (maybe at `start`)
                t = rng.uniform(t, s.end)
            p.add(t, t + rng.uniform(0.001, 0.3))
            t = p.ends[-1]
            s = p.restretched(s)
            assert s.end == p.stretched(start, work)


def test_pool_time_prune_keeps_what_an_op_in_flight_needs():
    p = PoolTime()
    for i in range(PoolTime.PRUNE + 10):
        p.add(float(i), i + 0.5)
    before = p.stretched(PoolTime.PRUNE + 2.2, 1.0)
    p.prune(PoolTime.PRUNE + 2.2)
    assert len(p.starts) < 20
    assert p.stretched(PoolTime.PRUNE + 2.2, 1.0) == pytest.approx(before)


def _burst(n, length, gap=0.05):
    return [Request(id=i, arrival=i * gap, num_tokens=length) for i in range(n)]


def test_colocated_finishes_every_request_and_reports_the_stretch():
    res = run(_burst(24, 4096), "async", devices=16, attention_tp=4, token_budget=8192, colocated=True)
    assert len(res.results) == 24 and all(r.error is None for r in res.results)
    assert res.attention_workers == 4 and res.expert_workers == 16
    assert res.stats["attention_stretch_s"] > 0          # expert batches ran on the replicas' dies


def test_a_lone_prompt_costs_about_what_sync_pays_on_the_same_dies():
    """With one request there is no imbalance to remove: co-located and sync DP x TP1 run the same attention
    and expert work on each die, so their TTFTs agree within the link and scheduling differences."""
    for length in (2048, 8192):
        one = [Request(id=0, arrival=0.0, num_tokens=length)]
        s = run(one, "sync", devices=32, attention_tp=1, token_budget=16384).results[0].ttft
        c = run(one, "async", devices=32, attention_tp=1, token_budget=16384, colocated=True).results[0].ttft
        assert 0.8 < c / s < 1.25, (length, c, s)


def test_colocated_pays_for_the_pool_on_its_attention_dies():
    """The same replicas with the experts moved to their dies run slower than with a separate pool of the
    same size on other dies: the pool's time comes out of attention's."""
    reqs = _burst(16, 8192, gap=0.0)
    sep = run(reqs, "async", devices=48, attention_workers=32, token_budget=8192)
    col = run(reqs, "async", devices=32, attention_tp=1, token_budget=8192, colocated=True)
    assert max(r.ttft for r in col.results) > max(r.ttft for r in sep.results)


def test_memory_is_syncs_and_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="each rank needs"):      # TP1 on 16 dies: sync's memory rule
        run(_burst(2, 1024), "async", devices=16, attention_tp=1, colocated=True)
    with pytest.raises(ValueError, match="async layout"):
        EngineSpec("sync", colocated=True)
    with pytest.raises(ValueError, match="attention_workers x attention_tp"):
        EngineSpec("async", devices=32, attention_workers=5, attention_tp=4, colocated=True)
    with pytest.raises(ValueError, match="must divide"):
        run(_burst(2, 1024), "async", devices=30, attention_tp=4, colocated=True)


def test_the_tuner_searches_colocated_layouts_within_syncs_memory():
    cands = [c for c in space("async", 32, full=False) if c.colocated and not c.wide_replicas]
    assert {c.attention_tp for c in cands} == {1, 4, 8, 16}
    assert all(c.attention_workers * c.attention_tp * c.instances == 32 for c in cands)
    sync_shapes = {(c.instances, c.attention_tp) for c in space("sync", 32, full=False)}
    assert {(c.instances, c.attention_tp) for c in cands} == sync_shapes
    assert "co-located" in EngineConfig("async", 4, 8192, attention_workers=8, colocated=True).describe(32)


def test_a_length_aware_fleet_sends_long_prompts_to_its_wide_replicas():
    """Prompts of >= wide_from_tokens go to the wide (TP8) replicas and finish far sooner than on the TP1 ones;
    the short prompts keep the TP1 replicas' latency."""
    reqs = [Request(id=i, arrival=i * 0.3, num_tokens=70000 if i % 5 == 0 else 3000) for i in range(20)]
    kw = dict(devices=32, attention_tp=1, token_budget=16384, colocated=True)
    fleet = run(reqs, "async", wide_replicas=2, wide_tp=8, **kw)
    flat = run(reqs, "async", **kw)
    assert fleet.attention_workers == 16 + 2 and fleet.expert_workers == 32
    long_ids = {r.id for r in reqs if r.num_tokens >= 32768}
    ttft = lambda res, ids: [r.ttft for r in res.results if r.request_id in ids]
    assert max(ttft(fleet, long_ids)) < 0.5 * min(ttft(flat, long_ids))
    short = {r.id for r in reqs} - long_ids
    assert max(ttft(fleet, short)) < 1.2 * max(ttft(flat, short))


def test_a_sync_fleet_is_two_deployments_behind_a_length_proxy():
    """Sync's fleet: the narrow deployment (DP4 x TP4 on 16 dies) takes the short prompts, the wide one (DP1 x
    TP16 on the other 16, its own chunk) the long ones; the long ones finish far sooner than on one DP8 x TP4
    deployment of all 32 dies, and every request is served."""
    reqs = [Request(id=i, arrival=i * 0.3, num_tokens=70000 if i % 5 == 0 else 3000) for i in range(20)]
    fleet = run(reqs, "sync", devices=32, attention_tp=4, token_budget=8192, wide_replicas=1, wide_tp=16,
                wide_token_budget=32768)
    flat = run(reqs, "sync", devices=32, attention_tp=4, token_budget=8192)
    assert len(fleet.results) == 20 and all(r.ttft is not None for r in fleet.results)
    assert fleet.stats["fleet"]["narrow"]["num_requests"] == 16 and fleet.stats["fleet"]["wide"]["num_requests"] == 4
    long_ids = {r.id for r in reqs if r.num_tokens >= 32768}
    ttft = lambda res, ids: [r.ttft for r in res.results if r.request_id in ids]
    assert sum(ttft(fleet, long_ids)) < 0.6 * sum(ttft(flat, long_ids))
    short = {r.id for r in reqs} - long_ids         # and no short prompt waits at a barrier behind a long one
    assert max(ttft(fleet, short)) < 0.5 * max(ttft(flat, short))


def test_the_sync_proxy_overflows_short_prompts_to_the_wide_deployment_and_never_long_ones_to_the_narrow():
    from asap.sim.run import split_by_length
    rates, ranks = (1000.0, 1000.0), (1000.0, 1000.0)          # tokens/s per deployment and per DP group
    burst = [Request(id=i, arrival=0.0, num_tokens=500, deadline=1.9) for i in range(4)]      # 2 s of narrow work
    narrow, wide = split_by_length(burst, 1000, rates, ranks)
    assert [r.id for r in narrow] == [0, 1, 2] and [r.id for r in wide] == [3]     # the 4th would miss: overflow
    longs = [Request(id=i, arrival=0.0, num_tokens=1500, deadline=3.5) for i in range(3)]
    narrow, wide = split_by_length(longs, 1000, rates, ranks)
    assert narrow == [] and len(wide) == 3          # the wide one misses the 3rd, yet none goes to the narrow one
    narrow, wide = split_by_length([dataclasses.replace(r, deadline=None) for r in burst], 1000, rates, ranks)
    assert len(narrow) == 4 and wide == []          # no deadline: by length alone


def test_the_fleet_shapes_are_the_same_for_both_engines():
    from asap.studies.space import FLEET_CHUNK, FLEET_FROM, space
    for engine in ("sync", "async"):
        fleets = [c for c in space(engine, 32, full=False) if c.wide_replicas]
        assert fleets and all(c.wide_replicas * c.wide_tp * c.instances == 16 and c.wide_from_tokens == FLEET_FROM
                              and c.wide_token_budget == FLEET_CHUNK and c.colocated == (engine == "async")
                              for c in fleets)
        # every fleet builds (memory included) and describes its wide group
        for c in fleets[:3]:
            c.spec("deepseek-v3", "cloudmatrix384", 32)
            assert "for prompts >= 32K" in c.describe(32)


def test_other_wide_shares_are_searched_for_both_engines_where_the_weights_fit():
    from asap.studies.headline import run_headline
    from asap.studies.space import space
    shares = (0.25, 0.5, 0.75)
    for engine in ("sync", "async"):
        assert space(engine, 32, full=False) == space(engine, 32, full=False, fleet_fractions=(0.5,))   # the default
        wide = {(32 // c.instances, c.wide_replicas * c.wide_tp)
                for c in space(engine, 32, full=False, fleet_fractions=shares) if c.wide_replicas}
        if engine == "async":       # one expert pool on the whole instance: any share whose groups divide
            assert {(32, 8), (32, 16), (32, 24)} <= wide
        else:                       # two deployments, each holding DeepSeek-V3 whole: 8 dies cannot
            assert (32, 16) in wide and (32, 8) not in wide and (32, 24) not in wide
    with pytest.raises(ValueError, match="fleet fractions"):
        run_headline((32,), ("conversation",), fleet_fractions=(0.5, 1.0), out_dir=None, verbose=False)


def test_length_router_routes_by_length_within_each_group():
    from asap.scheduler.length_router import LengthRouter
    from asap.scheduler.router import ReplicaLoad, make_router
    r = LengthRouter(make_router("least-requests"), make_router("least-requests"), {2, 3}, 1000)
    loads = [ReplicaLoad(i, n, 0) for i, n in enumerate((5, 1, 4, 2))]
    assert r.route(Request(id=0, arrival=0.0, num_tokens=999), loads, 0.0) == 1
    assert r.route(Request(id=1, arrival=0.0, num_tokens=1000), loads, 0.0) == 3
    with pytest.raises(ValueError, match="wide replica"):
        LengthRouter(r.narrow, r.wide, set(), 1000)


def test_length_router_overflows_to_the_other_group_only_to_meet_a_deadline_its_own_would_miss():
    from asap.scheduler.length_router import LengthRouter
    from asap.scheduler.router import ReplicaLoad, make_router
    cost = lambda queued: sum(n for n, _ in queued) * 1e-3          # 1 ms per token, either group
    r = LengthRouter(make_router("queue-aware", cost), make_router("queue-aware", cost), {2, 3}, 1000)
    busy = [ReplicaLoad(0, 1, 0, busy_until=9.0), ReplicaLoad(1, 1, 0, busy_until=8.0),     # narrow: busy to 8 s
            ReplicaLoad(2, 0, 0, busy_until=0.0), ReplicaLoad(3, 1, 0, busy_until=1.0)]     # wide: free
    short = lambda deadline: Request(id=0, arrival=0.0, num_tokens=500, deadline=deadline)
    assert r.route(short(9.0), busy, 0.0) == 1          # its own group meets 9 s (8 + 0.5)
    assert r.route(short(2.0), busy, 0.0) == 2          # its own misses 2 s, the wide group's best meets it
    assert r.route(short(0.1), busy, 0.0) == 1          # both miss: it stays in its own group
    assert r.route(Request(id=1, arrival=0.0, num_tokens=500), busy, 0.0) == 1     # no deadline: by length
    assert r.num_overflowed == 1
    by_length = LengthRouter(r.narrow, r.wide, {2, 3}, 1000, overflow=False)
    assert by_length.route(short(2.0), busy, 0.0) == 1
    blind = LengthRouter(make_router("least-requests"), make_router("least-requests"), {2, 3}, 1000)
    assert not blind.overflow and blind.route(short(2.0), busy, 0.0) == 0     # no predictions: by length alone


def test_bad_fleets_are_refused():
    with pytest.raises(ValueError, match="co-located layout only"):
        EngineSpec("async", devices=32, wide_replicas=2)
    with pytest.raises(ValueError, match="must leave a positive"):
        EngineSpec("async", devices=32, colocated=True, wide_replicas=4, wide_tp=8)
    with pytest.raises(ValueError, match="leave attention_workers unset"):
        EngineSpec("async", devices=32, colocated=True, wide_replicas=1, attention_workers=24)


def test_headline_traces_show_one_instance_of_a_multi_instance_colocated_row(tmp_path):
    """The headline's Chrome traces run one instance of each engine's best configuration (a 2-instance
    co-located async row used to be run on all the devices and refused)."""
    import dataclasses

    from asap.studies.headline_output import write_traces
    from asap.workload.slo import parse_slo
    configs = {"sync": EngineConfig("sync", 4, 8192, instances=2),
               "async": EngineConfig("async", 4, 8192, instances=2, attention_workers=4, colocated=True)}
    row = {"devices": 32, **{e: {"config": dataclasses.asdict(c), "max_slo_rate": 2.0, "num_requests": 40}
                             for e, c in configs.items()}}
    write_traces(row, parse_slo("2s+1ms/tok"), "fixed-2k", 40, "deepseek-v3", "cloudmatrix384", tmp_path, 2.0)
    assert (tmp_path / "trace_sync_32.json").stat().st_size > 0
    assert (tmp_path / "trace_async_32.json").stat().st_size > 0


def test_no_requests_is_an_empty_run_of_the_layout_on_every_layout():
    # instances and sync fleets split the requests before simulating; none at all is still a run, not a crash
    layouts = [(dict(engine="sync", attention_tp=8, token_budget=32768, wide_replicas=1, wide_tp=16), 3, 32),
               (dict(engine="sync", attention_tp=16, instances=2), 2, 32),
               (dict(engine="async", attention_tp=4, colocated=True, instances=2), 8, 32),
               (dict(engine="async", attention_tp=1, colocated=True, wide_replicas=4, wide_tp=4), 20, 32)]
    for kw, attention, experts in layouts:
        res = run([], EngineConfig(**kw).spec("deepseek-v3", "cloudmatrix384", 32))
        assert (res.results, res.attention_workers, res.expert_workers) == ([], attention, experts), kw
