"""Single-process promises of asap.comm: ring arithmetic, wire format, shm resource
hygiene and the dispatch/combine bookkeeping. Several shm ranks live in this one
process, which makes arrival order fully controllable. Cross-process behaviour
is in test_comm.py."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from asap.comm import (CombineInbox, CommTimeout, Header, Kind, Mailbox, ShmTransportSpec, WorkQueue,
                       combine_recv, combine_send, dispatch_recv, dispatch_send)
from asap.comm.ring import Ring
from asap.comm.transport import MAX_DIMS, MAX_TENSORS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ranks():
    """Four shm ranks in this process: 0, 1 attention; 2, 3 experts."""
    spec = ShmTransportSpec(4, ring_bytes=64 << 10, send_timeout=0.3)
    ts = [spec.connect(r) for r in range(4)]
    yield ts
    for t in ts:
        t.close()
    spec.cleanup()


def h(**kw):
    base = dict(kind=Kind.CONTROL, replica=0, layer=0, microbatch=0, seq=0, num_tokens=0)
    return Header(**{**base, **kw})


# ---- headers and wire format ----

def test_header_survives_encode_decode_bit_for_bit():
    hd = Header(Kind.COMBINE, 3, 61, 2, 2**40, 7, deadline=math.inf, sent_at=123.456789, aux=-5)
    enc = hd.encode()
    assert enc.dtype == torch.int64 and enc.numel() == 9
    assert Header.decode(enc) == hd
    with pytest.raises(ValueError, match="9 int64 words"):
        Header.decode(enc[:5])


def test_unsupported_messages_are_rejected_with_the_limit_named(ranks):
    with pytest.raises(ValueError, match=f"at most {MAX_TENSORS} tensors"):
        ranks[0].send(1, h(), [torch.zeros(1)] * (MAX_TENSORS + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_DIMS} dims"):
        ranks[0].send(1, h(), [torch.zeros([1] * (MAX_DIMS + 1))])
    with pytest.raises(ValueError, match="not supported"):
        ranks[0].send(1, h(), [torch.zeros(2, dtype=torch.complex64)])
    with pytest.raises(ValueError, match="bad destination"):
        ranks[0].send(0, h(), [])
    assert ranks[1].poll() is None      # nothing half-sent


def test_non_contiguous_tensors_arrive_as_their_values(ranks):
    x = torch.arange(24.0).reshape(4, 6)
    ranks[0].send(1, h(), [x.t(), x[:, ::2]])
    got = ranks[1].recv(1.0).tensors
    assert torch.equal(got[0], x.t()) and torch.equal(got[1], x[:, ::2])


# ---- shared-memory ring ----

def test_ring_wraps_correctly_over_many_varied_records():
    buf = memoryview(bytearray(Ring.segment_bytes(1024)))
    writer, reader = Ring(buf, 1024), Ring(buf, 1024)
    rng = random.Random(0)
    queued, written = [], 0
    while written < 3000:
        part = torch.randint(0, 256, (rng.randint(0, 300),), dtype=torch.uint8)
        if writer.try_write([part]):
            queued.append(part)
            written += 1
        else:                             # full: the reader catches up partway
            for _ in range(rng.randint(1, len(queued))):
                body = reader.read()
                want = queued.pop(0)
                assert torch.equal(body[:want.numel()], want)
    while queued:
        assert torch.equal(reader.read()[:queued[0].numel()], queued.pop(0))
    assert reader.read() is None and int(writer._ctrl[0]) > 50 * 1024   # wrapped dozens of times
    writer.close(), reader.close()


def test_message_bigger_than_the_ring_names_both_sizes():
    spec = ShmTransportSpec(2, ring_bytes=4096)
    try:
        t = spec.connect(0)
        with pytest.raises(ValueError, match=r"needs \d+ bytes but the ring holds only 4096"):
            t.send(1, h(), [torch.zeros(2000)])
        t.close()
    finally:
        spec.cleanup()


def test_full_ring_send_times_out(ranks):
    ranks[0].send_timeout = 0.2
    with pytest.raises(CommTimeout, match="to rank 1 stayed full"):
        for _ in range(100):
            ranks[0].send(1, h(), [torch.zeros(2000)])


def test_blocked_sender_keeps_draining_its_own_inbound_rings(ranks):
    # Rank 0 fills its ring to 1 while rank 1's messages wait on 0's ring; the
    # blocked send must take them off (into a backlog) rather than leave both stuck.
    for i in range(5):
        ranks[1].send(0, h(seq=i), [torch.zeros(2000)])
    ranks[0].send_timeout = 0.2
    with pytest.raises(CommTimeout):
        for _ in range(100):
            ranks[0].send(1, h(), [torch.zeros(2000)])
    assert ranks[1]._out[0].used() == 0
    assert [ranks[0].poll().header.seq for _ in range(5)] == list(range(5))


def test_recv_waits_for_its_timeout_and_poll_does_not(ranks):
    t0 = time.monotonic()
    assert ranks[0].poll() is None
    assert time.monotonic() - t0 < 0.05
    assert ranks[0].recv(0.2) is None
    assert time.monotonic() - t0 >= 0.19


def test_cleanup_unlinks_every_segment_and_spec_pickles_without_them():
    import pickle
    spec = ShmTransportSpec(3, ring_bytes=4096, pairs=[(0, 1), (1, 0), (2, 0)])
    names = [spec.segment_name(p) for p in spec.pairs]
    assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
    from multiprocessing.context import set_spawning_popen
    set_spawning_popen(object())   # pretend to spawn, as Process.start does: semaphores may pickle then
    try:
        assert pickle.loads(pickle.dumps(spec))._owned == []
    finally:
        set_spawning_popen(None)
    with pytest.raises(ValueError, match="no ring from rank 2 to 1"):
        spec.connect(2).send(1, h(), [])
    spec.cleanup()
    spec.cleanup()     # idempotent
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)


def test_spawned_worker_leaves_no_leak_warnings(tmp_path):
    code = textwrap.dedent("""
        import multiprocessing as mp, torch
        from asap.comm import ShmTransportSpec, Header, Kind
        def child(spec):
            t = spec.connect(1)
            t.send(0, Header(Kind.CONTROL, 0, 0, 0, 0, 0), [torch.ones(3)])
            t.close()
        if __name__ == "__main__":
            spec = ShmTransportSpec(2, ring_bytes=4096)
            p = mp.get_context("spawn").Process(target=child, args=(spec,))
            p.start()
            t = spec.connect(0)
            assert torch.equal(t.recv(30).tensors[0], torch.ones(3))
            p.join(30)
            t.close()
            spec.cleanup()
            print("done")
    """)
    script = tmp_path / "spawn_one.py"       # spawn re-imports the main module, so it needs a file
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=45)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr
    assert "leaked" not in out.stderr and "resource_tracker" not in out.stderr, out.stderr


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
        ranks[src].send(0, h(seq=seq), [])
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


# ---- torch.distributed spec (the transport itself runs in test_comm.py) ----

def test_dist_spec_reads_torchrun_environment(monkeypatch):
    from asap.comm import DistTransportSpec
    for k, v in {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29611"}.items():
        monkeypatch.setenv(k, v)
    spec = DistTransportSpec.from_env(max_inflight=5)
    assert (spec.backend, spec.init_method, spec.world_size, spec.device, spec.max_inflight) == \
        ("gloo", "tcp://10.0.0.7:29611", 8, "cpu", 5)


def test_dist_spec_rejects_backend_device_mismatch():
    from asap.comm import DistTransportSpec
    with pytest.raises(ValueError, match="use gloo with cpu, nccl with cuda"):
        DistTransportSpec("nccl", "tcp://127.0.0.1:1", 2, device="cpu")
    with pytest.raises(ValueError, match="backend must be"):
        DistTransportSpec("mpi")
