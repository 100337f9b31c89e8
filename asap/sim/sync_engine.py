"""The synchronous DP-attention + EP baseline (SGLang / vLLM style), simulated.

N ranks; each is an attention replica and holds 1/N of the experts. A forward
step starts on all ranks at once (a rank with nothing queued runs an empty
batch) and one StepDone event ends it. Inside the step every MoE layer does an
all-to-all dispatch and an all-to-all combine that every rank must reach: a
barrier, so the step runs at the pace of the slowest rank at every layer.

With two-batch overlap (default) each rank splits its batch into 2 micro-batches.
The order is the step pipeline's (asap.pipeline.step, the object the runtime's
rank loop drives), played for all ranks at once with numpy, on two streams:
    compute: A0 A1 M0 M1 A0' ...    (A attention side, M this rank's expert shard)
    comm:    D0 D1 C0 C1 D0' ...    (D dispatch, C combine; each a collective over all ranks)
The all-to-alls go through a simulated exchange (asap.sim.exchange.SimAllToAll),
which serves by the runtime's rule (asap.pipeline.exchange.num_to_serve, also
what asap.workers.exchange.AllToAll runs): a rank serves its shard of (L, i)
once every rank's dispatch is in, at the latest when it waits for (L, i)'s
combine, earlier (in order) if the dispatch is in while that combine is on its way.
"""
from __future__ import annotations

import numpy as np

from asap.pipeline.plan import plan_step
from asap.pipeline.step import StepPipeline, drive
from asap.scheduler.prefix_cache import PrefixCache, PrefixCachedScheduler, cache_stats
from asap.sim.cost import CostModel
from asap.sim.engine import EngineBase
from asap.sim.events import Kick, StepDone
from asap.sim.exchange import SimAllToAll
from asap.sim.experts import ExpertShares


class SyncEngine(EngineBase):
    def __init__(self, cost: CostModel, num_ranks: int, router, token_budget: int, shares: ExpertShares,
                 order: str = "fcfs", max_queue: int = 1024, two_batch_overlap: bool = True,
                 trace_window=None, trace_ranks: int = 8, prefix_cache_blocks: int | None = None):
        super().__init__(cost, num_ranks, router, token_budget, order, max_queue, trace_window)
        if prefix_cache_blocks is not None:     # one cache per DP group, the same policy as async's replicas
            self.schedulers = [PrefixCachedScheduler.like(s, PrefixCache(prefix_cache_blocks)) for s in self.schedulers]
        if shares.num_workers != num_ranks:
            raise ValueError(f"sync experts live on the {num_ranks} ranks; shares are for {shares.num_workers}")
        self.num_ranks, self.shares = num_ranks, shares
        self.k = 2 if two_batch_overlap else 1
        hw = cost.hw
        self.exchange = SimAllToAll(cost, shares, num_ranks,
                                    cost.seconds_per_copy(num_ranks, True, num_ranks, hw.dispatch_bytes),
                                    cost.seconds_per_copy(num_ranks, True, num_ranks, hw.combine_bytes), self)
        self.trace_ranks = trace_ranks
        self.running = False
        self.num_steps = 0
        self.busy_s = 0.0          # wall time inside steps
        self.rank_tokens = 0       # tokens prefilled, all ranks

    def kick(self, replica: int, now: float) -> list:
        if self.running:
            return []
        self.running = True             # a step is about to start
        return [Kick(now, replica)]

    def on_kick(self, replica: int, now: float) -> list:
        return self.start_step(now)

    def start_step(self, now: float) -> list:
        steps = [plan_step(s, now, self.k) for s in self.schedulers]
        plans = [step.schedule for step in steps]
        if not any(plans):
            self.running = False
            return []
        duration = self.step_seconds(steps, now)
        self.running = True
        self.num_steps += 1
        self.busy_s += duration
        for i in range(self.num_ranks):
            self.busy_until[i] = now + duration
            self.touch(i)
        return [StepDone(now + duration, plans)]

    def on_step_done(self, ev: StepDone) -> list:
        now = ev.time
        for i, plan in enumerate(ev.plans):
            if plan:
                for req in self.schedulers[i].commit(plan):
                    self.finish(req, now)
                self.touch(i)
        self.running = False
        return self.start_step(now)

    # ---- one lock-step forward ----
    def step_seconds(self, steps: list, now: float = 0.0) -> float:
        """How long one lock-step forward of every rank's planned step (asap.pipeline.plan.StepPlan) takes."""
        cost, N, k = self.cost, self.num_ranks, self.k
        tokens, t_moe, t_dense = np.zeros((k, N)), np.zeros((k, N)), np.zeros((k, N))
        for r, step in enumerate(steps):
            for p in step.microbatches:
                j, T, P, K = p.index, p.num_tokens, p.pairs, p.context
                tokens[j, r] = T
                t_moe[j, r] = cost.attention_seconds(True, T, P, K)
                t_dense[j, r] = cost.attention_seconds(False, T, P, K)
        self.rank_tokens += int(tokens.sum())
        trace = self.trace_window is not None and now < self.trace_window[1]
        self.exchange.begin_step(tokens, now, trace)
        lock = _LockStep(self, t_moe, t_dense, now, trace)
        drive(StepPipeline(k, self.model.moe_layers), lock)
        return float(max(max(r.max() for r in lock.ready), self.exchange.compute.max()))

    def _trace_ranks(self, kind: str, name: str, now: float, start, end) -> None:
        for r in range(min(self.trace_ranks, self.num_ranks)):
            if end[r] > start[r]:
                self.span("rank", r, name, now + start[r], now + end[r], kind=kind)

    def stats(self) -> dict:
        out = {"num_steps": self.num_steps, "busy_s": self.busy_s, "tokens": self.rank_tokens,
               "barrier_wait_rank_s": self.exchange.barrier_wait_s}
        prefix = cache_stats(self.schedulers)
        return out if prefix is None else {**out, "prefix_cache": prefix}


class _LockStep:
    """The driver (asap.pipeline.step.StepDriver) of one lock-step forward, every rank at once: attention
    on each rank's compute stream, the all-to-alls through the engine's SimAllToAll. Times from the step's
    start, per rank."""

    def __init__(self, eng: SyncEngine, t_moe, t_dense, now: float, trace: bool):
        self.eng, self.ex, self.moe = eng, eng.exchange, eng.model.moe_layers
        self.t_moe, self.t_dense, self.now, self.trace = t_moe, t_dense, now, trace
        N = eng.num_ranks
        self.ready = [np.zeros(N) for _ in range(eng.k)]    # when micro-batch j's input to its next layer is in
        self.a_end: list = [None] * eng.k

    def attend(self, j: int, layer: int) -> float:
        ex = self.ex
        start = np.maximum(ex.compute, self.ready[j])
        ex.compute = start + (self.t_moe if self.moe[layer] else self.t_dense)[j]
        self.a_end[j] = self.ready[j] = ex.compute
        if self.trace:
            self.eng._trace_ranks("attention", f"attn L{layer} mb{j}", self.now, start, ex.compute)
        return 0.0

    def dispatch(self, j: int, layer: int) -> float:
        a_end = self.a_end[j]
        self.ex.dispatch(j, layer, a_end, float("inf"), float(a_end.max()))
        return float(a_end.max())

    def wait(self, j: int, layer: int) -> float:
        self.ex.combine(j, layer, None)
        back = self.ex.arrival(j, layer)
        self.ready[j] = np.full(self.eng.num_ranks, back)
        return back
