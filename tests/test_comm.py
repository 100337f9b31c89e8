"""Promises of asap.comm across real processes, for both transports (shm and gloo).

One 4-rank cluster of spawned processes per transport serves every test in this
file (starting torch in a process costs seconds); each test hands the ranks
named scenario functions and checks what they report. Single-process promises
(ring arithmetic, primitives bookkeeping) live in test_comm_shm.py and test_comm_primitives.py.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import queue
import socket
import time
import traceback

import pytest
import torch

from asap.comm import (CombineInbox, CommTimeout, DistTransportSpec, Header, Kind, Mailbox,
                       ShmTransportSpec, WorkQueue, combine_recv, combine_send, dispatch_recv, dispatch_send)

WORLD = 4
RING_BYTES = 32 << 10          # small, so streams wrap the rings many times
D, E, K = 16, 8, 2             # hidden size, experts, top-k for the dispatch scenario


# ---- payloads: deterministic per (src, i), so the receiver can rebuild them ----

def payload(src: int, i: int) -> tuple[Header, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(src * 100003 + i)
    rows = (i * 7 + src) % 13                      # includes 0-row messages
    tensors = [torch.randn(rows * 4, 16, generator=g),               # varied sizes: 0..3 KB
               torch.randn(rows, 3, generator=g).to(torch.bfloat16),
               torch.randn(2, rows, 2, generator=g).half(),
               torch.randint(-5, 5, (rows, 4), generator=g),
               torch.randint(0, 9, (rows,), generator=g, dtype=torch.int32),
               torch.rand(3, generator=g) > 0.5,
               torch.tensor(float(i))]                               # 0-dim
    header = Header(Kind.CONTROL, src, i % 5, i % 3, i, rows,
                    deadline=math.inf if i % 2 else 1e6 + i, sent_at=float(i), ready_ns=-i)
    return header, tensors


def check_payload(msg, src: int, i: int) -> None:
    header, tensors = payload(src, i)
    assert msg.src == src and msg.header == header
    assert len(msg.tensors) == len(tensors)
    for got, want in zip(msg.tensors, tensors):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


# ---- scenarios: run inside the rank processes --------------------------------

def sc_send(t, dst, n):
    for i in range(n):
        t.send(dst, *payload(t.rank, i))
    return n


def sc_receive(t, counts, timeout=30.0):
    """Receive counts[src] messages from each src, in per-source order; then nothing more."""
    seen = {src: 0 for src in counts}
    while seen != counts:
        msg = t.recv(timeout)
        assert msg is not None, f"stalled at {seen}, wanted {counts}"
        check_payload(msg, msg.src, seen[msg.src])
        seen[msg.src] += 1
    assert t.recv(0.2) is None
    return seen


def sc_recv_nothing(t, timeout):
    t0 = time.monotonic()
    msg = t.recv(timeout)
    return msg is None and t.poll() is None, time.monotonic() - t0


def sc_fill(t, dst, send_timeout):
    """Send until the destination's buffer is full and send gives up; how many went, how long the last took."""
    old, t.send_timeout = t.send_timeout, send_timeout
    try:
        for i in range(10_000):
            t0 = time.monotonic()
            try:
                t.send(dst, *payload(t.rank, 12))        # a few KB
            except CommTimeout:
                return i, time.monotonic() - t0
    finally:
        t.send_timeout = old
    raise AssertionError("send never blocked")


def sc_drain(t, n):
    for _ in range(n):
        msg = t.recv(10.0)
        assert msg is not None
        check_payload(msg, msg.src, 12)
    assert t.recv(0.3) is None
    return n


class Newest:
    """Selector that runs the most recently sent item: forces out-of-order expert work."""

    def select(self, ready, now):
        return [max(range(len(ready)), key=lambda i: ready[i].sent_at)]


def expected_output(x, ids, w):
    # Expert e computes (e + 1) * x; a token's output is the weighted sum over its top-k.
    return x * (w * (ids + 1)).sum(1, keepdim=True)


def sc_attention(t, experts, num_layers, seed):
    """Push 4 micro-batches per layer, collect the combines in reverse order, feed results onward."""
    inbox = CombineInbox(Mailbox(t))
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, D, generator=g) for n in (5, 9, 0, 3)]
    seq = 0
    for layer in range(num_layers):
        pending = []
        for mb, x in enumerate(xs):
            n_exp = E // 2 if layer == 1 else E      # layer 1: everything to the first expert rank
            ids = torch.rand(x.shape[0], n_exp, generator=g).topk(K, dim=1).indices
            w = torch.rand(x.shape[0], K, generator=g)
            dest = experts[0] + ids // (E // 2)
            always = experts if layer == 1 else ()   # ...but the other rank still gets (empty) messages
            p = dispatch_send(t, x, ids, w, dest, replica=t.rank, layer=layer, microbatch=mb, seq=seq,
                              always_to=always)
            pending.append((p, expected_output(x, ids, w)))
            seq += 1
        for mb in reversed(range(len(xs))):
            p, want = pending[mb]
            y = combine_recv(inbox, p, timeout=30.0)
            torch.testing.assert_close(y, want)
            xs[mb] = y / (1 + y.abs())   # layer l+1 depends on layer l, as in a model
    for e in experts:
        t.send(e, Header(Kind.CONTROL, t.rank, 0, 0, 0, 0), [])
    return seq


def sc_expert(t, num_attention):
    mailbox = Mailbox(t)
    work, done, counts = WorkQueue(mailbox), 0, {"items": 0, "empty": 0}
    while done < num_attention:
        for item in dispatch_recv(work, timeout=0.05, selector=Newest()):
            assert (item.topk_weights[item.topk_ids < 0] == 0).all()
            assert ((item.topk_ids < 0) | (2 + item.topk_ids // (E // 2) == t.rank)).all()
            combine_send(t, item, expected_output(item.x, item.topk_ids, item.topk_weights))
            counts["items"] += 1
            counts["empty"] += item.header.num_tokens == 0
        while mailbox.take_control(timeout=0) is not None:
            done += 1
    return counts


SCENARIOS = {f.__name__: f for f in (sc_send, sc_receive, sc_recv_nothing, sc_fill, sc_drain,
                                     sc_attention, sc_expert)}


def rank_main(spec, rank, commands, results):
    t = spec.connect(rank)
    results.put((rank, True, "ready"))
    while (cmd := commands.get()) is not None:
        name, args = cmd
        try:
            results.put((rank, True, SCENARIOS[name](t, *args)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
    t.close()


# ---- the cluster: started once per transport, always stopped ----------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, kind: str):
        self.kind = kind
        if kind == "shm":
            self.spec = ShmTransportSpec(WORLD, ring_bytes=RING_BYTES, send_timeout=20.0)
        else:
            self.spec = DistTransportSpec("gloo", f"tcp://127.0.0.1:{free_port()}", WORLD,
                                          send_timeout=20.0, max_inflight=4, max_pending=8, close_timeout=10.0)
        ctx = mp.get_context("spawn")
        self.commands = [ctx.Queue() for _ in range(WORLD)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=rank_main, args=(self.spec, r, self.commands[r], self.results),
                                  daemon=True) for r in range(WORLD)]
        try:
            for p in self.procs:
                p.start()
            self._collect(set(range(WORLD)), timeout=90.0)
        except BaseException:
            self.close()
            raise

    def call(self, jobs: dict[int, tuple], timeout: float = 45.0) -> dict:
        """Run jobs {rank: (scenario, *args)} concurrently; their return values by rank."""
        for r, (name, *args) in jobs.items():
            self.commands[r].put((name, tuple(args)))
        return self._collect(set(jobs), timeout)

    def _collect(self, ranks, timeout):
        out, deadline = {}, time.monotonic() + timeout
        while len(out) < len(ranks):
            try:
                r, ok, value = self.results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                raise TimeoutError(f"ranks {sorted(ranks - out.keys())} did not answer; dead: {dead}") from None
            if not ok:
                raise AssertionError(f"rank {r} failed:\n{value}")
            out[r] = value
        return out

    def close(self):
        for q in self.commands:
            q.put(None)
        deadline = time.monotonic() + 20.0
        for p in self.procs:
            if p.pid is not None:
                p.join(max(0.1, deadline - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join(5.0)
        self.spec.cleanup()


@pytest.fixture(scope="module", params=["shm", "gloo"])
def cluster(request):
    c = Cluster(request.param)
    yield c
    c.close()


pytestmark = pytest.mark.timeout(150)


def test_messages_from_three_senders_arrive_intact_in_per_sender_order(cluster):
    # 150 messages of 0..3 KB per sender through 32 KB rings: every ring wraps many times.
    n = 150
    out = cluster.call({0: ("sc_receive", {1: n, 2: n, 3: n}), 1: ("sc_send", 0, n),
                        2: ("sc_send", 0, n), 3: ("sc_send", 0, n)})
    assert out[0] == {1: n, 2: n, 3: n}


def test_recv_returns_none_after_its_timeout(cluster):
    (nothing, waited), = cluster.call({0: ("sc_recv_nothing", 0.3)}).values()
    assert nothing and 0.25 <= waited < 5.0


def test_send_to_a_receiver_that_does_not_read_times_out_and_loses_nothing(cluster):
    sent, waited = cluster.call({1: ("sc_fill", 0, 0.4)})[1]
    assert sent >= 1 and 0.35 <= waited < 5.0
    assert cluster.call({0: ("sc_drain", sent)})[0] == sent


def test_dispatch_expert_combine_round_trip_with_out_of_order_work(cluster):
    out = cluster.call({0: ("sc_attention", (2, 3), 3, 10), 1: ("sc_attention", (2, 3), 3, 11),
                        2: ("sc_expert", 2), 3: ("sc_expert", 2)})
    assert out[0] == out[1] == 12
    # Layer 1 routes everything to rank 2 with always_to=(2, 3): rank 3 answers 4 empty
    # dispatches per replica, rank 2 only the empty micro-batch's; nothing else is empty.
    assert out[3]["empty"] == 8 and out[2]["empty"] == 2
