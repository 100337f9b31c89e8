"""Co-located emulation: one device hosts an attention replica and an expert shard, and expert work goes first.

In co-located mode (RuntimeConfig.colocated) a device runs its expert kernels on a high-priority stream: they
are scheduled ahead of attention kernels at block granularity (here: at once), so an attention op is stretched
by the expert time its device runs while the op is in flight, and expert ops never wait for attention. That is
the simulator's rule for a co-located engine (asap.sim, EngineSpec.colocated).

The replica and the expert worker of a device are separate processes, each with its device clock
(asap.workers.emulation.clock). So the expert worker publishes each op's busy interval, on time.monotonic(),
in a shared-memory record of its device (DeviceBusy, made by the layout and handed over in the WorkerSpec), and
the replica's clock (SharedDeviceClock) ends an attention op that starts at s with w seconds of work at the
first t with t - s - (expert busy time in [s, t]) >= w (stretched_end). It re-reads the record while it
waits, so an expert op that starts meanwhile pushes it further, and it does not end before the device's
expert has taken every dispatch of this replica that was due by then (the hosts lag their devices by about
as long as a short attention op takes). A late-published expert op serving another replica can still be
missed. Emulated prompts take the simulator's co-located time and stretch (tests/test_runtime_colocated.py).
"""
from __future__ import annotations

import time
from multiprocessing.sharedctypes import RawArray, RawValue

from asap.workers.emulation.clock import DeviceClock


def stretched_end(start: float, work: float, busy) -> float:
    """The first t >= start with t - start - (busy time in [start, t]) >= work: an op that needs `work`
    seconds of a device that other work pre-empts over `busy`, sorted disjoint (begin, end) intervals."""
    if work <= 0:
        return start
    t, left = start, work
    for a, b in busy:
        if b <= t:
            continue
        if a > t:                       # a gap before this interval: the op runs in it
            if a - t >= left:
                return t + left
            left -= a - t
        t = b                           # pre-empted until the expert op ends
    return t + left


class DeviceBusy:
    """One device's expert busy intervals, in shared memory: one writer (the device's expert worker), and
    readers (its replica). Intervals are written in order, and do not overlap (the expert ops chain on its
    clock); a ring of `slots` keeps the recent ones, which are all an op in flight needs. A slot is written
    before the count that publishes it (x86 keeps stores in order), so neither side takes a lock.
    `taken[r]`: how many of replica r's dispatches the expert has taken, counted once their op is published.
    Picklable only when a process is started with it (multiprocessing shared ctypes)."""

    def __init__(self, num_replicas: int, slots: int = 1024):
        self.slots = slots
        self._iv = RawArray("d", 2 * slots)
        self._count = RawValue("q", 0)
        self._taken = RawArray("q", num_replicas)
        self._busy = RawValue("d", 0.0)        # expert seconds published in all
        self._stretch = RawValue("d", 0.0)     # seconds attention ops were pushed back by them

    def publish(self, begin: float, end: float, replicas=()) -> None:
        """An expert op over [begin, end) that serves the dispatches of `replicas` (one entry per dispatch)."""
        if end > begin:
            n = self._count.value
            i = 2 * (n % self.slots)
            self._iv[i], self._iv[i + 1] = begin, end
            self._busy.value += end - begin
            self._count.value = n + 1
        for r in replicas:                  # after the interval: a reader that sees the count sees the interval
            self._taken[r] += 1

    def taken(self, replica: int) -> int:
        return self._taken[replica]

    def since(self, t: float) -> list[tuple[float, float]]:
        """The published intervals that end after t, oldest first."""
        n, out = self._count.value, []
        for j in range(n - 1, max(-1, n - self.slots + 8), -1):   # stay clear of the slot being rewritten
            i = 2 * (j % self.slots)
            a, b = self._iv[i], self._iv[i + 1]
            if b <= t:
                break
            out.append((a, b))
        return out[::-1]

    def last_end(self) -> float:
        """When the last published expert op ends: no later one starts before it."""
        n = self._count.value
        return self._iv[2 * ((n - 1) % self.slots) + 1] if n else 0.0

    def add_stretch(self, seconds: float) -> None:
        self._stretch.value += seconds

    @property
    def busy_s(self) -> float:
        """Expert seconds this device has run (published) so far."""
        return self._busy.value

    @property
    def stretch_s(self) -> float:
        """Seconds the device's attention ops were pushed back by expert work so far."""
        return self._stretch.value


class ExpertDeviceClock(DeviceClock):
    """An expert worker's clock on a shared device: its ops chain as before and are published to the device,
    with the replicas whose dispatches each serves (`taking`, told by the selector before the op runs)."""

    def __init__(self, device: DeviceBusy):
        super().__init__()
        self.device = device
        self._taking: list[int] = []

    def taking(self, replicas: list[int]) -> None:
        self._taking = list(replicas)

    def run(self, seconds: float) -> float:
        end = super().run(seconds)
        self.device.publish(end - seconds, end, self._taking)
        self._taking = []
        return end


class SharedDeviceClock(DeviceClock):
    """A replica's clock on the devices it shares with expert shards (attention_tp of them under emulated TP:
    an op ends once it has ended on every one, as the TP group's all-reduce waits for the slowest).

    The expert's host learns of a dispatch a little after its device could start on it, so an op's end is
    settled only once each device's expert has taken every dispatch of this replica due before that end (or
    is busy past it): the replica's own dispatch, sent just before its next attention op, would otherwise be
    published after that op had ended (the two hosts' lag against a ~ms op) and stretch nothing. Dispatches
    of other replicas are not waited for: a late one is missed (rare, and not tied to this replica's ops)."""
    POLL_S = 0.001          # how often a waiting op re-reads the records
    SETTLE_S = 0.25         # gives up waiting for an expert host after this long (wall), past the op's end

    def __init__(self, devices, replica: int, expert_ranks):
        super().__init__()
        self.devices, self.replica, self.expert_ranks = tuple(devices), replica, tuple(expert_ranks)
        self._sent: list[list[float]] = [[] for _ in self.devices]   # due times of our dispatches there
        self._dropped = [0] * len(self.devices)                      # ... minus the first ones, forgotten
        self._excused = [0] * len(self.devices)     # given up on (dropped by the expert: a timed-out epoch's)
        self._op = (0.0, 0.0)               # (start, work) of the op queued last
        self._per_device: list[float] = []  # its end on each device, as last read

    def dispatched(self, ranks, due: float) -> None:
        """This replica sent a dispatch, due at `due`, to the transport ranks `ranks`."""
        for j, rank in enumerate(self.expert_ranks):
            if rank in ranks:
                self._sent[j].append(due)

    def _end(self) -> float:
        start, work = self._op
        self._per_device = [stretched_end(start, work, d.since(start)) for d in self.devices]
        return max(self._per_device)

    def _settled(self, taken: list[int]) -> bool:
        """Whether no expert op can still start on one of the devices before this op's end."""
        ok = True
        for j, d in enumerate(self.devices):
            sent, done = self._sent[j], taken[j] + self._excused[j] - self._dropped[j]
            if done > 1024:                 # forget what was taken long ago (the expert takes them about in order)
                del sent[:done - 64]
                self._dropped[j] += done - 64
                done = 64
            waiting = sent[done:]
            ok &= not waiting or min(waiting) >= self.free or d.last_end() >= self.free
        return ok

    def run(self, seconds: float) -> float:
        self._op = (self.start(), seconds)
        self.free = self._end()
        return self.free

    def wait(self, end: float) -> None:
        """Block until the op queued last has ended, re-reading the records while it waits."""
        give_up = None
        while True:
            taken = [d.taken(self.replica) for d in self.devices]    # before the intervals they come after
            self.free = self._end()
            now = time.monotonic()
            if now >= self.free:
                if self._settled(taken):
                    break
                give_up = give_up or now + self.SETTLE_S
                if now > give_up:           # what it still waits for was dropped: never wait for it again
                    self._excused = [len(sent) + dropped - t
                                     for sent, dropped, t in zip(self._sent, self._dropped, taken)]
                    break
            time.sleep(min(self.free - now, self.POLL_S) if now < self.free else self.POLL_S)
        start, work = self._op
        for d, e in zip(self.devices, self._per_device):
            if e - start > work:
                d.add_stretch(e - start - work)
