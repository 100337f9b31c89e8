"""Promises of asap.bench.runner: real-time open-loop replay, failures, adapters."""
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from asap.bench import RequestResult, ReplayTarget, SimulatedTarget, find_max_rate, future_submit, rate_measure, replay
from asap.measure.metrics import summarize
from asap.scheduler.request import Request
from asap.workload import Constant, Fixed, Workload

SLACK = 0.1    # seconds of scheduling jitter tolerated on a shared machine


def reqs(arrivals, deadline_s=None):
    return [Request(i, 10, arrival=a, deadline=None if deadline_s is None else a + deadline_s)
            for i, a in enumerate(arrivals)]


def test_replay_sends_on_schedule_and_measures_ttft():
    seen = {}

    async def submit(req):
        seen[req.id] = (time.monotonic(), req)
        await asyncio.sleep(0.05)

    start = time.monotonic()
    results = asyncio.run(replay(submit, reqs([0.0, 0.1, 0.2], deadline_s=1.0), progress=False))
    for i, a in enumerate([0.0, 0.1, 0.2]):
        sent_at, stamped = seen[i]
        assert sent_at - start == pytest.approx(a, abs=SLACK)
        # the target sees arrival and deadline on the time.monotonic clock
        assert stamped.arrival == pytest.approx(sent_at, abs=SLACK) and stamped.deadline == stamped.arrival + 1.0
        assert 0.05 <= results[i].ttft < 0.05 + SLACK
        assert results[i].arrival == a and results[i].deadline_s == pytest.approx(1.0)


def test_replay_is_concurrent_and_keeps_request_order():
    async def submit(req):
        await asyncio.sleep(0.2)

    start = time.monotonic()
    results = asyncio.run(replay(submit, reqs([0.0] * 20 + [0.05, 0.01]), progress=False))
    assert time.monotonic() - start < 0.2 + 0.05 + 2 * SLACK
    assert [r.request_id for r in results] == list(range(22))
    assert all(r.ok for r in results)


def test_exceptions_and_timeouts_become_failures():
    async def submit(req):
        if req.id == 1:
            raise RuntimeError("replica 3 died")
        await asyncio.sleep(1.0 if req.id == 2 else 0.0)

    results = asyncio.run(replay(submit, reqs([0, 0, 0]), progress=False, timeout=0.1))
    assert results[0].ok
    assert results[1].error == "RuntimeError: replica 3 died" and results[1].ttft is None
    assert "timeout" in results[2].error
    s = summarize(results, slo=10.0)
    assert s["num_failed"] == 2 and s["slo_attainment"] == pytest.approx(1 / 3)


def test_future_adapter_for_in_process_engine():
    class Engine:                      # submit(request) -> concurrent.futures.Future, like the engines
        def __init__(self):
            self.pool = ThreadPoolExecutor(4)

        def work(self, req):
            time.sleep(0.03)
            if req.num_tokens > 100:
                raise ValueError("prompt too long")

        def submit(self, req):
            return self.pool.submit(self.work, req)

    engine = Engine()
    requests = reqs([0.0, 0.0]) + [Request(2, 500, arrival=0.0)]
    results = ReplayTarget(future_submit(engine.submit), label="fake", progress=False).run(requests)
    engine.pool.shutdown()
    assert results[0].ok and results[0].ttft >= 0.03
    assert results[2].error == "ValueError: prompt too long"


def test_simulated_target_reorders_and_checks_results():
    requests = reqs([0, 1, 2])
    target = SimulatedTarget(lambda rs: [RequestResult.of(r, 0.1) for r in reversed(rs)])
    assert [r.request_id for r in target.run(requests)] == [0, 1, 2] and target.label == "simulated"
    with pytest.raises(ValueError, match="one result per request"):
        SimulatedTarget(lambda rs: [RequestResult.of(rs[0], 0.1)]).run(requests)


def test_rate_measure_composes_with_rate_search():
    # a fake system that keeps up (TTFT 0.1 s) while requests are >= 0.1 s apart, else drowns
    def simulate(rs):
        gap = rs[1].arrival - rs[0].arrival
        return [RequestResult.of(r, 0.1 if gap >= 0.1 - 1e-12 else 5.0) for r in rs]

    workload = Workload(arrivals=Constant(1.0), lengths=Fixed(64), num_requests=20, with_prompts=False)
    out = find_max_rate(rate_measure(SimulatedTarget(simulate), workload, slo=1.0), lo=1.0, tol=0.01)
    assert out["max_slo_rate"] == pytest.approx(10.0, rel=0.01) and out["max_slo_rate"] <= 10.0
