"""The simulated expert exchanges (asap.pipeline.exchange.Exchange), in simulated time.

SimExchange: one async replica's link. It carries one message at a time each
way: dispatches out, one copy per (token, expert) pair, and combines in; each
message also pays the link latency. Per-copy times come from the cost model
(asap.cost.CostModel.seconds_per_copy), so contention and link rates are the
hardware profile's, not this file's. The expert side (the pool of expert
workers) lives in the engine; what it hands back comes through `returned`.

SimAllToAll: the sync engine's all-to-all, played for all ranks at once (numpy
over ranks), on two streams per rank: compute (attention, shared with the
engine, and this rank's expert shard) and comm (collectives: one time for all
ranks). It serves by the runtime's rule (asap.pipeline.exchange.num_to_serve).
"""
from __future__ import annotations

import numpy as np

from asap.pipeline.exchange import num_to_serve
from asap.scheduler.expert_select import WorkInfo
from asap.sim.events import CombineArrive, DispatchArrive


class SimExchange:
    """Out: the engine's micro-batch (asap.sim.async_engine.MicroBatch); combines return None."""

    def __init__(self, replica: int, latency_s: float, dispatch_per_token_s: float, combine_per_token_s: float):
        self.replica = replica
        self.latency, self.disp, self.comb = latency_s, dispatch_per_token_s, combine_per_token_s
        self.tx_free = self.rx_free = 0.0       # each direction of the link: free from this time
        self.events: list = []                  # caused by dispatch(); the engine takes them
        self._arrived: dict[tuple[int, int], float] = {}

    def dispatch(self, mb: int, layer: int, out, deadline: float, now: float) -> None:
        self.tx_free = max(now, self.tx_free) + out.num_tokens * self.disp
        self._arrived.pop((mb, layer), None)
        self.events.append(DispatchArrive(self.tx_free + self.latency,
                                          WorkInfo((out, layer), self.replica, layer, out.num_tokens, now, deadline)))

    def returned(self, work: WorkInfo, now: float) -> CombineArrive:
        """The experts finished `work` at `now`: its combine crosses the link back."""
        self.rx_free = max(now, self.rx_free) + work.num_tokens * self.comb
        return CombineArrive(self.rx_free + self.latency, work.key)

    def arrived(self, mb: int, layer: int, now: float) -> None:
        self._arrived[(mb, layer)] = now

    def poll(self) -> None:
        """Arrivals are events (`arrived`): nothing to file."""

    def combine(self, mb: int, layer: int, timeout: float | None) -> None:
        if (mb, layer) not in self._arrived:
            raise RuntimeError(f"simulated combine of micro-batch {mb} layer {layer} asked before it arrived")
        return None

    def arrival(self, mb: int, layer: int) -> float | None:
        return self._arrived.get((mb, layer))

    def abandon(self) -> None:
        self._arrived.clear()

    def take_events(self) -> list:
        out, self.events = self.events, []
        return out


class _AllToAll:
    __slots__ = ("layer", "mb", "share", "dispatched", "served", "combined", "rows")

    def __init__(self, layer: int, mb: int, share: float, dispatched: float, rows=None):
        self.layer, self.mb, self.share, self.dispatched = layer, mb, share, dispatched
        self.rows = rows          # per rank: drawn token-expert rows (asap.cost.loads), or None: expected loads
        self.served = None        # per rank: when its shard was done
        self.combined = None      # when the combine was back on every rank


class SimAllToAll:
    """Out: each rank's attention end for (mb, layer) (the collective starts once the slowest is done).
    Times are from the step's start; `compute` is the per-rank compute stream, shared with the engine."""

    def __init__(self, cost, shares, num_ranks: int, dispatch_per_copy_s: float, combine_per_copy_s: float,
                 tracer=None):
        """tracer: the engine (span, _trace_ranks), or None."""
        self.cost, self.shares, self.num_ranks = cost, shares, num_ranks
        self.disp_copy, self.comb_copy = dispatch_per_copy_s, combine_per_copy_s
        self.latency, self.top_k = cost.hw.link.latency_s, cost.model.top_k
        self.tracer = tracer
        self.barrier_wait_s = 0.0  # rank-seconds waiting at a dispatch barrier for slower ranks' attention
        self.begin_step(np.zeros((1, num_ranks)), 0.0, False)

    def begin_step(self, tokens, now: float, trace: bool) -> None:
        """tokens[j, r]: micro-batch j's tokens on rank r; now: the step's start (for trace spans)."""
        self.total, self.biggest = tokens.sum(axis=1), tokens.max(axis=1)
        self.now, self.trace = now, trace
        self.compute = np.zeros(self.num_ranks)     # compute stream free, per rank
        self.comm = 0.0                             # comm stream free
        self.keys: list[_AllToAll] = []             # all-to-alls in dispatch order
        self.index: dict[tuple[int, int], int] = {}  # (layer, mb) -> its place in keys
        self.num_served = 0                         # keys[:num_served] are served on every rank
        self.num_combined = 0                       # keys[:num_combined] have their combine scheduled
        self._arrived: dict[tuple[int, int], float] = {}

    def poll(self) -> None:
        """Everything is scheduled when it is asked for: nothing to file."""

    def dispatch(self, mb: int, layer: int, out, deadline: float, now: float) -> None:
        # this all-to-all's loads: drawn per rank (asap.cost.loads), or the expected busiest share
        rows = self.cost.alltoall_rows(self.cost.moe_index[layer], float(self.total[mb]), self.shares)
        share = self.shares.max_share[self.cost.moe_index[layer]] if rows is None else \
            float(rows.max()) / max(1.0, float(self.total[mb]) * self.top_k)
        slowest = out.max()
        self.barrier_wait_s += float((slowest - out).sum())
        start = max(slowest, self.comm)
        self.comm = start + self.latency + max(self.biggest[mb], self.total[mb] * share) * self.top_k * self.disp_copy
        self.index.setdefault((layer, mb), len(self.keys))
        self.keys.append(_AllToAll(layer, mb, share, self.comm, rows))
        if self.trace:
            self.tracer.span("network", 0, f"dispatch L{layer} mb{mb}", self.now + start, self.now + self.comm)

    def combine(self, mb: int, layer: int, timeout: float | None) -> None:
        """Every rank serves up to (mb, layer) and that combine goes out; while it is on its way, ranks serve
        later all-to-alls whose dispatch is in (what AllToAll.combine does while it waits)."""
        must = self.index[(layer, mb)]
        self._serve(must, -np.inf)
        self._combine()
        back = self.keys[must].combined
        self._serve(must, back)
        self._combine()
        self._arrived[(mb, layer)] = back
        return None

    def arrival(self, mb: int, layer: int) -> float | None:
        return self._arrived.get((mb, layer))

    def abandon(self) -> None:
        self._arrived.clear()

    def _serve(self, must: int, until: float) -> None:
        pending = self.keys[self.num_served:]
        n = num_to_serve([k.dispatched for k in pending], must - self.num_served, until)
        cost = self.cost
        for key in pending[:n]:
            start = np.maximum(self.compute, key.dispatched)
            end = start + (cost.expert_seconds(cost.moe_index[key.layer], float(self.total[key.mb]), self.shares)
                           if key.rows is None else cost.worker_expert_seconds(key.rows, self.shares.slots))
            self.compute = key.served = end
            if self.trace:
                self.tracer._trace_ranks("experts", f"experts L{key.layer} mb{key.mb}", self.now, start, end)
        self.num_served += n

    def _combine(self) -> None:
        """Put the combine of every all-to-all that all ranks have served on the comm stream, in order."""
        while self.num_combined < self.num_served:
            key = self.keys[self.num_combined]
            start = max(float(key.served.max()), self.comm)
            self.comm = start + self.latency + max(self.biggest[key.mb], self.total[key.mb] * key.share) \
                * self.top_k * self.comb_copy
            key.combined = self.comm
            self.num_combined += 1
            if self.trace:
                self.tracer.span("network", 0, f"combine L{key.layer} mb{key.mb}", self.now + start, self.now + self.comm)
