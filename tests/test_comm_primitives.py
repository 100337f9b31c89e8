"""Single-process promises of asap.comm's dispatch/combine primitives: which rows each
expert rank gets, token order and summation on combine, empty messages, work selection.
Several shm ranks live in this one process (the `ranks` fixture, conftest.py), which
makes arrival order fully controllable."""
from __future__ import annotations

import time

import pytest
import torch

from asap.comm import (CombineInbox, CommTimeout, Header, Kind, Mailbox, WorkQueue,
                       combine_recv, combine_send, dispatch_recv, dispatch_send)

pytestmark = pytest.mark.timeout(60)


# ---- dispatch / combine bookkeeping ----

def route(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, 4, generator=g)
    ids = torch.rand(T, 8, generator=g).topk(2, dim=1).indices
    w = torch.rand(T, 2, generator=g)
    return x, ids, w, 2 + ids // 4


def test_dispatch_sends_each_rank_only_its_rows_with_other_pairs_masked(ranks):
    x, ids, w, dest = route(6)
    dest[0] = -1                                  # token 0 goes nowhere
    p = dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=3, microbatch=1, seq=9, deadline=5.0)
    assert p.key == (0, 3, 1, 9) and p.num_tokens == 6
    for r in (2, 3):
        item, = dispatch_recv(WorkQueue(Mailbox(ranks[r])))
        rows = ((dest == r).any(1)).nonzero().squeeze(1)
        assert torch.equal(p.rows[r], rows) and 0 not in rows.tolist()
        assert item.header.num_tokens == len(rows) and item.header.deadline == 5.0
        assert torch.equal(item.x, x[rows])
        mine = dest[rows] == r
        assert torch.equal(item.topk_ids, torch.where(mine, ids[rows], -1))
        assert torch.equal(item.topk_weights, torch.where(mine, w[rows], 0.0))


def test_combine_restores_token_order_and_sums_in_rank_order(ranks):
    x, ids, w, dest = route(7)
    inbox = CombineInbox(Mailbox(ranks[0]))
    p = dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=0, microbatch=0, seq=0)
    partial = {}
    for r in (3, 2):                              # answers arrive in reverse rank order
        item, = dispatch_recv(WorkQueue(Mailbox(ranks[r])))
        partial[r] = item.x * (r + 0.1)
        combine_send(ranks[r], item, partial[r])
    y = combine_recv(inbox, p, timeout=1.0)
    want = torch.zeros(7, 4)
    for r in (2, 3):
        want[p.rows[r]] += partial[r]
    assert torch.equal(y, want)                   # bit-exact: same summation order


def test_always_to_sends_empty_messages_and_combine_waits_for_them(ranks):
    x, ids, w, dest = route(4)
    dest[:] = 2
    inbox = CombineInbox(Mailbox(ranks[0]))
    p = dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=0, microbatch=0, seq=0, always_to=(2, 3))
    assert sorted(p.rows) == [2, 3] and p.rows[3].numel() == 0
    item2, = dispatch_recv(WorkQueue(Mailbox(ranks[2])))
    combine_send(ranks[2], item2, item2.x)
    with pytest.raises(CommTimeout, match=r"no answer from ranks \[3\]"):
        combine_recv(inbox, p, timeout=0.1)
    item3, = dispatch_recv(WorkQueue(Mailbox(ranks[3])))
    assert item3.x.shape == (0, 4) and item3.topk_ids.shape == (0, 2)
    combine_send(ranks[3], item3, item3.x)
    assert torch.equal(combine_recv(inbox, p, timeout=1.0), x)


def test_everything_to_one_rank_sends_x_as_it_is_and_its_answer_is_the_result(ranks):
    x, ids, w, dest = route(5)
    dest[:] = 3
    inbox = CombineInbox(Mailbox(ranks[0]))
    p = dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=1, microbatch=0, seq=4, deadline=2.0,
                      always_to=(3,), epoch=6)
    assert p.whole and list(p.rows) == [3] and p.rows[3].tolist() == list(range(5))
    assert ranks[2].poll() is None                                 # rank 2 gets nothing
    item, = dispatch_recv(WorkQueue(Mailbox(ranks[3])))
    assert (item.header.num_tokens, item.header.deadline, item.header.epoch, item.header.key) == (5, 2.0, 6, (0, 1, 0, 4))
    assert torch.equal(item.x, x) and torch.equal(item.topk_ids, ids) and torch.equal(item.topk_weights, w)
    combine_send(ranks[3], item, item.x * 2)
    assert torch.equal(combine_recv(inbox, p, timeout=1.0), x * 2)
    later = dispatch_send(ranks[0], x[:3], ids[:3], w[:3], dest[:3], replica=0, layer=1, microbatch=0, seq=5)
    assert later.rows[3].tolist() == [0, 1, 2] and p.rows[3].tolist() == list(range(5))   # token indices are not shared state


def test_batch_routed_nowhere_combines_to_zeros_without_waiting(ranks):
    x, ids, w, dest = route(3)
    p = dispatch_send(ranks[0], x, ids, w, torch.full_like(dest, -1), replica=0, layer=0, microbatch=0, seq=0)
    assert p.rows == {}
    assert torch.equal(combine_recv(CombineInbox(Mailbox(ranks[0])), p, timeout=0), torch.zeros(3, 4))


def test_default_selection_is_oldest_first_merging_same_layer_work(ranks):
    x, ids, w, dest = route(2)
    dest[:] = 2
    for replica, layer in [(0, 5), (1, 6), (0, 6), (1, 5)]:
        dispatch_send(ranks[replica], x, ids, w, dest, replica=replica, layer=layer, microbatch=0, seq=layer)
    q = WorkQueue(Mailbox(ranks[2]))
    first = dispatch_recv(q, timeout=1.0)
    assert [(i.src, i.header.layer) for i in first] == [(0, 5), (1, 5)]
    assert [(i.src, i.header.layer) for i in dispatch_recv(q)] == [(1, 6), (0, 6)]
    t0 = time.monotonic()
    assert dispatch_recv(q, timeout=0.1) == [] and time.monotonic() - t0 >= 0.09


def test_selector_that_waits_is_asked_again_and_bad_answers_are_errors(ranks):
    x, ids, w, dest = route(2)
    dest[:] = 2
    for layer in (0, 1):
        dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=layer, microbatch=0, seq=layer)
    q = WorkQueue(Mailbox(ranks[2]))

    class Patient:                    # holds work back for 50 ms, like an aggregation window
        def __init__(self):
            self.t0 = time.monotonic()

        def select(self, ready, now):
            return [0] if now - self.t0 > 0.05 else []

    t0 = time.monotonic()
    assert len(dispatch_recv(q, timeout=2.0, selector=Patient())) == 1
    assert 0.04 < time.monotonic() - t0 < 1.0
    with pytest.raises(ValueError, match="bad indices"):
        dispatch_recv(q, selector=type("S", (), {"select": lambda self, r, n: [5]})())
    assert len(q) == 1                # a rejected answer takes nothing


def test_take_control_is_fifo_and_filters_by_source(ranks):
    mailbox = Mailbox(ranks[0])
    for src, seq in [(1, 0), (2, 1), (1, 2)]:
        ranks[src].send(0, Header(Kind.CONTROL, replica=0, layer=0, microbatch=0, seq=seq, num_tokens=0), [])
    assert mailbox.take_control(src=2, timeout=1.0).header.seq == 1
    assert [mailbox.take_control(timeout=0).header.seq for _ in range(2)] == [0, 2]
    assert mailbox.take_control(timeout=0.05) is None


def test_partial_of_the_wrong_shape_is_rejected(ranks):
    x, ids, w, dest = route(3)
    dest[:] = 2
    dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=0, microbatch=0, seq=0)
    item, = dispatch_recv(WorkQueue(Mailbox(ranks[2])), timeout=1.0)
    with pytest.raises(ValueError, match=r"partial must be \[3, D\]"):
        combine_send(ranks[2], item, torch.zeros(2, 4))


def test_dispatch_to_a_rank_that_does_not_exist_is_a_clear_error(ranks):
    x, ids, w, dest = route(3)
    dest[1, 0] = 4                                # world_size is 4: ranks 0..3
    with pytest.raises(ValueError, match=r"dest entries must be a rank in \[0, 4\) or -1"):
        dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=0, microbatch=0, seq=0)
    dest[1, 0] = -2
    with pytest.raises(ValueError, match="or -1"):
        dispatch_send(ranks[0], x, ids, w, dest, replica=0, layer=0, microbatch=0, seq=0)
    assert ranks[2].poll() is None and ranks[3].poll() is None     # nothing half-sent


def test_layout_sorts_pairs_by_rank_and_masks_the_others():
    from asap.comm.primitives import dispatch_layout
    dest = torch.tensor([[1, 2], [-1, -1], [2, 2], [0, 1]])
    ids = torch.tensor([[10, 20], [30, 40], [50, 60], [70, 80]])
    lay = dispatch_layout(dest, ids, ids.float(), world_size=3, always_to=(0,))
    assert {r: v.tolist() for r, v in lay.rows.items()} == {0: [3], 1: [0, 3], 2: [0, 2]}
    assert lay.topk_ids[1].tolist() == [[10, -1], [-1, 80]] and lay.topk_ids[2].tolist() == [[-1, 20], [50, 60]]
    assert lay.topk_weights[0].tolist() == [[70.0, 0.0]] and lay.whole is None
    whole = dispatch_layout(torch.full((4, 2), 2), ids, ids.float(), world_size=3, always_to=(1,))
    assert whole.whole == 2 and whole.rows[1].numel() == 0 and whole.topk_ids[2] is ids   # nothing gathered
