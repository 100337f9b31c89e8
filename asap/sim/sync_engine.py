"""The synchronous DP-attention + EP baseline (SGLang / vLLM style), simulated.

N ranks; each is an attention replica and holds 1/N of the experts. A forward
step starts on all ranks at once (a rank with nothing queued runs an empty
batch) and one StepDone event ends it. Inside the step every MoE layer does an
all-to-all dispatch and an all-to-all combine that every rank must reach: a
barrier, so the step runs at the pace of the slowest rank at every layer.

With two-batch overlap (default) each rank splits its batch into 2 micro-batches
and interleaves them per layer on two streams:
    compute: A0 A1 M0 M1 | next layer ...      (A attention side, M routed experts)
    comm:    D0 D1 C0 C1 | ...                 (D dispatch, C combine; each a barrier)
The step time comes from this dependency graph, evaluated per rank with numpy.
"""
from __future__ import annotations

import numpy as np

from asap.scheduler.microbatch import split_microbatches
from asap.sim.cost import CostModel
from asap.sim.engine import EngineBase, chunk_work
from asap.sim.events import Kick, StepDone
from asap.sim.experts import ExpertShares


class SyncEngine(EngineBase):
    def __init__(self, cost: CostModel, num_ranks: int, router, token_budget: int, shares: ExpertShares,
                 order: str = "fcfs", max_queue: int = 1024, two_batch_overlap: bool = True,
                 trace_window=None, trace_ranks: int = 8):
        super().__init__(cost, num_ranks, router, token_budget, order, max_queue, trace_window)
        if shares.num_workers != num_ranks:
            raise ValueError(f"sync experts live on the {num_ranks} ranks; shares are for {shares.num_workers}")
        self.num_ranks, self.shares = num_ranks, shares
        self.k = 2 if two_batch_overlap else 1
        hw = cost.hw
        self.disp_copy = cost.seconds_per_copy(num_ranks, True, num_ranks, hw.dispatch_bytes)
        self.comb_copy = cost.seconds_per_copy(num_ranks, True, num_ranks, hw.combine_bytes)
        self.trace_ranks = trace_ranks
        self.running = False
        self.num_steps = 0
        self.busy_s = 0.0          # wall time inside steps
        self.rank_tokens = 0       # tokens prefilled, all ranks
        self.barrier_wait_s = 0.0  # rank-seconds waiting at a dispatch barrier for slower ranks' attention

    def kick(self, replica: int, now: float) -> list:
        if self.running:
            return []
        self.running = True             # a step is about to start
        return [Kick(now, replica)]

    def on_kick(self, replica: int, now: float) -> list:
        return self.start_step(now)

    def start_step(self, now: float) -> list:
        plans = [s.schedule(now) for s in self.schedulers]
        if not any(plans):
            self.running = False
            return []
        duration = self.step_seconds(plans, now)
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
    def step_seconds(self, plans: list[dict[int, int]], now: float = 0.0) -> float:
        cost, N, k, top_k = self.cost, self.num_ranks, self.k, self.model.top_k
        tokens, t_moe, t_dense = np.zeros((k, N)), np.zeros((k, N)), np.zeros((k, N))
        for r, plan in enumerate(plans):
            if not plan:
                continue
            sched = self.schedulers[r]
            starts = {rid: sched.get(rid).num_computed for rid in plan}
            for j, chunks in enumerate(split_microbatches(plan, starts, k)):
                T, P, K = chunk_work(chunks)
                tokens[j, r] = T
                t_moe[j, r] = cost.attention_seconds(True, T, P, K)
                t_dense[j, r] = cost.attention_seconds(False, T, P, K)
        self.rank_tokens += int(tokens.sum())
        total, biggest = tokens.sum(axis=1), tokens.max(axis=1)
        lat = cost.hw.link.latency_s
        trace = self.trace_window is not None and now < self.trace_window[1]
        cfree = np.zeros(N)                         # compute stream free, per rank
        comm = 0.0                                  # comm stream free (collectives: one time for all ranks)
        ready = [np.zeros(N) for _ in range(k)]     # when micro-batch j's input to this layer is ready
        for layer, is_moe in enumerate(self.model.moe_layers):
            t_attn = t_moe if is_moe else t_dense
            a_end = []
            for j in range(k):
                start = np.maximum(cfree, ready[j])
                cfree = start + t_attn[j]
                a_end.append(cfree)
                if trace:
                    self._trace_ranks("attention", f"attn L{layer} mb{j}", now, start, cfree)
            if not is_moe:
                ready = a_end
                continue
            share = self.shares.max_share[cost.moe_index[layer]]
            d_end = []
            for j in range(k):
                slowest = a_end[j].max()
                self.barrier_wait_s += float((slowest - a_end[j]).sum())
                start = max(slowest, comm)
                comm = start + lat + max(biggest[j], total[j] * share) * top_k * self.disp_copy
                d_end.append(comm)
                if trace:
                    self.span("network", 0, f"dispatch L{layer} mb{j}", now + start, now + comm)
            m_end = []
            for j in range(k):
                start = np.maximum(cfree, d_end[j])
                cfree = start + cost.expert_seconds(cost.moe_index[layer], total[j], self.shares)
                m_end.append(cfree)
                if trace:
                    self._trace_ranks("experts", f"experts L{layer} mb{j}", now, start, cfree)
            for j in range(k):
                start = max(m_end[j].max(), comm)
                comm = start + lat + max(biggest[j], total[j] * share) * top_k * self.comb_copy
                ready[j] = np.full(N, comm)
                if trace:
                    self.span("network", 0, f"combine L{layer} mb{j}", now + start, now + comm)
        return float(max(r.max() for r in ready))

    def _trace_ranks(self, kind: str, name: str, now: float, start, end) -> None:
        for r in range(min(self.trace_ranks, self.num_ranks)):
            if end[r] > start[r]:
                self.span("rank", r, name, now + start[r], now + end[r], kind=kind)

    def stats(self) -> dict:
        return {"num_steps": self.num_steps, "busy_s": self.busy_s, "tokens": self.rank_tokens,
                "barrier_wait_rank_s": self.barrier_wait_s}
