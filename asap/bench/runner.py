"""Run requests against a target and collect per-request results.

A `Target` is anything with a `label` and `run(requests) -> list[RequestResult]`
(one result per request, in request order). Three kinds:

- `ReplayTarget(submit)`: replays arrival times in real time. `submit` is an
  async function that returns when the request's first token is out and
  raises on failure. `future_submit(engine.submit)` adapts an in-process
  engine whose `submit(request)` returns a concurrent.futures.Future; a
  blocking call can be adapted the same way through a thread pool:
  `future_submit(lambda r: pool.submit(blocking_fn, r))`.
- `HttpTarget` (asap/bench/http_target.py): an OpenAI-compatible server.
- `SimulatedTarget(simulate)`: wraps the simulator's `simulate(requests)`.

Replay is open-loop: each request is sent at its arrival offset from the
start of the run whether or not earlier ones have finished. The target gets a
copy of the request stamped on the `time.monotonic()` clock (arrival = its
scheduled send time, deadline shifted to match), so engines should read
deadlines against time.monotonic(). TTFT = completion - scheduled send time, or,
when `submit` returns a `FirstToken` (a streaming response), its time - send time;
the completion is then the end-to-end latency.

With `max_concurrency`, at most that many requests are in flight; a request
waits for a free slot and its clock starts when it is sent, as in
`vllm bench serve --max-concurrency`.
"""
from __future__ import annotations

import asyncio
import sys
import dataclasses
import time
import warnings
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from tqdm import tqdm

from asap.measure.metrics import RequestResult, summarize
from asap.scheduler.request import Request
from asap.workload import Workload


@dataclass(frozen=True)
class FirstToken:
    """What a streaming submit returns: when its first token arrived (time.monotonic())."""
    at: float
    output_tokens: int | None = None     # from the response's usage, when it reports one


AsyncSubmit = Callable[[Request], Awaitable["FirstToken | None"]]
LAG_WARNING_S = 0.05   # warn when sends fall this far behind schedule


class Target(Protocol):
    label: str          # printed in reports, e.g. "async", "sync (emulated)", "simulated"

    def run(self, requests: list[Request]) -> list[RequestResult]: ...


async def replay(submit: AsyncSubmit, requests: list[Request], progress: bool = True,
                 timeout: float | None = None, max_concurrency: int | None = None) -> list[RequestResult]:
    """Send each request at its arrival offset, concurrently; results in request order.

    An exception from `submit` (or exceeding `timeout` seconds) makes that
    request a failure with the exception text as its error.
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    if not requests:
        return []
    results: list[RequestResult | None] = [None] * len(requests)
    first = min(r.arrival for r in requests)
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    bar = tqdm(total=len(requests), desc="requests", unit="req", disable=not progress)
    max_lag = 0.0

    async def one(i: int, sent: float) -> None:
        if slots is None:
            await send(i, sent)
        else:
            async with slots:
                await send(i, max(sent, time.monotonic()))

    async def send(i: int, sent: float) -> None:
        req = requests[i]
        stamped = dataclasses.replace(req, arrival=sent, meta=dict(req.meta),
                                      deadline=None if req.deadline is None else sent + req.deadline - req.arrival)
        try:
            got = await asyncio.wait_for(submit(stamped), timeout)
            end = time.monotonic() - sent
            if isinstance(got, FirstToken):
                results[i] = RequestResult.of(req, got.at - sent, e2el=end, output_tokens=got.output_tokens)
            else:
                results[i] = RequestResult.of(req, end)
        except Exception as e:  # any failure of the target is a failed request
            timed_out = timeout is not None and isinstance(e, asyncio.TimeoutError)
            error = f"timeout after {timeout} s" if timed_out else f"{type(e).__name__}: {e}"
            results[i] = RequestResult.of(req, None, error)
        bar.update(1)

    start = time.monotonic()
    tasks = []
    try:
        for i in order:
            sent = start + requests[i].arrival - first
            delay = sent - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            max_lag = max(max_lag, time.monotonic() - sent)
            tasks.append(asyncio.create_task(one(i, sent)))
        await asyncio.gather(*tasks)
    finally:
        bar.close()
    if max_lag > LAG_WARNING_S:
        warnings.warn(f"replay fell behind schedule by up to {max_lag * 1000:.0f} ms; TTFTs include this lag")
    return results


def future_submit(submit: Callable[[Request], Future]) -> AsyncSubmit:
    """Adapt `submit(request) -> concurrent.futures.Future` (the future's exception = failure)."""
    async def run_one(req: Request) -> None:
        await asyncio.wrap_future(submit(req))
        return None
    return run_one


@dataclass(frozen=True)
class ReplayTarget:
    submit: AsyncSubmit
    label: str = "engine"
    progress: bool = True
    timeout: float | None = None
    max_concurrency: int | None = None

    def run(self, requests: list[Request]) -> list[RequestResult]:
        return asyncio.run(replay(self.submit, requests, self.progress, self.timeout, self.max_concurrency))


@dataclass(frozen=True)
class SimulatedTarget:
    """Wraps `simulate(requests) -> list[RequestResult]`; checks one result per request."""
    simulate: Callable[[list[Request]], list[RequestResult]]
    label: str = "simulated"

    def run(self, requests: list[Request]) -> list[RequestResult]:
        results = self.simulate(requests)
        by_id = {r.request_id: r for r in results}
        if len(results) != len(requests) or any(req.id not in by_id for req in requests):
            raise ValueError(f"simulator must return one result per request id; "
                             f"got {len(results)} results for {len(requests)} requests")
        return [by_id[req.id] for req in requests]

def rate_measure(target: Target, workload, slo: float | None = None) -> Callable[[float], dict]:
    """measure(rate) -> summary: rebuild `workload` (an asap.workload.Workload) at that rate and run it."""
    def measure(rate: float) -> dict:
        requests = dataclasses.replace(workload, rate=rate).build()
        return summarize(target.run(requests), slo=slo)
    return measure


@dataclass
class Run:
    """One target on one workload at one rate."""
    label: str
    rate: float | None
    results: list[RequestResult]
    summary: dict
    workers: dict
    spans: list
    wall_s: float


def measure(target, workload: Workload) -> Run:
    requests = workload.build()
    t0 = time.monotonic()
    results = target.run(requests)
    wall = time.monotonic() - t0
    if sorted(r.request_id for r in results) != [r.id for r in requests]:
        raise RuntimeError(f"{target.label}: {len(results)} results for {len(requests)} requests")
    workers = target.workers() if hasattr(target, "workers") else {}
    spans = target.spans() if hasattr(target, "spans") else []
    run = Run(target.label, workload.rate, results, summarize(results), workers, spans, wall)
    att = run.summary.get("slo_attainment")
    print(f"[bench] {target.label}: {len(results)} requests" + (f" at {workload.rate:g} req/s" if workload.rate else "")
          + (f", SLO attainment {att:.3f}" if att is not None else "")
          + (f", TTFT p90 {p90:.0f} ms" if (p90 := run.summary["ttft_p90_ms"]) is not None else "")
          + f", {run.summary['num_failed']} failed ({wall:.0f} s)", file=sys.stderr, flush=True)
    if run.summary["num_failed"]:
        print(f"[bench] {target.label}: failures: {failure_reasons(results)}", file=sys.stderr, flush=True)
    return run


def failure_reasons(results: list[RequestResult], most: int = 3) -> str:
    """The commonest failure reasons with their counts, e.g. "HTTP 404: model 'x' not found (3x)"."""
    counts = Counter(r.error or "no first token" for r in results if not r.ok)
    return "; ".join(f"{e} ({n}x)" for e, n in counts.most_common(most)) + \
        (f"; and {len(counts) - most} other reasons" if len(counts) > most else "")
