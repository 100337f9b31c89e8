"""The asynchronous disaggregated engine (ASAP), simulated.

A attention replicas and E expert workers are separate devices. Each replica
runs its own steps at its own pace: schedule (chunked prefill) -> split into
k micro-batches -> for every layer, each micro-batch runs its attention-side ops
on the replica (one at a time: the replica's compute is one resource), then for
a MoE layer its tokens are dispatched to the experts and come back by combine
while the replica runs another micro-batch. The expert workers take whatever
ready work the selector picks (any replica, one layer per batch, items of the
same layer merged). No barrier spans replicas.

A replica's link carries one message at a time each way (dispatches out, combines
in); the expert workers' own traffic is in their batch time.

Events per micro-batch and MoE layer: AttentionDone, DispatchArrive,
CombineArrive, plus one ExpertDone per expert batch (shared by merged items).

The expert workers are modelled as one pool that runs batches one after
another: every batch is spread over all E workers (top-k of many experts
touches nearly every worker), so a batch's time is its busiest worker's
(asap.sim.cost.CostModel.expert_ops). A batch of micro-batches from different
replicas is the async engine's way to amortise expert weight loads.
"""
from __future__ import annotations

from asap.scheduler.expert_select import WorkInfo
from asap.scheduler.microbatch import AdaptiveDepth, split_microbatches
from asap.sim.cost import CostModel
from asap.sim.engine import EngineBase, chunk_work
from asap.sim.events import AttentionDone, CombineArrive, DispatchArrive, ExpertDone, Kick, PoolWake
from asap.sim.experts import ExpertShares

_INF = float("inf")


class MicroBatch:
    __slots__ = ("replica", "index", "chunks", "num_tokens", "t_moe", "t_dense", "layer", "attn_done",
                 "ready", "ready_at", "deadline", "sent_at", "finished_at")

    def __init__(self, replica, index, chunks, num_tokens, t_moe, t_dense, deadline, now):
        self.replica, self.index, self.chunks, self.num_tokens = replica, index, chunks, num_tokens
        self.t_moe, self.t_dense, self.deadline = t_moe, t_dense, deadline
        self.layer = 0          # next layer to run
        self.attn_done = -1     # last layer whose attention finished
        self.ready, self.ready_at = True, now
        self.sent_at = self.finished_at = 0.0


class Replica:
    __slots__ = ("index", "plan", "mbs", "busy", "kicked", "num_left", "depth", "attn_s", "num_attn",
                 "roundtrip_s", "num_roundtrips", "tx_free", "rx_free")

    def __init__(self, index: int, depth):
        self.index, self.depth = index, depth
        self.plan, self.mbs, self.busy, self.kicked, self.num_left = None, None, False, False, 0
        self.attn_s = self.roundtrip_s = 0.0
        self.num_attn = self.num_roundtrips = 0
        self.tx_free = self.rx_free = 0.0      # the replica's link, each direction: free from this time


class AsyncEngine(EngineBase):
    def __init__(self, cost: CostModel, num_attention: int, router, token_budget: int, shares: ExpertShares,
                 selector, microbatches: "int | str" = 2, order: str = "fcfs", max_queue: int = 1024,
                 trace_window=None, trace_replicas: int = 8):
        super().__init__(cost, num_attention, router, token_budget, order, max_queue, trace_window)
        if microbatches != "adaptive" and not (isinstance(microbatches, int) and microbatches >= 1):
            raise ValueError(f"microbatches must be an int >= 1 or 'adaptive', got {microbatches!r}")
        self.selector, self.shares = selector, shares
        self.total_devices = num_attention + shares.num_workers
        self.fixed_k = None if microbatches == "adaptive" else microbatches
        self.replicas = [Replica(i, AdaptiveDepth() if self.fixed_k is None else None) for i in range(num_attention)]
        hw, E = cost.hw, shares.num_workers
        self.latency = hw.link.latency_s
        self.disp_copy = cost.seconds_per_copy(E, False, self.total_devices, hw.dispatch_bytes) * self.model.top_k
        self.nic_copy = cost.seconds_per_copy(E, False, self.total_devices, hw.combine_bytes)
        self.comb_copy = self.nic_copy * self.model.top_k      # per token
        self.moe = self.model.moe_layers
        self.num_layers = self.model.num_layers
        self.ready: list[WorkInfo] = []
        self.pool_busy = False
        self.wake_at: float | None = None
        self.trace_replicas = trace_replicas
        self.pool_busy_s = 0.0
        self.num_batches = 0
        self.batch_tokens = 0
        self.num_steps = 0

    # ---- attention replicas ----
    def kick(self, replica: int, now: float) -> list:
        rep = self.replicas[replica]
        if rep.mbs is not None or rep.kicked:
            return []
        rep.kicked = True
        return [Kick(now, replica)]

    def on_kick(self, replica: int, now: float) -> list:
        rep = self.replicas[replica]
        rep.kicked = False
        return [] if rep.mbs is not None else self.start_step(rep, now)

    def start_step(self, rep: Replica, now: float) -> list:
        sched = self.schedulers[rep.index]
        plan = sched.schedule(now)
        if not plan:
            rep.mbs = None
            self.busy_until[rep.index] = 0.0
            self.touch(rep.index)
            return []
        k = self.fixed_k or rep.depth.k
        starts = {rid: sched.get(rid).num_computed for rid in plan}
        deadlines = {rid: sched.get(rid).deadline for rid in plan}
        cost, mbs, predicted = self.cost, [], 0.0
        n_moe = sum(self.moe)
        for j, chunks in enumerate(split_microbatches(plan, starts, k)):
            T, P, K = chunk_work(chunks)
            t_moe, t_dense = cost.attention_seconds(True, T, P, K), cost.attention_seconds(False, T, P, K)
            dl = min((deadlines[c.request_id] for c in chunks if deadlines[c.request_id] is not None), default=_INF)
            mbs.append(MicroBatch(rep.index, j, chunks, T, t_moe, t_dense, dl, now))
            predicted += n_moe * t_moe + (self.num_layers - n_moe) * t_dense
        rep.plan, rep.mbs, rep.num_left = plan, mbs, len(mbs)
        self.num_steps += 1
        self.busy_until[rep.index] = now + predicted
        self.touch(rep.index)
        return self.try_compute(rep, now)

    def try_compute(self, rep: Replica, now: float) -> list:
        """Run the next micro-batch's attention if the replica is free. A micro-batch may not pass the
        one before it at a layer: a request split across them reads the KV the earlier piece wrote."""
        if rep.busy or rep.mbs is None:
            return []
        mbs, best = rep.mbs, None
        for mb in mbs:
            if mb.ready and (mb.index == 0 or mbs[mb.index - 1].attn_done >= mb.layer) \
                    and (best is None or mb.ready_at < best.ready_at):
                best = mb
        if best is None:
            return []
        rep.busy, best.ready = True, False
        duration = best.t_moe if self.moe[best.layer] else best.t_dense
        rep.attn_s += duration
        rep.num_attn += 1
        if self.trace_window is not None and rep.index < self.trace_replicas:
            self.span("attention", rep.index, f"attn L{best.layer} mb{best.index}", now, now + duration,
                      tokens=best.num_tokens)
        return [AttentionDone(now + duration, best)]

    def on_attention_done(self, mb: MicroBatch, now: float) -> list:
        rep = self.replicas[mb.replica]
        rep.busy = False
        mb.attn_done = mb.layer
        out: list = []
        if self.moe[mb.layer]:
            mb.sent_at = now
            rep.tx_free = max(now, rep.tx_free) + mb.num_tokens * self.disp_copy
            work = WorkInfo(mb, mb.replica, mb.layer, mb.num_tokens, now, mb.deadline)
            out.append(DispatchArrive(rep.tx_free + self.latency, work))
        else:
            self._advance(rep, mb, now, out)
        out += self.try_compute(rep, now)
        return out

    def on_combine_arrive(self, mb: MicroBatch, now: float) -> list:
        rep = self.replicas[mb.replica]
        rep.roundtrip_s += now - mb.sent_at
        rep.num_roundtrips += 1
        out: list = []
        self._advance(rep, mb, now, out)
        out += self.try_compute(rep, now)
        return out

    def _advance(self, rep: Replica, mb: MicroBatch, now: float, out: list) -> None:
        mb.layer += 1
        if mb.layer < self.num_layers:
            mb.ready, mb.ready_at = True, now
            return
        mb.finished_at = now
        rep.num_left -= 1
        if rep.num_left == 0:
            out += self._end_step(rep, now)

    def _end_step(self, rep: Replica, now: float) -> list:
        done_at = {}
        for mb in rep.mbs:                      # a request's last piece is in its last micro-batch
            for c in mb.chunks:
                done_at[c.request_id] = mb.finished_at
        for req in self.schedulers[rep.index].commit(rep.plan):
            self.finish(req, done_at[req.id])
        if rep.depth is not None and rep.num_attn and rep.num_roundtrips:
            rep.depth.update(rep.attn_s / rep.num_attn, rep.roundtrip_s / rep.num_roundtrips)
        rep.attn_s = rep.roundtrip_s = 0.0
        rep.num_attn = rep.num_roundtrips = 0
        rep.mbs = rep.plan = None
        return self.start_step(rep, now)

    # ---- expert workers ----
    def on_dispatch_arrive(self, work: WorkInfo, now: float) -> list:
        self.ready.append(work)
        return [] if self.pool_busy else self.pool_start(now)

    def on_pool_wake(self, now: float) -> list:
        self.wake_at = None
        return [] if self.pool_busy or not self.ready else self.pool_start(now)

    def pool_start(self, now: float) -> list:
        ready = self.ready
        picked_idx = self.selector.select(ready, now)
        if not picked_idx:
            wait = getattr(self.selector, "wait_until", None)
            if wait is not None and wait > now and (self.wake_at is None or wait < self.wake_at):
                self.wake_at = wait
                return [PoolWake(wait)]
            return []
        if len(picked_idx) == 1:
            picked = [ready.pop(picked_idx[0])]
        else:
            chosen = set(picked_idx)
            picked = [ready[i] for i in picked_idx]
            self.ready = [w for i, w in enumerate(ready) if i not in chosen]
        layer = picked[0].layer
        if any(w.layer != layer for w in picked):
            raise ValueError(f"selector {type(self.selector).__name__} mixed layers in one batch")
        tokens = sum(w.num_tokens for w in picked)
        duration = self.cost.expert_seconds(self.cost.moe_index[layer], tokens, self.shares, self.nic_copy)
        self.pool_busy = True
        self.pool_busy_s += duration
        self.num_batches += 1
        self.batch_tokens += tokens
        if self.trace_window is not None:
            self.span("experts", 0, f"experts L{layer}", now, now + duration, items=len(picked), tokens=tokens,
                      replicas=sorted({w.replica for w in picked}))
        return [ExpertDone(now + duration, picked)]

    def on_expert_done(self, items: list[WorkInfo], now: float) -> list:
        self.pool_busy = False
        lat, per, out = self.latency, self.comb_copy, []
        for w in items:
            rep = self.replicas[w.replica]
            rep.rx_free = max(now, rep.rx_free) + w.num_tokens * per
            out.append(CombineArrive(rep.rx_free + lat, w.key))
        if self.ready:
            out += self.pool_start(now)
        return out

    def stats(self) -> dict:
        return {"num_steps": self.num_steps, "expert_batches": self.num_batches,
                "expert_busy_s": self.pool_busy_s,
                "mean_expert_batch_tokens": self.batch_tokens / self.num_batches if self.num_batches else 0.0}
