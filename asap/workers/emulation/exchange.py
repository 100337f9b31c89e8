"""The runtime's exchanges over an emulated link (asap.workers.emulation.link): what the simulator charges.

EmulatedPointToPoint (async): each dispatch is stamped with when the replica's outgoing link delivers it,
from when the op that made it ended on the device; a combine crosses the replica's incoming link from when
the last expert sent its part (not from when this replica, busy with another micro-batch's attention, got
round to filing it), and is filed at that due time.

EmulatedAllToAll (sync): dispatches and the answers of each served all-to-all are stamped with their due
times. A rank's host may run behind its device clock, so it serves by due times, as the simulator
(asap.sim.exchange.SimAllToAll) does with the same rule (asap.pipeline.exchange.num_to_serve): up to the
all-to-all it waits for, then, once that combine came, the later ones whose dispatches were all due by then.
"""
from __future__ import annotations

import math
import time

from asap.workers.emulation.clock import wait_until
from asap.workers.exchange import AllToAll, PointToPoint


class EmulatedPointToPoint(PointToPoint):
    def __init__(self, transport, mailbox, dest, replica: int, spans, link):
        super().__init__(transport, mailbox, dest, replica, spans)
        self.link = link

    def _stamp(self, copies: int) -> dict:
        self._due_ns = self.link.dispatch_due(copies)
        return dict(ready_ns=self._due_ns, sent_at=self.link.ready_at())

    def dispatch(self, mb: int, layer: int, out, deadline: float, now: float) -> None:
        super().dispatch(mb, layer, out, deadline, now)
        dispatched = getattr(self.link.clock, "dispatched", None)    # co-located: its devices' experts will take it
        if dispatched is not None:
            dispatched(self._pending[(mb, layer)][0].rows.keys(), self._due_ns / 1e9)

    def _received(self, mb: int, layer: int, pc, fallback: float, copies: int = 0) -> None:
        done = self.mailbox.last_sent.get(pc.key, fallback)
        super()._received(mb, layer, pc, fallback, copies)
        due = self.link.received(done, copies)
        wait_until(due)
        self._arrived[(mb, layer)] = due


class EmulatedAllToAll(AllToAll):
    EAGER_UNTIL = -math.inf          # before the combine: up to the awaited all-to-all only

    def __init__(self, transport, mailbox, dest, rank: int, compute, spans, link):
        super().__init__(transport, mailbox, dest, rank, compute, spans)
        self.link = link

    def _stamp(self, copies: int) -> dict:
        return dict(ready_ns=self.link.dispatch_due(copies))

    def _dispatched_at(self, key) -> float:
        """When the last dispatch of `key` was due (the emulated link stamps every one)."""
        return max(w.header.ready_ns for w in self.mailbox.work
                   if (w.header.seq, w.header.layer, w.header.microbatch) == key) / 1e9

    def _combine_came(self, pc, key) -> None:
        # As the simulator: while this combine was on its way, the device ran the later all-to-alls (in order)
        # whose dispatches were all in by the time it came.
        self._serve_by_rule(key, self.mailbox.arrived_at.get(pc.key, time.monotonic()))

    def _combine_due(self, own: int):
        return lambda pairs: self.link.combine_due(max(pairs, own))
