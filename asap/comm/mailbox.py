"""The per-process mailbox: one place that drains the transport.

A worker may wait for expert work, combine answers and control messages at
different moments, but they all arrive on one transport. The Mailbox takes
whatever has arrived and files it by kind, so that each waiter only ever looks
at its own pile and no message is lost to the wrong reader:
  DISPATCH -> `work`      (WorkQueue / dispatch_recv, expert side)
  COMBINE  -> `partials`  (CombineInbox / combine_recv, attention side)
  CONTROL  -> `control`   (take_control, FIFO)
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from asap.comm.headers import Header, Kind
from asap.comm.transport import Message, Transport

T = TypeVar("T")


@dataclass
class WorkItem:
    """One dispatch as the expert side sees it (rows = tokens that have >= 1 pair for this rank)."""
    src: int
    header: Header
    x: torch.Tensor             # [T_r, D]
    topk_ids: torch.Tensor      # [T_r, K]; -1 where the pair belongs to another rank
    topk_weights: torch.Tensor  # [T_r, K]; 0 where the pair belongs to another rank


class Mailbox:
    def __init__(self, t: Transport):
        self.transport = t
        self.work: list[WorkItem] = []                                  # arrival order
        self.partials: dict[tuple, dict[int, torch.Tensor]] = {}       # key -> {src rank: partial}
        self.control: deque[Message] = deque()

    def pump(self, timeout: float | None) -> bool:
        """File everything that has arrived, waiting up to timeout (None = forever) for the first
        message. True if anything arrived."""
        msg = self.transport.poll() if timeout is not None and timeout <= 0 else self.transport.recv(timeout)
        if msg is None:
            return False
        while msg is not None:
            self._file(msg)
            msg = self.transport.poll()
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

    def _file(self, msg: Message) -> None:
        h = msg.header
        if h.kind == Kind.DISPATCH:
            if len(msg.tensors) != 3:
                raise RuntimeError(f"DISPATCH from rank {msg.src} has {len(msg.tensors)} tensors, expected 3")
            self.work.append(WorkItem(msg.src, h, *msg.tensors))
        elif h.kind == Kind.COMBINE:
            got = self.partials.setdefault(h.key, {})
            if msg.src in got:
                raise RuntimeError(f"second COMBINE for {h.key} from rank {msg.src}")
            got[msg.src] = msg.tensors[0]
        else:
            self.control.append(msg)


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
        cap = nap()
        if cap is not None:
            wait = cap if wait is None else min(wait, cap)
        mailbox.pump(wait)
