"""An emulated device's stream: when each op an emulated worker runs starts and ends.

On a GPU the host queues kernels ahead of the device, so the device runs one op after another,
each from when the device is free and its inputs are in; the host's own Python time between ops is
hidden as long as it keeps ahead. Emulated compute (asap.workers.emulation.compute.EmulatedCompute) waits
instead of computing, so without this clock every op would start when the host got round to it,
and every millisecond of Python per layer (message handling, scheduling, sleep overshoot) would
add to the emulated step: at a dilation of 8 that made lone prompts 9-34% slower EMULATED than
SIMULATED. The simulator's timeline is the same chain with no host time at all.

So each op starts at max(when the device is free, when its inputs were in). Who knows when inputs
were in tells the clock (`inputs_ready`): the step pipeline (a step's start; a combine's arrival, which
under an emulated link is its due time), and the expert side (its dispatches' due times). With no word,
an op's inputs are taken as in when it is issued, which is what the clock did before it chained.
Messages leave when the op that made them ends (`out`), and the emulated link carries them from there
(asap.workers.emulation.link). The host still blocks until each op's end (`wait_until`), so nothing downstream
sees a result early; when the host falls behind, the ops whose ends are already past return at once
and the host catches up.
"""
from __future__ import annotations

import time


class DeviceClock:
    def __init__(self):
        self.free = 0.0                    # time.monotonic() at which the device's last op ends
        self._ready: float | None = None   # the next op's inputs are in from then (None: when it is issued)

    def inputs_ready(self, t: float | None) -> None:
        """The next op's inputs were in at t (None: when it is issued). Once: the op after it chains."""
        self._ready = t

    def start(self) -> float:
        """When the next op starts: max(device free, its inputs in). Uses up the word on its inputs."""
        start = max(self.free, time.monotonic() if self._ready is None else self._ready)
        self._ready = None
        return start

    def run(self, seconds: float) -> float:
        """Queue an op of `seconds` (wall time): when it ends."""
        self.free = self.start() + seconds
        return self.free

    def wait(self, end: float) -> None:
        """Block the host until the op queued last ends (at `end`): nothing downstream sees its result early."""
        wait_until(end)

    def out(self) -> float:
        """When what the last op made leaves the device: its end, or when the inputs of an op that did not
        run came in (an idle sync rank's empty dispatch)."""
        if self._ready is not None:
            return max(self.free, self._ready)
        return self.free


def wait_until(t: float) -> None:
    while (left := t - time.monotonic()) > 0:
        time.sleep(left)
