"""Mailboxes stay bounded: late answers of abandoned epochs are purged; barrier flags are checked by step."""
from collections import deque

import pytest
import torch

from asap.comm.headers import Header, Kind, barrier
from asap.comm.mailbox import Mailbox, StaleBarrier
from asap.comm.transport import Message
from asap.workers.spans import SpanRecorder


class Wire:
    """A transport whose incoming messages the test puts in by hand."""
    rank, world_size = 0, 4

    def __init__(self):
        self.inbox = deque()

    def poll(self):
        return self.inbox.popleft() if self.inbox else None

    def recv(self, timeout):
        return self.poll()


def _dispatch(src, replica, seq, epoch):
    h = Header(Kind.DISPATCH, replica, 0, 0, seq, 1, epoch=epoch)
    return Message(src, h, [torch.zeros(1, 4), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2)])


def _combine(src, replica, seq, epoch):
    return Message(src, Header(Kind.COMBINE, replica, 0, 0, seq, 1, epoch=epoch), [torch.zeros(1, 4)])


def test_the_epoch_travels_in_the_header():
    h = Header(Kind.DISPATCH, 3, 1, 0, 9, 5, epoch=7)
    assert Header.decode(h.encode()) == h


def test_a_new_epoch_purges_older_work_and_late_answers_are_dropped():
    wire = Wire()
    mb = Mailbox(wire)
    wire.inbox.extend([_dispatch(1, 1, 0, 0), _dispatch(1, 1, 1, 0), _dispatch(2, 2, 0, 0)])
    mb.pump(0)
    assert len(mb.work) == 3
    wire.inbox.append(_dispatch(1, 1, 2, 1))         # replica 1 gave up on epoch 0
    mb.pump(0)
    assert [(w.header.replica, w.header.epoch) for w in mb.work] == [(2, 0), (1, 1)]
    wire.inbox.append(_dispatch(1, 1, 1, 0))         # a late dispatch of the abandoned epoch
    mb.pump(0)
    assert len(mb.work) == 2 and mb.num_dropped == 3


def test_advance_epoch_purges_partials_of_the_abandoned_step_and_keeps_later_ones_out():
    wire = Wire()
    mb = Mailbox(wire)
    wire.inbox.extend([_combine(5, 0, 0, 0), _combine(6, 0, 1, 0)])
    mb.pump(0)
    assert len(mb.partials) == 2 and len(mb.arrived_at) == 2
    mb.advance_epoch(0, 1)                           # replica 0 timed out
    assert mb.partials == {} and mb.arrived_at == {}
    wire.inbox.append(_combine(7, 0, 0, 0))          # an answer that comes after the timeout
    mb.pump(0)
    assert mb.partials == {} and mb.num_dropped == 3
    wire.inbox.append(_combine(7, 0, 4, 1))          # the new epoch's answers are kept
    mb.pump(0)
    assert list(mb.partials) == [(0, 0, 0, 4)]


def test_barrier_flags_are_taken_by_step_and_a_retry_loses_nothing():
    wire = Wire()
    mb = Mailbox(wire)
    wire.inbox.extend([Message(1, barrier(1, 0, False), []), Message(2, barrier(2, 1, True), [])])
    assert mb.take_barrier(0, [0, 1], timeout=0) is None          # rank 0's own flag is missing
    wire.inbox.append(Message(0, barrier(0, 0, True), []))
    assert mb.take_barrier(0, [0, 1], timeout=0) == {0: True, 1: False}
    # rank 2 was one step ahead; its flag waited for step 1
    wire.inbox.extend([Message(0, barrier(0, 1, False), []), Message(1, barrier(1, 1, False), [])])
    assert mb.take_barrier(1, [0, 1, 2], timeout=0) == {0: False, 1: False, 2: True}


def test_stale_and_drifted_flags_are_detected_not_consumed():
    wire = Wire()
    mb = Mailbox(wire)
    for r in (0, 1):
        wire.inbox.append(Message(r, barrier(r, 0, False), []))
    assert mb.take_barrier(0, [0, 1], timeout=0) is not None
    wire.inbox.append(Message(1, barrier(1, 0, True), []))       # a resent flag of a step already passed
    mb.pump(0)
    assert mb.num_stale_barriers == 1 and 0 not in mb.barriers
    with pytest.raises(StaleBarrier, match="step 0"):
        mb.take_barrier(0, [0, 1], timeout=0)
    wire.inbox.append(Message(1, barrier(1, 3, True), []))       # two steps ahead: ranks drifted apart
    with pytest.raises(StaleBarrier, match="drifted"):
        mb.pump(0)


def test_spans_wait_in_a_bounded_ring():
    rec = SpanRecorder("w", capacity=4)
    for i in range(10):
        rec.add("compute" if i % 2 else "stall", float(i), i + 0.5)
    assert len(rec.pending) == 4 and rec.num_dropped == 6
    assert rec.take(force=True) == [("stall", 6.0, 6.5), ("compute", 7.0, 7.5), ("stall", 8.0, 8.5),
                                    ("compute", 9.0, 9.5)]
    assert len(rec.pending) == 0
