"""The per-process mailbox: one place that drains the transport.

A worker may wait for expert work, combine answers, barrier flags and control
messages at different moments, but they all arrive on one transport. The
Mailbox takes whatever has arrived and files it by kind, so that each waiter
only ever looks at its own pile and no message is lost to the wrong reader:
  DISPATCH -> `work`      (WorkQueue / dispatch_recv, expert side)
  COMBINE  -> `partials`  (CombineInbox / combine_recv, attention side)
  BARRIER  -> `barriers`  (take_barrier: by step, checked on receipt)
  CONTROL  -> `control`   (take_control, FIFO)

Bounded: every message carries its replica's epoch. A replica bumps its epoch
when it gives up on a step (a timeout); from then on, work and partials of its
older epochs are purged when the new epoch is first seen, and dropped if they
arrive later. So answers that come after a timeout never pile up.

Due times: a message whose header carries a future `ready_ns` (an emulated link, asap.workers.emulation.link) is
held and filed when that time comes, as if it had only then arrived; every wait on the mailbox wakes
for it.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch

from asap.comm.headers import Header, Kind
from asap.comm.transport import CommTimeout, Message, Transport
from asap.scheduler.expert_select import WorkInfo

T = TypeVar("T")
ALIVE_CHECK_S = 0.5     # with `alive`: how often a wait checks it


@dataclass
class WorkItem:
    """One dispatch as the expert side sees it (rows = tokens that have >= 1 pair for this rank)."""
    src: int
    header: Header
    x: torch.Tensor             # [T_r, D]
    topk_ids: torch.Tensor      # [T_r, K]; -1 where the pair belongs to another rank
    topk_weights: torch.Tensor  # [T_r, K]; 0 where the pair belongs to another rank
    info: WorkInfo | None = field(default=None, repr=False, compare=False)   # what a selector sees; made once

    def __post_init__(self):
        if self.info is None:
            h = self.header
            self.info = WorkInfo((self.src, h.replica, h.layer, h.microbatch, h.seq), h.replica, h.layer,
                                 h.num_tokens, h.sent_at, h.deadline)


class StaleBarrier(RuntimeError):
    """A barrier flag that contradicts the step this rank is at: ranks have drifted apart."""


class Mailbox:
    def __init__(self, t: Transport, alive: Callable[[], bool] | None = None):
        """alive: whether the waits are still wanted (a worker: its engine process lives); checked every
        ALIVE_CHECK_S while waiting, and a wait gives up with CommTimeout once it says no, so a worker
        whose engine died does not sit out a whole comm timeout (its peers may be gone too)."""
        self.transport = t
        self.alive = alive
        self.work: list[WorkItem] = []                                  # arrival order
        self.partials: dict[tuple, dict[int, torch.Tensor]] = {}       # key -> {src rank: partial}
        self.arrived_at: dict[tuple, float] = {}   # key -> when its last partial came: due time if held, else filed
        self.last_sent: dict[tuple, float] = {}                        # key -> when its last partial was sent
        self._partial_epoch: dict[tuple, int] = {}                     # key -> its epoch
        self.barriers: dict[int, dict[int, bool]] = {}                  # step -> {src rank: has work}
        self.barrier_floor = 0                                           # flags of steps below are stale
        self._barrier_ready: dict[int, float] = {}                      # step -> latest ready_ns of its flags
        self.barrier_ready = 0.0     # the last barrier taken: when its slowest rank's device was done (0.0: unsaid)
        self.control: deque[Message] = deque()
        self.epochs: dict[int, int] = {}                                # replica -> newest epoch seen
        self.num_dropped = 0                                             # late messages of old epochs
        self.num_stale_barriers = 0
        self._held: list[tuple[int, int, Message]] = []                # (ready_ns, order, msg): not yet due
        self._order = itertools.count()

    def pump(self, timeout: float | None) -> bool:
        """File everything that has arrived (and is due), waiting up to timeout (None = forever) for the
        first message. True if anything was filed."""
        filed = self._release()
        if self._held and not filed:          # wake when the first held message falls due
            due = max(0.0, (self._held[0][0] - time.monotonic_ns()) / 1e9)
            timeout = due if timeout is None else min(timeout, due)
        msg = self.transport.poll() if filed or (timeout is not None and timeout <= 0) \
            else self.transport.recv(timeout)
        while msg is not None:
            filed |= self.deliver(msg)
            msg = self.transport.poll()
        return self._release() or filed

    def check_alive(self) -> None:
        if self.alive is not None and not self.alive():
            raise CommTimeout("the engine process is gone: giving up the wait")

    def deliver(self, msg: Message) -> bool:
        """File one message taken from the transport elsewhere (or hold it until it is due).
        True if it was filed now."""
        if msg.header.ready_ns and msg.header.ready_ns > time.monotonic_ns():     # 0: no clock read
            heapq.heappush(self._held, (msg.header.ready_ns, next(self._order), msg))
            return False
        self._file(msg)
        return True

    def _release(self) -> bool:
        """File the held messages that are due."""
        if not self._held:
            return False
        now = time.monotonic_ns()
        if self._held[0][0] > now:
            return False
        while self._held and self._held[0][0] <= now:
            self._file(heapq.heappop(self._held)[2])
        return True

    def take_control(self, src: int | None = None, timeout: float | None = None) -> Message | None:
        """The oldest CONTROL message (from src, if given), waiting up to timeout; None if none came."""
        def find():
            for i, m in enumerate(self.control):
                if src is None or m.src == src:
                    del self.control[i]
                    return m
            return None
        return wait_for(self, find, timeout)

    def take_barrier(self, step: int, ranks, timeout: float | None) -> dict[int, bool] | None:
        """Every rank's flag for `step` ({rank: has work}), waiting up to timeout; None if some are missing
        (the flags that came stay filed, so a retry of the same step loses nothing)."""
        if step < self.barrier_floor:
            raise StaleBarrier(f"barrier for step {step} asked after step {self.barrier_floor - 1} completed")
        want = set(ranks)
        if not wait_for(self, lambda: want <= self.barriers.get(step, {}).keys(), timeout):
            return None
        flags = self.barriers.pop(step)
        self.barrier_ready = self._barrier_ready.pop(step, 0.0)
        self.barrier_floor = step + 1
        return flags

    def has_barrier(self, step: int) -> bool:
        """Whether any rank's flag for `step` has been filed (a peer has started that step)."""
        return bool(self.barriers.get(step))

    def advance_epoch(self, replica: int, epoch: int) -> None:
        """`replica` gave up on everything before `epoch`: purge what is filed of older epochs."""
        if epoch <= self.epochs.get(replica, 0):
            return
        self.epochs[replica] = epoch
        keep = [w for w in self.work if not (w.header.replica == replica and w.header.epoch < epoch)]
        self.num_dropped += len(self.work) - len(keep)
        self.work[:] = keep
        for key in [k for k, e in self._partial_epoch.items() if k[0] == replica and e < epoch]:
            self.num_dropped += len(self.partials.pop(key, {}))
            self.arrived_at.pop(key, None)
            self.last_sent.pop(key, None)
            del self._partial_epoch[key]

    def _file(self, msg: Message) -> None:
        h = msg.header
        if h.kind in (Kind.DISPATCH, Kind.COMBINE):
            newest = self.epochs.get(h.replica, 0)
            if h.epoch < newest:
                self.num_dropped += 1
                return
            if h.epoch > newest:
                self.advance_epoch(h.replica, h.epoch)
        if h.kind == Kind.DISPATCH:
            if len(msg.tensors) != 3:
                raise RuntimeError(f"DISPATCH from rank {msg.src} has {len(msg.tensors)} tensors, expected 3")
            self.work.append(WorkItem(msg.src, h, *msg.tensors))
        elif h.kind == Kind.COMBINE:
            got = self.partials.setdefault(h.key, {})
            if msg.src in got:
                raise RuntimeError(f"second COMBINE for {h.key} from rank {msg.src}")
            got[msg.src] = msg.tensors[0]
            # A held partial came at its due time, though the host may have filed it later (busy elsewhere).
            came = h.ready_ns / 1e9 if h.ready_ns else time.monotonic()
            self.arrived_at[h.key] = max(self.arrived_at.get(h.key, 0.0), came)
            self.last_sent[h.key] = max(self.last_sent.get(h.key, 0.0), h.sent_at)
            self._partial_epoch[h.key] = h.epoch
        elif h.kind == Kind.BARRIER:
            self._file_barrier(msg.src, h.seq, bool(h.microbatch))
            if h.ready_ns and h.seq >= self.barrier_floor:
                self._barrier_ready[h.seq] = max(self._barrier_ready.get(h.seq, 0.0), h.ready_ns / 1e9)
        else:
            self.control.append(msg)

    def _file_barrier(self, src: int, step: int, has_work: bool) -> None:
        if step < self.barrier_floor:       # a flag for a step already passed: detected, counted, dropped
            self.num_stale_barriers += 1
            return
        if step > self.barrier_floor + 1:   # a peer can be at most one step ahead of a rank it waits for
            raise StaleBarrier(f"rank {src} sent the flag of step {step} while this rank is at step "
                               f"{self.barrier_floor}: ranks drifted apart")
        # A flag resent for the same step (a retry after a timeout) replaces the first: the latest word counts.
        self.barriers.setdefault(step, {})[src] = has_work

    def forget(self, key: tuple) -> None:
        """Drop the bookkeeping of a combine that has been taken (combine_recv pops the partials)."""
        self.arrived_at.pop(key, None)
        self.last_sent.pop(key, None)
        self._partial_epoch.pop(key, None)


def wait_for(mailbox: Mailbox, find: Callable[[], T], timeout: float | None,
             nap: Callable[[], float | None] = lambda: None) -> T:
    """Pump until find() returns something truthy or timeout (None = forever) passes; returns
    find()'s last value. nap() caps each wait, for conditions that can change with time alone."""
    deadline = None if timeout is None else time.monotonic() + timeout
    mailbox.pump(0)                       # let find() see everything that is already here
    while True:
        found = find()
        if found:
            return found
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            return found
        mailbox.check_alive()
        cap = nap()
        if mailbox.alive is not None:
            cap = ALIVE_CHECK_S if cap is None else min(cap, ALIVE_CHECK_S)
        if cap is not None:
            wait = cap if wait is None else min(wait, cap)
        mailbox.pump(wait)
