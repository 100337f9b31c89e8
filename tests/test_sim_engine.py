"""The event loop and the two simulated engines: ordering, the sync barrier, conservation,
and that the policy objects passed in are the ones the simulator calls."""
import numpy as np
import pytest

from asap.bench.runner import SimulatedTarget
from asap.scheduler.expert_select import OldestFirst, WorkInfo
from asap.scheduler.request import Request
from asap.scheduler.router import RoundRobinRouter
from asap.sim.events import Event
from asap.sim.run import build_engine, run, simulate
from asap.sim.spec import EngineSpec
from asap.sim.simulator import Simulator

SMALL = dict(model_cfg="small-deepseek-v3", hardware="h800")


class Tick(Event):
    __slots__ = ("name", "then")

    def __init__(self, time, name, then=()):
        self.time, self.name, self.then = time, name, then

    def handle(self, engine):
        engine.append((self.time, self.name))
        return list(self.then)


def test_events_run_in_time_then_sequence_order():
    seen = []
    sim = Simulator(seen)
    sim.schedule(Tick(2.0, "late"))
    sim.schedule(Tick(1.0, "a", then=[Tick(1.0, "caused-at-same-time"), Tick(1.5, "b")]))
    sim.schedule(Tick(1.0, "second-at-1"))
    sim.schedule(Tick(0.5, "first"))
    sim.run()
    assert seen == [(0.5, "first"), (1.0, "a"), (1.0, "second-at-1"), (1.0, "caused-at-same-time"),
                    (1.5, "b"), (2.0, "late")]
    assert sim.num_events == 6 and sim.now == 2.0


def test_an_event_may_not_cause_one_in_the_past():
    sim = Simulator([])
    sim.schedule(Tick(1.0, "x", then=[Tick(0.5, "past")]))
    with pytest.raises(RuntimeError, match="past"):
        sim.run()
    with pytest.raises(ValueError):
        sim.schedule(Tick(0.1, "before now"))


def test_sync_barrier_holds_the_short_request_back_and_async_does_not():
    long, short = Request(0, 60000), Request(1, 1000)
    kw = dict(SMALL, token_budget=65536, router="round-robin")
    sync = {r.request_id: r.ttft for r in simulate([long, short], "sync", devices=2, **kw)}
    asyn = {r.request_id: r.ttft for r in simulate([long, short], "async", devices=4, attention_workers=2, **kw)}
    # sync: both prompts run in one lock-step forward whose length is set by the long prompt
    assert sync[1] >= sync[0] * 0.999
    # async: the short prompt's replica runs at its own pace
    assert asyn[1] < 0.2 * asyn[0]
    assert asyn[1] < 0.2 * sync[0]


@pytest.mark.parametrize("engine,extra", [("sync", dict(devices=2, attention_tp=2)),
                                          ("async", dict(devices=4, attention_workers=1))])
def test_a_preemptive_order_lets_a_short_prompt_pass_a_started_long_one(engine, extra):
    """One replica / DP group, 8K chunks: a 60K prompt starts, a 1K one arrives during its first chunk. FCFS
    finishes the long one first; srpt runs the short one at the next chunk and the long one after it."""
    long, short = Request(0, 60000), Request(1, 1000, arrival=0.001)
    kw = dict(SMALL, token_budget=8192, router="round-robin", **extra)
    fcfs = {r.request_id: r.ttft for r in simulate([long, short], engine, **kw)}
    srpt = {r.request_id: r.ttft for r in simulate([long, short], engine, order="srpt", **kw)}
    assert fcfs[1] > fcfs[0] * 0.9
    assert srpt[1] < 0.3 * srpt[0]
    assert srpt[0] == pytest.approx(fcfs[0], rel=0.1)     # the long one loses about the short one's chunk


def random_requests(n=60, seed=0, rate=40.0):
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    lengths = rng.integers(100, 30000, n)
    return [Request(i, int(L), float(t), deadline=float(t) + 5.0) for i, (L, t) in enumerate(zip(lengths, times))]


@pytest.mark.parametrize("engine,extra", [
    ("sync", {}), ("sync", {"two_batch_overlap": False}),
    ("async", {}), ("async", {"microbatches": "adaptive"}), ("async", {"window_s": 0.002}),
    ("async", {"selector": "largest", "order": "sjf"}), ("async", {"order": "srpt"}),
    ("sync", {"order": "edf-preempt"}),
])
def test_every_request_finishes_exactly_once(engine, extra):
    reqs = random_requests()
    res = run(reqs, engine, devices=8, token_budget=8192, zipf=0.5, **SMALL, **extra)
    assert [r.request_id for r in res.results] == [r.id for r in reqs]
    assert all(r.ok and r.ttft > 0 for r in res.results)
    assert all(r.deadline_s == pytest.approx(5.0) for r in res.results)
    assert all(q.num_computed == 0 for q in reqs)          # the caller's requests are not modified


def test_overflow_is_an_error_result_not_a_lost_request():
    reqs = [Request(i, 20000, 0.0) for i in range(40)]
    for engine in ("sync", "async"):
        res = run(reqs, engine, devices=4, attention_workers=2 if engine == "async" else None, max_queue=3, **SMALL)
        assert sorted(r.request_id for r in res.results) == list(range(40))
        failed = [r for r in res.results if not r.ok]
        assert failed and all("QueueFull" in r.error for r in failed)


def test_runs_are_deterministic():
    reqs = random_requests(seed=3)
    a = [r.ttft for r in simulate(reqs, "async", devices=8, **SMALL)]
    b = [r.ttft for r in simulate(reqs, "async", devices=8, **SMALL)]
    assert a == b


class SpyRouter(RoundRobinRouter):
    def __init__(self):
        super().__init__()
        self.calls = []

    def route(self, req, loads, now):
        choice = super().route(req, loads, now)
        self.calls.append((req.id, len(loads), choice))
        return choice


class SpySelector(OldestFirst):
    def __init__(self):
        super().__init__(max_batch_tokens=1 << 20)
        self.num_calls = 0

    def select(self, ready, now):
        self.num_calls += 1
        return super().select(ready, now)


def test_the_policy_objects_passed_in_are_the_ones_called():
    reqs = random_requests(20)
    router, selector = SpyRouter(), SpySelector()
    run(reqs, "async", devices=8, attention_workers=3, router=router, selector=selector, **SMALL)
    assert [c[0] for c in router.calls] == [r.id for r in sorted(reqs, key=lambda r: r.arrival)]
    assert all(n == 3 for _, n, _ in router.calls)                 # one load per attention replica
    assert [c[2] for c in router.calls] == [i % 3 for i in range(20)]
    assert selector.num_calls > 0
    sync_router = SpyRouter()
    run(reqs, "sync", devices=8, router=sync_router, **SMALL)
    assert len(sync_router.calls) == 20 and all(n == 8 for _, n, _ in sync_router.calls)


def test_a_selector_mixing_layers_is_rejected():
    class Bad:
        def select(self, ready, now):
            return list(range(len(ready)))
    engine = build_engine(EngineSpec("async", SMALL["model_cfg"], SMALL["hardware"], devices=8, attention_workers=4,
                                     selector=Bad()))
    for work in (WorkInfo("a", 0, 1, 100, 0.0), WorkInfo("b", 1, 2, 100, 0.0)):
        engine.ready.push(work)
    with pytest.raises(ValueError, match="mixed layers"):
        engine.pool_start(0.0)


def test_simulate_plugs_into_the_benchmark_target():
    target = SimulatedTarget(lambda reqs: simulate(reqs, "sync", devices=4, **SMALL))
    reqs = random_requests(10)
    out = target.run(reqs)
    assert [r.request_id for r in out] == [r.id for r in reqs]


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match="engine"):
        run([Request(0, 10)], "pipelined", **SMALL)
    with pytest.raises(ValueError, match="expert worker"):
        run([Request(0, 10)], "async", devices=4, attention_workers=4, **SMALL)
    with pytest.raises(ValueError, match="GB"):
        run([Request(0, 10)], "sync", "deepseek-v3", "h800", devices=4)
    with pytest.raises(ValueError, match="microbatches"):
        run([Request(0, 10)], "async", devices=4, microbatches=0, **SMALL)
    with pytest.raises(ValueError, match="unique"):
        run([Request(0, 10), Request(0, 20)], "sync", devices=2, **SMALL)


def test_one_engine_spec_whichever_way_it_is_given():
    """run(requests, EngineSpec(...)) and run(requests, **the same settings) are one engine: the same TTFTs;
    a bad setting is refused when the spec is made, naming it, before anything is simulated."""
    reqs = [Request(i, 300 + 100 * i, arrival=0.01 * i) for i in range(6)]
    kw = dict(devices=8, attention_tp=2, token_budget=2048, router="round-robin")
    spec = EngineSpec("sync", SMALL["model_cfg"], SMALL["hardware"], **kw)
    assert [r.ttft for r in run(reqs, spec).results] == [r.ttft for r in run(reqs, "sync", **SMALL, **kw).results]
    with pytest.raises(ValueError, match="attention_tp"):
        EngineSpec("sync", attention_tp=0)
    with pytest.raises(ValueError, match="instances=3"):
        run(reqs, "sync", **SMALL, devices=8, instances=3)
    with pytest.raises(TypeError, match="token_budjet"):
        run(reqs, "sync", **SMALL, token_budjet=10)
