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
As in the runtime's all-to-all exchange (asap.workers.exchange.AllToAll), a rank
serves its shard of (L, i) once every rank's dispatch is in: at the latest when
it waits for (L, i)'s combine, earlier (eagerly, in order) if the dispatch is
complete by the time its compute stream is free.
"""
from __future__ import annotations

import numpy as np

from asap.pipeline.step import Attend, Dispatch, StepPipeline, Wait
from asap.scheduler.microbatch import split_microbatches
from asap.scheduler.prefix_cache import PrefixCache, PrefixCachedScheduler, cache_stats
from asap.sim.cost import CostModel
from asap.sim.engine import EngineBase, chunk_work
from asap.sim.events import Kick, StepDone
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
        moe = self.model.moe_layers
        cfree = np.zeros(N)                         # compute stream free, per rank
        comm = 0.0                                  # comm stream free (collectives: one time for all ranks)
        ready = [np.zeros(N) for _ in range(k)]     # when micro-batch j's input to its next layer is ready
        a_end: list = [None] * k
        keys: list[dict] = []                       # all-to-alls in dispatch order
        combined = 0                                # keys[:combined] have their combine scheduled
        pipe = StepPipeline(k, moe)
        while True:
            a = pipe.next()
            if isinstance(a, Attend):
                j, layer = a.mb, a.layer
                start = np.maximum(cfree, ready[j])
                cfree = start + (t_moe if moe[layer] else t_dense)[j]
                a_end[j] = ready[j] = cfree
                if trace:
                    self._trace_ranks("attention", f"attn L{layer} mb{j}", now, start, cfree)
                pipe.attended(j, layer)
            elif isinstance(a, Dispatch):
                j, layer = a.mb, a.layer
                share = self.shares.max_share[cost.moe_index[layer]]
                slowest = a_end[j].max()
                self.barrier_wait_s += float((slowest - a_end[j]).sum())
                start = max(slowest, comm)
                comm = start + lat + max(biggest[j], total[j] * share) * top_k * self.disp_copy
                keys.append(dict(layer=layer, mb=j, share=share, dispatched=comm, served=np.full(N, np.nan)))
                if trace:
                    self.span("network", 0, f"dispatch L{layer} mb{j}", now + start, now + comm)
                pipe.dispatched(j, layer, start)
            elif isinstance(a, Wait):
                j, layer = a.mb, a.layer
                must = next(i for i, key in enumerate(keys) if (key["layer"], key["mb"]) == (layer, j))
                cfree = self._serve(keys, must, cfree, total, -np.inf, now, trace)      # up to (L, j): all ranks
                comm, combined = self._combine(keys, combined, comm, biggest, total, now, trace)
                back = keys[must]["combined"]
                # While (L, j)'s combine is on its way, a rank serves later all-to-alls whose dispatch is in.
                cfree = self._serve(keys, must, cfree, total, back, now, trace)
                comm, combined = self._combine(keys, combined, comm, biggest, total, now, trace)
                ready[j] = np.full(N, back)
                pipe.combined(j, layer, back)
            else:
                pipe.finish()
                return float(max(max(r.max() for r in ready), cfree.max()))

    def _serve(self, keys: list[dict], must: int, cfree, total, until: float, now: float, trace: bool):
        """Each rank runs its expert shard for every all-to-all up to keys[must] it has not served, then,
        in order, for later ones whose dispatch completed by `until` (what AllToAll.combine does while
        it waits for a combine)."""
        cost, prev_done = self.cost, np.ones(len(cfree), dtype=bool)
        for i, key in enumerate(keys):
            todo = np.isnan(key["served"])
            if i > must:
                todo &= prev_done & (key["dispatched"] <= until)
            if todo.any():
                start = np.maximum(cfree, key["dispatched"])
                end = start + cost.expert_seconds(cost.moe_index[key["layer"]], float(total[key["mb"]]), self.shares)
                cfree = np.where(todo, end, cfree)
                key["served"] = np.where(todo, end, key["served"])
                if trace:
                    self._trace_ranks("experts", f"experts L{key['layer']} mb{key['mb']}", now,
                                      np.where(todo, start, 0.0), np.where(todo, end, 0.0))
            prev_done = ~np.isnan(key["served"])
        return cfree

    def _combine(self, keys: list[dict], combined: int, comm: float, biggest, total, now: float, trace: bool):
        """Put the combine of every all-to-all that all ranks have served on the comm stream, in order."""
        lat, top_k = self.cost.hw.link.latency_s, self.model.top_k
        while combined < len(keys) and not np.isnan(keys[combined]["served"]).any():
            key = keys[combined]
            start = max(float(key["served"].max()), comm)
            comm = start + lat + max(biggest[key["mb"]], total[key["mb"]] * key["share"]) * top_k * self.comb_copy
            key["combined"] = comm
            combined += 1
            if trace:
                self.span("network", 0, f"combine L{key['layer']} mb{key['mb']}", now + start, now + comm)
        return comm, combined

    def _trace_ranks(self, kind: str, name: str, now: float, start, end) -> None:
        for r in range(min(self.trace_ranks, self.num_ranks)):
            if end[r] > start[r]:
                self.span("rank", r, name, now + start[r], now + end[r], kind=kind)

    def stats(self) -> dict:
        out = {"num_steps": self.num_steps, "busy_s": self.busy_s, "tokens": self.rank_tokens,
               "barrier_wait_rank_s": self.barrier_wait_s}
        prefix = cache_stats(self.schedulers)
        return out if prefix is None else {**out, "prefix_cache": prefix}
