"""Single-process promises of asap.comm's transports: ring arithmetic, shm resource hygiene,
and the torch.distributed spec. Several shm ranks live in this one process (the `ranks`
fixture, conftest.py). The wire format is in test_comm_wire.py, cross-process behaviour in
test_comm.py, the dispatch/combine bookkeeping in test_comm_primitives.py."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from asap.comm import CommTimeout, Header, Kind, ShmTransportSpec
from asap.comm.ring import Ring
from asap.comm.transport import MAX_DIMS, MAX_TENSORS

pytestmark = pytest.mark.timeout(60)


def h(**kw):
    base = dict(kind=Kind.CONTROL, replica=0, layer=0, microbatch=0, seq=0, num_tokens=0)
    return Header(**{**base, **kw})


# ---- messages through the shm transport ----

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


def test_a_full_ring_send_gives_up_soon_once_the_engine_is_gone(ranks):
    ranks[0].send_timeout = 30.0
    ranks[0].alive = lambda: False             # a worker's engine process has died; its peer will never read
    t0 = time.monotonic()
    with pytest.raises(CommTimeout, match="engine is gone"):
        for _ in range(100):
            ranks[0].send(1, h(), [torch.zeros(2000)])
    assert time.monotonic() - t0 < 5.0         # not the 30 s send timeout


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


def test_segments_of_a_killed_process_group_are_swept_at_the_next_start(tmp_path):
    """A SIGKILL of the whole group runs no cleanup (the resource tracker dies too); the pid in the
    segment names lets the next ShmTransportSpec find and unlink them (issue 15 point 5)."""
    import signal
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from asap.comm import ShmTransportSpec
        spec = ShmTransportSpec(3, ring_bytes=4096)
        print(" ".join(spec.segment_name(p) for p in spec.pairs), flush=True)
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 6 and all(n.startswith(f"asap{proc.pid}_") for n in names)
        assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
        theirs = [n for n in os.listdir("/dev/shm") if f"asap{proc.pid}_" in n]
        assert len(theirs) == 6 + 2 * 3                                  # and two semaphores per rank
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # no cleanup runs: everything leaks until the next start
        proc.wait(30)
    spec = ShmTransportSpec(2, ring_bytes=4096)
    try:
        assert not [n for n in os.listdir("/dev/shm") if f"asap{proc.pid}_" in n]
        assert all(os.path.exists(f"/dev/shm/{spec.segment_name(p)}") for p in spec.pairs)   # ours stay
    finally:
        spec.cleanup()


def test_segments_of_a_live_owner_are_left_alone():
    from asap.comm.shm_names import sweep_dead_segments
    spec = ShmTransportSpec(2, ring_bytes=4096)
    try:
        sweep_dead_segments()
        assert all(os.path.exists(f"/dev/shm/{spec.segment_name(p)}") for p in spec.pairs)
    finally:
        spec.cleanup()


def test_receive_buffers_are_reused_only_once_every_view_is_gone():
    from asap.comm.transport import BufferPool
    pool = BufferPool(max_buffers=2, min_bytes=1024)
    a = pool.take(torch.float32, (1000,))
    ptr = a.data_ptr()
    view = a[10:20]
    del a
    b = pool.take(torch.float32, (1000,))
    assert b.data_ptr() != ptr                    # a view of the first buffer is still alive
    del view
    c = pool.take(torch.bfloat16, (50, 40))
    assert c.data_ptr() == ptr and c.shape == (50, 40) and c.dtype == torch.bfloat16   # reused, warm
    del b, c
    assert pool.take(torch.uint8, (10,)).data_ptr() not in (ptr,)   # small ones are plain allocations


def test_records_never_straddle_the_end_of_the_ring():
    buf = memoryview(bytearray(Ring.segment_bytes(1024)))
    writer, reader = Ring(buf, 1024), Ring(buf, 1024)
    assert writer.reserve(700) is not None
    writer.commit()
    off, n = reader.peek()
    reader.release()
    at = writer.reserve(300)                      # 384 B would run past the end: it starts at 0 instead
    assert at == 64
    writer.commit()
    off, n = reader.peek()
    assert off == 64 and n >= 300
    writer.close(), reader.close()


def test_named_semaphore_counts_times_out_and_pickles_by_name():
    import pickle
    from asap.comm.semaphore import NamedSemaphore
    name = f"/asap{os.getpid()}_{'0' * 8}_d99"
    sem = NamedSemaphore(name, create=True)
    try:
        t0 = time.monotonic()
        assert not sem.acquire(timeout=0.1) and time.monotonic() - t0 >= 0.09
        assert not sem.acquire(block=False)
        other = pickle.loads(pickle.dumps(sem))            # another handle on the same semaphore
        other.release(), other.release()
        assert sem.acquire(block=False) and sem.acquire(timeout=1.0) and not sem.acquire(block=False)
        with pytest.raises(FileExistsError):
            NamedSemaphore(name, create=True)
    finally:
        NamedSemaphore.unlink(name)
    with pytest.raises(FileNotFoundError):
        NamedSemaphore(name)


def test_big_messages_stream_intact_while_the_receiver_copies():
    """A body of >= 256 KiB is read while it is being written (the receiver is woken after the
    envelope); a sender thread keeps writing while this thread copies out."""
    import threading
    from asap.comm.transport import Rows
    spec = ShmTransportSpec(2, ring_bytes=8 << 20, send_timeout=10)
    a, b = spec.connect(0), spec.connect(1)
    g = torch.Generator().manual_seed(0)
    msgs = [(torch.randn(300 + 50 * i, 1024, generator=g).to(torch.bfloat16), torch.randperm(200, generator=g))
            for i in range(6)]

    def send():
        for i, (x, idx) in enumerate(msgs):
            a.send(1, h(seq=i), [x, Rows(x, idx), torch.arange(i + 1)])

    th = threading.Thread(target=send)
    th.start()
    try:
        for i, (x, idx) in enumerate(msgs):
            m = b.recv(10.0)
            assert m.header.seq == i
            assert torch.equal(m.tensors[0], x) and torch.equal(m.tensors[1], x[idx])
            assert torch.equal(m.tensors[2], torch.arange(i + 1))
    finally:
        th.join(10)
        a.close(), b.close()
        spec.cleanup()


def test_a_sender_that_stops_mid_message_is_a_timeout_not_a_hang(ranks):
    from asap.comm.shm import _ENV
    from asap.comm.transport import pack_envelope_into
    ring = ranks[0]._out[1]
    off = ring.reserve(_ENV + 4096)
    pack_envelope_into(ring.mem, ring.base + off, h(), [torch.zeros(1024)])
    ring.progress(_ENV)                           # the envelope is out, the tensor never comes
    ranks[0]._spec._data[1].release()
    ranks[1].send_timeout = 0.3
    t0 = time.monotonic()
    with pytest.raises(CommTimeout, match="in the middle of writing a message"):
        ranks[1].recv(1.0)
    assert time.monotonic() - t0 < 2.0
