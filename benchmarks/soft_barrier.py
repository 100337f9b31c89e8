"""A rejected design, kept to reproduce its figures: a soft step barrier for async replicas (SIMULATED).

On even traffic the co-located async layout loses to sync because its expert batches are small: without a
barrier, replicas drift apart in layer, and an expert batch holds one or two replicas' micro-batches
(`benchmarks/even_floor.py`: aligned by a burst it matches sync). This tries to restore alignment without a
per-layer barrier: a replica that ends its step, with work queued, waits for the replicas whose current
step is predicted to end within ALIGN x its own last step time (at most that long); the first step end that
does not wait starts every waiting replica with it. ALIGN = 0 is the shipped engine. It subclasses the
simulated async engine here and is not part of ASAP.

    python benchmarks/soft_barrier.py --rate 30 --align 0 0.1 0.3 1.0
"""
from __future__ import annotations

import argparse
import importlib

from asap.measure.metrics import summarize
from asap.sim.async_engine import AsyncEngine
from asap.sim.events import Event
from asap.studies.experiments import at_rate
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

simrun = importlib.import_module("asap.sim.run")      # the module (asap.sim exports a function of that name)
ALIGN = 0.0


class ParkTimeout(Event):
    """A waiting replica's wait is over (unless a step end released it first: gen tells)."""
    __slots__ = ("replica", "gen")

    def __init__(self, time, replica, gen):
        self.time, self.replica, self.gen = time, replica, gen

    def handle(self, engine):
        return engine.on_park_timeout(self.replica, self.gen, self.time)


class Aligned(AsyncEngine):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        n = len(self.replicas)
        self.parked = [False] * n
        self.gen = [0] * n
        self.step_start = [0.0] * n

    def kick(self, replica, now):
        if self.parked[replica]:
            return []
        return super().kick(replica, now)

    def start_step(self, rep, now):
        self.step_start[rep.index] = now
        return super().start_step(rep, now)

    def on_park_timeout(self, i, gen, now):
        if not self.parked[i] or self.gen[i] != gen:
            return []
        self.parked[i] = False
        return self.start_step(self.replicas[i], now)

    def _end_step(self, rep, now):
        for req in self.schedulers[rep.index].commit(rep.plan):
            self.finish(req, now)
        rep.depth.end_step(rep.pipe)
        rep.mbs = rep.plan = rep.pipe = None
        i = rep.index
        dur = now - self.step_start[i]
        horizon = now + ALIGN * dur
        # wait for replicas in a step predicted to end within the horizon (overdue ones included)
        waiting_for = [j for j, r in enumerate(self.replicas) if j != i and r.mbs is not None
                       and self.busy_until[j] <= horizon]
        has_work = len(self.schedulers[i]) > 0
        if ALIGN > 0 and waiting_for and has_work:
            self.parked[i] = True
            self.gen[i] += 1
            self.busy_until[i] = 0.0
            self.touch(i)
            return [ParkTimeout(horizon, i, self.gen[i])]
        out = []
        for j, p in enumerate(self.parked):    # a step end that does not park releases the cohort
            if p:
                self.parked[j] = False
                out += self.start_step(self.replicas[j], now)
        return out + self.start_step(rep, now)


def main(argv=None) -> int:
    global ALIGN
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="fixed-4k")
    p.add_argument("--rate", type=float, default=30.0, help="req/s (sync's maximum on fixed 4K: 32.8)")
    p.add_argument("--num-requests", type=int, default=3000)
    p.add_argument("--align", type=float, nargs="+", default=[0.0, 0.1, 0.3, 1.0])
    p.add_argument("--chunk", type=int, default=16384)
    p.add_argument("--max-batch-tokens", type=int, default=65536)
    a = p.parse_args(argv)
    reqs = at_rate(parse_slo("2s+1ms/tok").apply(workload_requests(a.workload, a.num_requests)), a.rate)
    simrun.AsyncEngine = Aligned
    for align in a.align:
        ALIGN = align
        q = simrun.run(reqs, devices=32, engine="async", colocated=True, token_budget=a.chunk, microbatches=2,
                       selector="fullest", max_batch_tokens=a.max_batch_tokens)
        s = summarize(q.results)
        print(f"[SIMULATED] co-located 32 x TP1, {a.chunk // 1024}K, k=2, fullest, {a.workload} at {a.rate:g} req/s, "
              f"ALIGN {align:g}: {s['slo_attainment']:.1%} within SLO, P90 TTFT {s['ttft_p90_ms'] / 1e3:.2f} s, "
              f"mean expert batch {q.stats['mean_expert_batch_tokens'] / 1e3:.1f}K tokens", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
