"""An emulated expert worker chooses its next batch at its device's time, not its host's.

Its dispatches carry due times (the emulated link). The selector chooses at the time the device starts
(when it is free, or when the first item was due) among the items due by then, as the simulator's expert
pool does; a host running behind its device would otherwise see, and merge, items that came later. An
aggregation window that holds items back is stepped to its release time, in device time, if that has
passed on the host meanwhile.
"""
from __future__ import annotations

import time


class DeviceTimeSelector:
    def __init__(self, selector, clock, mailbox):
        """selector: the policy (asap.scheduler.expert_select); clock: the worker's DeviceClock; mailbox: the
        one whose `work` the ready list is read from (asap.comm.dispatch_recv passes it in that order)."""
        self.selector, self.clock, self.mailbox = selector, clock, mailbox

    @property
    def wait_until(self):
        return getattr(self.selector, "wait_until", None)

    def select(self, ready, now: float) -> list[int]:
        work = self.mailbox.work
        if len(work) != len(ready):
            raise RuntimeError(f"DeviceTimeSelector: {len(ready)} ready items, but the mailbox holds {len(work)}")
        due = [it.header.ready_ns / 1e9 for it in work]
        now = max(self.clock.free, min(due))
        while True:
            cand = [i for i, d in enumerate(due) if d <= now]
            chosen = [cand[j] for j in self.selector.select([ready[i] for i in cand], now)]
            until = self.wait_until
            if chosen or until is None or not now < until <= time.monotonic():
                taking = getattr(self.clock, "taking", None)     # co-located: whose dispatches its next op serves
                if chosen and taking is not None:
                    taking([work[i].header.replica for i in chosen])
                return chosen
            now = until
