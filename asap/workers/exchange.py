"""The runtime's two expert exchanges (asap.pipeline.exchange): point-to-point and all-to-all.

PointToPoint (async): a dispatch goes to the expert workers that own the chosen
experts; a combine waits for those workers only.

AllToAll (sync): every rank sends every rank its tokens for (step, L, i), empty
messages included, and is itself 1/N of the experts. Collective semantics: a
rank serves its shard of (step, L, i) only once all N dispatches are in, and
serves keys in the order it dispatched them (the pipeline order, the same on
every rank), so the all-to-alls cannot deadlock. The collective does not block
the caller: `dispatch` returns at once and the serving happens while waiting
for a combine, so with two micro-batches, micro-batch i+1's attention runs while
micro-batch i's all-to-all is in flight (SGLang TBO, vLLM DBO).

Both stamp the replica's epoch on what they send; `abandon` (after a timeout)
bumps it, so the mailboxes purge the late answers of the abandoned step.
Under emulated compute, subclasses (asap.workers.emulation.exchange) charge
the hardware profile's link, as the simulator does; the methods they override
are the seams marked "real link" below.
"""
from __future__ import annotations

import math
import time
from collections import deque

import torch

from asap.comm import CombineInbox, CommTimeout, WorkQueue, combine_recv, combine_send, dispatch_recv, dispatch_send
from asap.comm.mailbox import ALIVE_CHECK_S
from asap.model.stages import StageOut
from asap.pipeline.exchange import num_to_serve


class _Exchange:
    """What both exchanges share: the replica's epoch (stamped on what it sends), combine arrival times,
    and `abandon`."""

    def __init__(self, transport, mailbox, dest, owner: int, spans):
        self.transport, self.mailbox, self.dest, self.owner, self.spans = transport, mailbox, dest, owner, spans
        self.inbox = CombineInbox(mailbox)
        self._epoch = 0
        self._pending: dict[tuple[int, int], object] = {}    # (mb, layer) -> what combine waits on
        self._arrived: dict[tuple[int, int], float] = {}     # (mb, layer) -> when its combine was filed

    @property
    def epoch(self) -> int:
        return self._epoch

    def poll(self) -> None:
        self.mailbox.pump(0)

    def arrival(self, mb: int, layer: int) -> float | None:
        return self._arrived.get((mb, layer))

    def _stamp(self, copies: int) -> dict:
        """Real link: a message is delivered when it is (no due time) and leaves when it is sent."""
        return {}

    def _received(self, mb: int, layer: int, pc, fallback: float, copies: int = 0) -> None:
        """(mb, layer)'s combine is in: file when it came (real link: when the mailbox took its last part)."""
        self._arrived[(mb, layer)] = self.mailbox.arrived_at.get(pc.key, fallback)
        self.mailbox.forget(pc.key)

    def abandon(self) -> None:
        self._epoch += 1
        self._pending.clear()
        self._arrived.clear()
        self.mailbox.advance_epoch(self.owner, self._epoch)


class PointToPoint(_Exchange):
    def __init__(self, transport, mailbox, dest, replica: int, spans):
        super().__init__(transport, mailbox, dest, replica, spans)
        self.replica = replica
        self.seq = 0

    def dispatch(self, mb: int, layer: int, out: StageOut, deadline: float, now: float) -> None:
        copies = out.topk_ids.numel()
        pc = dispatch_send(self.transport, out.x, out.topk_ids, out.topk_weights, self.dest(layer, out.topk_ids),
                           replica=self.replica, layer=layer, microbatch=mb, seq=self.seq, deadline=deadline,
                           epoch=self._epoch, **self._stamp(copies))
        self.seq += 1
        self._pending[(mb, layer)] = (pc, now, copies)
        self._arrived.pop((mb, layer), None)

    def combine(self, mb: int, layer: int, timeout: float | None) -> torch.Tensor:
        pc, sent_at, copies = self._pending.pop((mb, layer))
        with self.spans.span("stall"):
            partial = combine_recv(self.inbox, pc, timeout=timeout)
            self._received(mb, layer, pc, sent_at, copies)
        return partial


class _KeySelector:
    """Selects every dispatch of one (step, layer, micro-batch): the all-to-all's receive side."""

    def __init__(self, key):
        self.key = key

    def select(self, ready, now):   # WorkInfo.key = (src, replica, layer, microbatch, seq); seq is the step
        return [i for i, w in enumerate(ready) if (w.key[4], w.key[2], w.key[3]) == self.key]


class AllToAll(_Exchange):
    # Real link: while it waits for a combine, a rank serves every later all-to-all whose dispatches are in.
    EAGER_UNTIL = math.inf

    def __init__(self, transport, mailbox, dest, rank: int, compute, spans):
        super().__init__(transport, mailbox, dest, rank, spans)
        self.rank, self.compute = rank, compute
        self.ranks = list(range(transport.world_size))
        self.queue = WorkQueue(mailbox)
        self.step = 0
        self._to_serve: deque[tuple[int, int, int]] = deque()   # (step, layer, mb), in dispatch order
        self._copies: dict[tuple[int, int, int], int] = {}       # key -> this rank's own T x top_k

    def begin_step(self, step: int) -> None:
        self.step = step
        stale = [w for w in self.mailbox.work if w.header.seq < step]   # a dispatch of a step given up on
        if stale:
            self.mailbox.work[:] = [w for w in self.mailbox.work if w.header.seq >= step]
            self.mailbox.num_dropped += len(stale)

    def dispatch(self, mb: int, layer: int, out: StageOut, deadline: float, now: float) -> None:
        """deadline: unused, a collective serves in the pipeline's order."""
        copies = out.topk_ids.numel()
        pc = dispatch_send(self.transport, out.x, out.topk_ids, out.topk_weights, self.dest(layer, out.topk_ids),
                           replica=self.rank, layer=layer, microbatch=mb, seq=self.step, always_to=self.ranks,
                           epoch=self._epoch, **self._stamp(copies))
        self._pending[(mb, layer)] = pc
        self._to_serve.append((self.step, layer, mb))
        self._copies[(self.step, layer, mb)] = copies
        self._arrived.pop((mb, layer), None)

    def combine(self, mb: int, layer: int, timeout: float | None) -> torch.Tensor:
        """Serve this shard for every key whose N dispatches are in (in order) until (mb, layer)'s own
        combine is complete, then return it."""
        pc = self._pending.pop((mb, layer))
        key = (self.step, layer, mb)
        deadline = None if timeout is None else time.monotonic() + timeout
        self.mailbox.pump(0)
        while True:
            self._serve_by_rule(key, self.EAGER_UNTIL)
            got = self.mailbox.partials.get(pc.key, {})
            if key not in self._to_serve and pc.rows.keys() <= got.keys():
                break
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                have = {w.src for w in self.mailbox.work if (w.header.seq, w.header.layer, w.header.microbatch)
                        == key}
                raise CommTimeout(f"all-to-all {key}: dispatches from {sorted(have)} of {len(self.ranks)} ranks, "
                                  f"combines from {sorted(got)} of {sorted(pc.rows)}")
            self.mailbox.check_alive()
            t0 = time.monotonic()
            self.mailbox.pump(ALIVE_CHECK_S if wait is None else min(wait, ALIVE_CHECK_S))
            self.spans.add("stall", t0, time.monotonic())
        self._combine_came(pc, key)
        partial = combine_recv(self.inbox, pc, timeout=0)
        self._received(mb, layer, pc, time.monotonic())
        return partial

    def abandon(self) -> None:
        self._to_serve.clear()
        self._copies.clear()
        super().abandon()

    def next_to_serve(self, awaited, until: float):
        """The all-to-all this rank serves next, by the serving rule the simulator also runs
        (asap.pipeline.exchange.num_to_serve), or None. awaited: the (step, layer, mb) whose combine it waits
        for; a dispatch is in at its due time under an emulated link, else when it was filed."""
        pending = self._to_serve
        times = []
        for k in pending:
            if not self._all_in(k):
                times.append(None)
                break
            times.append(self._dispatched_at(k))
        awaited_at = next((i for i, k in enumerate(pending) if k == awaited), -1)
        return pending[0] if num_to_serve(times, awaited_at, until) else None

    def _dispatched_at(self, key) -> float:
        """Real link: a dispatch is in when the mailbox has it (all in: serve it now)."""
        return 0.0

    def _combine_came(self, pc, key) -> None:
        """Real link: nothing more to serve once the combine is in (later keys were served as they came)."""

    def _combine_due(self, own: int):
        """Real link: answers are delivered when they are (no due time)."""
        return None

    def _serve_by_rule(self, awaited, until: float) -> None:
        while (key := self.next_to_serve(awaited, until)) is not None:
            self._serve(self._to_serve.popleft())

    def _all_in(self, key) -> bool:
        return sum((w.header.seq, w.header.layer, w.header.microbatch) == key
                   for w in self.mailbox.work) >= len(self.ranks)

    def _serve(self, key) -> None:
        items = dispatch_recv(self.queue, timeout=0, selector=_KeySelector(key))
        due = self._combine_due(self._copies.pop(key, 0))
        with self.spans.span("compute"):
            serve_experts(self.compute, self.transport, items, due)


def serve_experts(compute, transport, items, due=None) -> None:
    """The expert side of both engines: one batch of same-layer work items through this shard, each
    partial back to the rank it came from. due(pairs) -> ns: when the answers are due (an emulated link)."""
    layer = items[0].header.layer
    sizes = [it.x.shape[0] for it in items]
    ids = torch.cat([it.topk_ids for it in items])
    # Under an emulated link each dispatch was in at its due time, which may be before the host took it.
    due_in = [it.header.ready_ns for it in items]
    compute.inputs_ready(max(due_in) / 1e9 if all(due_in) else None)
    partial = compute.experts(layer, torch.cat([it.x for it in items]), ids,
                              torch.cat([it.topk_weights for it in items]))
    sent_at = compute.done_at()
    ready_ns = 0 if due is None else due(int((ids >= 0).sum()))
    for it, part in zip(items, partial.split(sizes)):
        combine_send(transport, it, part.contiguous(), ready_ns, sent_at)
