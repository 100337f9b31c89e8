"""The asynchronous disaggregated engine (ASAP), simulated.

A attention replicas and E expert workers are separate devices. Each replica
runs its own steps at its own pace: schedule (chunked prefill) -> split into
k micro-batches -> drive the step pipeline (asap.pipeline.step, the very object
the runtime's attention loop drives): attention of (micro-batch, layer) on the
replica (one at a time: the replica's compute is one resource), dispatch on a
MoE layer, wait for the combine, finish. Depth (fixed or adaptive) and the
expert batch cap are asap.pipeline.depth's. The expert workers take whatever
ready work the selector picks (any replica, one layer per batch, items of the
same layer merged). No barrier spans replicas.

A replica's link is the simulated exchange (asap.sim.exchange); the expert
workers' own traffic is in their batch time. As in the runtime, a step's
requests finish when the step does.

Events per micro-batch and MoE layer: AttentionDone, DispatchArrive,
CombineArrive, plus one ExpertDone per expert batch (shared by merged items).

The expert workers are modelled as one pool that runs batches one after
another: every batch is spread over all E workers (top-k of many experts
touches nearly every worker), so a batch's time is its busiest worker's
(asap.sim.cost.CostModel.expert_ops). A batch of micro-batches from different
replicas is the async engine's way to amortise expert weight loads.

Co-located (colocated=True): every device hosts a replica's attention (1/attention_tp of one) and an expert
shard (1/N of the experts), so the pool is all N devices and shares them with attention. Expert work has
priority on a device (a high-priority stream: its kernels are scheduled ahead of attention's at block
granularity), so an attention op stretches by the pool time that overlaps it: it ends at the first t with
t - start - (pool busy time in [start, t]) = its work. Every device pauses for a whole pool batch, the
busiest device's time: conservative, since a device with a lighter share could resume sooner. Copies to
the device's own shard are free (the link model's `local`), as in sync EP; each direction of a replica's
link also carries its shard's share of the other replicas' traffic (conservative: the pool's batch time
counts its combines too).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from asap.pipeline.depth import StepDepth
from asap.pipeline.plan import plan_step
from asap.pipeline.step import StepPipeline, drive
from asap.scheduler.expert_select import WorkInfo, ready_queue
from asap.scheduler.prefix_cache import PrefixCache, PrefixCachedScheduler, cache_stats
from asap.sim.cost import CostModel
from asap.sim.engine import EngineBase
from asap.sim.events import AttentionDone, ExpertDone, Kick, PoolWake
from asap.sim.exchange import SimExchange
from asap.sim.experts import ExpertShares


class MicroBatch:
    __slots__ = ("replica", "index", "chunks", "num_tokens", "t_moe", "t_dense", "layer", "deadline", "a_start",
                 "stretch")

    def __init__(self, replica, index, chunks, num_tokens, t_moe, t_dense, deadline):
        self.replica, self.index, self.chunks, self.num_tokens = replica, index, chunks, num_tokens
        self.t_moe, self.t_dense, self.deadline = t_moe, t_dense, deadline
        self.layer = 0          # the layer its attention runs (or last ran)
        self.a_start = 0.0      # when that attention started
        self.stretch = None     # co-located: that attention's Stretch (PoolTime.stretch), to resume


class Replica:
    """One attention replica, and the driver of its steps (asap.pipeline.step.StepDriver): an attention
    is an AttentionDone event, a combine a CombineArrive; both resume `AsyncEngine.drive`."""
    __slots__ = ("index", "plan", "mbs", "pipe", "busy", "kicked", "depth", "exchange", "engine", "now", "out",
                 "attending")

    def __init__(self, index: int, depth: StepDepth, exchange: SimExchange, engine: "AsyncEngine"):
        self.index, self.depth, self.exchange, self.engine = index, depth, exchange, engine
        self.plan, self.mbs, self.pipe, self.busy, self.kicked = None, None, None, False, False
        self.now, self.out = 0.0, []          # the event being handled, and the events it causes
        self.attending: MicroBatch | None = None    # the micro-batch whose attention runs (while busy)

    def attend(self, mb: int, layer: int) -> None:
        b, eng, now = self.mbs[mb], self.engine, self.now
        b.layer, b.a_start, self.attending = layer, now, b
        duration = b.t_moe if eng.moe[layer] else b.t_dense
        self.busy = True
        if eng.trace_window is not None and self.index < eng.trace_replicas and not eng.colocated:
            eng.span("attention", self.index, f"attn L{layer} mb{mb}", now, now + duration, tokens=b.num_tokens)
        if eng.colocated:
            b.stretch = eng.pool_time.stretch(now, duration)
            end = b.stretch.end
        else:
            end = now + duration
        self.out.append(AttentionDone(end, b))
        return None                         # on_attention_done reports it

    def dispatch(self, mb: int, layer: int) -> float:
        b = self.mbs[mb]
        self.exchange.dispatch(mb, layer, b, b.deadline, self.now)
        self.out += self.exchange.take_events()
        return self.now

    def wait(self, mb: int, layer: int) -> float | None:
        arrived = self.exchange.arrival(mb, layer)
        if arrived is not None:             # else the CombineArrive event resumes this replica
            self.exchange.combine(mb, layer, None)
        return arrived


class Stretch:
    """One attention op's stretched end (PoolTime.stretch), with what it takes to resume the iteration
    when pool batches are added: the iterates, and how many batches the pool had when they were made."""
    __slots__ = ("start", "work", "base", "iterates", "known")

    def __init__(self, start: float, work: float, base: float, iterates: list[float], known: int):
        self.start, self.work, self.base, self.iterates, self.known = start, work, base, iterates, known

    @property
    def end(self) -> float:
        return self.iterates[-1]


class PoolTime:
    """The expert pool's busy intervals (one batch at a time, in start order) and what they take from an
    attention op on a device they share (co-located)."""
    PRUNE = 1 << 16

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.before: list[float] = []       # pool busy time before interval i
        self.dropped = 0                    # intervals pruned from the front (absolute index = i + dropped)
        self.stretch_s = 0.0                # attention time added by the pool, all replicas

    def add(self, start: float, end: float) -> None:
        self.before.append(self.before[-1] + self.ends[-1] - self.starts[-1] if self.starts else 0.0)
        self.starts.append(start)
        self.ends.append(end)

    def busy_until(self, t: float) -> float:
        """Pool busy time before t (of the batches started so far)."""
        i = bisect_right(self.starts, t) - 1
        return 0.0 if i < 0 else self.before[i] + min(t, self.ends[i]) - self.starts[i]

    def stretched(self, start: float, work: float) -> float:
        """When an attention op of `work` seconds started at `start` ends, given the pool batches so far."""
        return self.stretch(start, work).end

    def stretch(self, start: float, work: float) -> Stretch:
        """The attention op's Stretch: its end (`.end`, what `stretched` returns) given the pool batches so
        far: the fixed point of end = start + work + (pool busy time in [start, end]), iterated from end =
        start + work. The iterates only grow, so the interval each one falls in is found by walking forward
        from the last (what `busy_until` would find by bisection, the same floats in the same order)."""
        starts, ends, before = self.starts, self.ends, self.before
        i = bisect_right(starts, start) - 1
        base = 0.0 if i < 0 else before[i] + min(start, ends[i]) - starts[i]
        sw = start + work
        return self._iterate(Stretch(start, work, base, [sw], 0), i)

    def restretched(self, s: Stretch) -> Stretch:
        """`stretch(s.start, s.work)` given the batches added since `s` was made, resumed rather than redone,
        with the same floats. A batch added later starts at or after the op did; the iterates below the
        first such start did not see it, so they are what a fresh iteration computes, and it goes on from
        the first iterate at or above that start. (A batch that starts at the op's very start changes the
        base: then it starts over.)"""
        n = len(self.starts) + self.dropped
        if s.known == n:
            return s
        first = self.starts[s.known - self.dropped]
        if first <= s.start:
            return self.stretch(s.start, s.work)
        its = s.iterates
        j = bisect_left(its, first)
        if j == len(its):           # every iterate is below the new batches: the same fixed point
            s.known = n
            return s
        del its[j + 1:]
        return self._iterate(s, bisect_right(self.starts, its[j]) - 1)

    def _iterate(self, s: Stretch, i: int) -> Stretch:
        """Iterate from s.iterates[-1], whose interval is i, to the fixed point (appended to s.iterates)."""
        starts, ends, before = self.starts, self.ends, self.before
        n, its, base, sw = len(starts), s.iterates, s.base, s.start + s.work
        end = its[-1]
        while True:
            while i + 1 < n and starts[i + 1] <= end:
                i += 1
            nxt = sw + (0.0 if i < 0 else before[i] + min(end, ends[i]) - starts[i]) - base
            if nxt <= end + 1e-12:
                s.known = n + self.dropped
                return s
            end = nxt
            its.append(end)

    def prune(self, oldest: float) -> None:
        """Forget intervals that ended before `oldest` (no attention in flight started earlier)."""
        if len(self.starts) < self.PRUNE:
            return
        i = bisect_right(self.ends, oldest) - 1
        if i > 0:
            del self.starts[:i], self.ends[:i], self.before[:i]
            self.dropped += i


class AsyncEngine(EngineBase):
    def __init__(self, cost: CostModel, num_attention: int, router, token_budget: int, shares: ExpertShares,
                 selector, microbatches: "int | str" = 2, order: str = "fcfs", max_queue: int = 1024,
                 trace_window=None, trace_replicas: int = 8, adaptive: bool = False,
                 prefix_cache_blocks: int | None = None, colocated: bool = False, attention_costs=None):
        """attention_costs: each replica's CostModel for its attention (a length-aware fleet mixes attention
        TP); default `cost` for all."""
        super().__init__(cost, num_attention, router, token_budget, order, max_queue, trace_window)
        if prefix_cache_blocks is not None:     # one cache per replica, the same policy as sync's DP groups
            self.schedulers = [PrefixCachedScheduler.like(s, PrefixCache(prefix_cache_blocks)) for s in self.schedulers]
        if microbatches != "adaptive" and not (isinstance(microbatches, int) and microbatches >= 1):
            raise ValueError(f"microbatches must be an int >= 1 or 'adaptive', got {microbatches!r}")
        if microbatches == "adaptive":        # the runtime's adaptive_depth with its default microbatches
            microbatches, adaptive = 2, True
        self.selector, self.shares = selector, shares
        hw, E = cost.hw, shares.num_workers
        self.colocated, self.pool_time = colocated, PoolTime()
        self.attention_costs = list(attention_costs) if attention_costs is not None else [cost] * num_attention
        if len(self.attention_costs) != num_attention:
            raise ValueError(f"{len(self.attention_costs)} attention costs for {num_attention} replicas")
        if colocated and E != sum(c.attn_tp for c in self.attention_costs):
            raise ValueError(f"colocated: the replicas' {sum(c.attn_tp for c in self.attention_costs)} devices must "
                             f"be the {E} expert devices")
        self.total_devices = E if colocated else num_attention + E
        disp_copy = cost.seconds_per_copy(E, colocated, self.total_devices, hw.dispatch_bytes) * self.model.top_k
        self.nic_copy = cost.seconds_per_copy(E, colocated, self.total_devices, hw.combine_bytes)
        tx, rx = disp_copy, self.nic_copy * self.model.top_k
        if colocated:       # a device's link also carries its shard's traffic: per token of its replica, as many
            tx = rx = tx + rx   # dispatches in and combines out (balanced), on top of its own (conservative)
        self.replicas = [Replica(i, StepDepth(microbatches, adaptive), SimExchange(i, hw.link.latency_s, tx, rx), self)
                         for i in range(num_attention)]
        self.moe = self.model.moe_layers
        self.num_layers = self.model.num_layers
        self.ready = ready_queue(selector)      # the selector's choices, O(log n) for the built-in rules
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
        step = plan_step(self.schedulers[rep.index], now, rep.depth.k)
        if not step:
            rep.mbs = None
            self.busy_until[rep.index] = 0.0
            self.touch(rep.index)
            return []
        cost, mbs, predicted = self.attention_costs[rep.index], [], 0.0
        n_moe = sum(self.moe)
        for p in step.microbatches:
            T, P, K = p.num_tokens, p.pairs, p.context
            t_moe, t_dense = cost.attention_seconds(True, T, P, K), cost.attention_seconds(False, T, P, K)
            mbs.append(MicroBatch(rep.index, p.index, p.chunks, T, t_moe, t_dense, p.deadline))
            predicted += n_moe * t_moe + (self.num_layers - n_moe) * t_dense
        rep.plan, rep.mbs = step.schedule, mbs
        rep.pipe = StepPipeline(len(mbs), self.moe)
        self.num_steps += 1
        self.busy_until[rep.index] = now + predicted
        self.touch(rep.index)
        return self.drive(rep, now)

    def drive(self, rep: Replica, now: float) -> list:
        """Do what the step pipeline says (asap.pipeline.step.drive, rep being the driver) until the replica
        is busy or must wait for an event."""
        if rep.busy or rep.pipe is None:
            return []
        rep.now, rep.out = now, []
        out = rep.out
        if drive(rep.pipe, rep):
            out += self._end_step(rep, now)
        return out

    def on_attention_done(self, mb: MicroBatch, now: float) -> list:
        rep = self.replicas[mb.replica]
        work = mb.t_moe if self.moe[mb.layer] else mb.t_dense
        if self.colocated:      # pool batches that started while it ran push its end further
            end = self.pool_time.restretched(mb.stretch).end
            if end > now:
                return [AttentionDone(end, mb)]
            self.pool_time.stretch_s += now - mb.a_start - work
            if self.trace_window is not None and rep.index < self.trace_replicas:   # its span as stretched
                self.span("attention", rep.index, f"attn L{mb.layer} mb{mb.index}", mb.a_start, now,
                          tokens=mb.num_tokens)
        rep.busy = False
        rep.pipe.attended(mb.index, mb.layer, work)
        return self.drive(rep, now)

    def on_combine_arrive(self, key, now: float) -> list:
        mb, layer = key
        rep = self.replicas[mb.replica]
        rep.exchange.arrived(mb.index, layer, now)
        return self.drive(rep, now)

    def _end_step(self, rep: Replica, now: float) -> list:
        for req in self.schedulers[rep.index].commit(rep.plan):
            self.finish(req, now)
        rep.depth.end_step(rep.pipe)
        rep.mbs = rep.plan = rep.pipe = None
        return self.start_step(rep, now)

    # ---- expert workers ----
    def on_dispatch_arrive(self, work: WorkInfo, now: float) -> list:
        self.ready.push(work)
        return [] if self.pool_busy else self.pool_start(now)

    def on_pool_wake(self, now: float) -> list:
        self.wake_at = None
        return [] if self.pool_busy or not self.ready else self.pool_start(now)

    def pool_start(self, now: float) -> list:
        picked = self.ready.take(now)
        if not picked:
            wait = self.ready.wait_until
            if wait is not None and wait > now and (self.wake_at is None or wait < self.wake_at):
                self.wake_at = wait
                return [PoolWake(wait)]
            return []
        layer = picked[0].layer
        tokens = sum(w.num_tokens for w in picked)
        duration = self.cost.batch_expert_seconds(self.cost.moe_index[layer], tokens, self.shares, self.nic_copy)
        self.pool_busy = True
        self.pool_busy_s += duration
        if self.colocated:
            self.pool_time.add(now, now + duration)
            if len(self.pool_time.starts) >= PoolTime.PRUNE:
                self.pool_time.prune(min((r.attending.a_start for r in self.replicas if r.busy), default=now))
        self.num_batches += 1
        self.batch_tokens += tokens
        if self.trace_window is not None:
            self.span("experts", 0, f"experts L{layer}", now, now + duration, items=len(picked), tokens=tokens,
                      replicas=sorted({w.replica for w in picked}))
        return [ExpertDone(now + duration, picked)]

    def on_expert_done(self, items: list[WorkInfo], now: float) -> list:
        self.pool_busy = False
        out = [self.replicas[w.replica].exchange.returned(w, now) for w in items]
        if self.ready:
            out += self.pool_start(now)
        return out

    def stats(self) -> dict:
        out = {"num_steps": self.num_steps, "expert_batches": self.num_batches,
               "expert_busy_s": self.pool_busy_s,
               "mean_expert_batch_tokens": self.batch_tokens / self.num_batches if self.num_batches else 0.0}
        if self.colocated:
            out["attention_stretch_s"] = self.pool_time.stretch_s
        prefix = cache_stats(self.schedulers)
        return out if prefix is None else {**out, "prefix_cache": prefix}
