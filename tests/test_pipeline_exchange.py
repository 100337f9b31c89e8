"""The all-to-all exchange: dispatch never waits for peers (so two-batch overlap can hide it), serving is
collective, and a missing rank is a clear timeout naming who is missing."""
import math
import threading
import time

import pytest
import torch

from asap.comm import CommTimeout, Mailbox, ShmTransportSpec
from asap.comm.loopback import Loopback
from asap.model.stages import StageOut
from asap.workers.exchange import AllToAll
from asap.workers.spans import SpanRecorder

D, K = 4, 2


class Doubling:
    """An expert shard whose output is 2x its input, whatever the experts."""
    def __init__(self):
        self.batches = []

    def inputs_ready(self, t):
        pass

    def done_at(self):
        return time.monotonic()

    def experts(self, layer, x, topk_ids, topk_weights):
        self.batches.append((layer, x.shape[0]))
        return 2 * x


def _out(T, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g)
    ids = torch.stack([torch.arange(T) % 2, (torch.arange(T) + 1) % 2], 1)   # every token on both ranks
    return StageOut(h=x, x=x, topk_ids=ids, topk_weights=torch.full((T, K), 0.5))


@pytest.fixture
def two_ranks():
    spec = ShmTransportSpec(2, ring_bytes=1 << 20, send_timeout=2.0)
    ts = [Loopback(spec.connect(r)) for r in range(2)]
    computes = [Doubling(), Doubling()]
    ex = [AllToAll(t, Mailbox(t), lambda layer, ids: ids, r, computes[r], SpanRecorder(f"r{r}"))
          for r, t in enumerate(ts)]
    yield ex, computes
    for t in ts:
        t.close()
    spec.cleanup()


@pytest.mark.timeout(30)
def test_dispatch_returns_before_any_peer_dispatched_and_combine_is_the_collective(two_ranks):
    ex, computes = two_ranks
    for e in ex:
        e.begin_step(3)
    t0 = time.monotonic()
    ex[0].dispatch(0, 1, _out(5, 0), math.inf, time.monotonic())        # rank 1 has not dispatched anything yet: no wait
    ex[0].dispatch(1, 1, _out(3, 1), math.inf, time.monotonic())        # the next micro-batch goes out at once too (TBO)
    assert time.monotonic() - t0 < 1.0
    outs = {}

    def rank1():
        ex[1].dispatch(0, 1, _out(2, 2), math.inf, time.monotonic())
        ex[1].dispatch(1, 1, _out(4, 3), math.inf, time.monotonic())
        outs[1] = [ex[1].combine(0, 1, 10), ex[1].combine(1, 1, 10)]
    th = threading.Thread(target=rank1)
    th.start()
    outs[0] = [ex[0].combine(0, 1, 10), ex[0].combine(1, 1, 10)]
    th.join()
    for r, seeds in ((0, (0, 1)), (1, (2, 3))):
        for got, seed, T in zip(outs[r], seeds, ((5, 3) if r == 0 else (2, 4))):
            # each token went to both ranks, each returned 2x: the sum is 4x
            assert torch.allclose(got, 4 * _out(T, seed).x)
    # each rank served each (layer, micro-batch) once, as one batch of both ranks' tokens, in order
    assert computes[0].batches == [(1, 7), (1, 7)] and computes[1].batches == [(1, 7), (1, 7)]


@pytest.mark.timeout(30)
def test_a_rank_that_never_dispatches_is_a_timeout_naming_it(two_ranks):
    ex, _ = two_ranks
    ex[0].begin_step(0)
    ex[0].dispatch(0, 0, _out(2, 0), math.inf, time.monotonic())
    with pytest.raises(CommTimeout, match=r"dispatches from \[0\] of 2 ranks"):
        ex[0].combine(0, 0, 0.2)
    assert len(ex[0].mailbox.work) == 1          # its own share of the dispatch, never served
    ex[0].abandon()                              # a new epoch: what is left of the old one goes
    assert ex[0].mailbox.work == [] and ex[0].mailbox.num_dropped == 1


def test_work_of_a_step_given_up_on_is_purged_at_the_next_step(two_ranks):
    ex, _ = two_ranks
    ex[1].begin_step(0)
    ex[1].dispatch(0, 0, _out(2, 0), math.inf, time.monotonic())           # rank 1's step 0 dispatch reaches rank 0 ...
    time.sleep(0.05)
    ex[0].mailbox.pump(0.5)
    assert len(ex[0].mailbox.work) == 1
    ex[0].begin_step(1)                        # ... but rank 0 has moved on to step 1
    assert ex[0].mailbox.work == [] and ex[0].mailbox.num_dropped == 1
