"""One shm rank received from by two threads at once: the sync loop's idle listener receives while the
rank's main thread sends, and a send that finds its ring full drains the rank's inbound rings itself.
Every message must then still arrive exactly once, intact."""
from __future__ import annotations

import threading

import pytest
import torch

from asap.comm import Header, Kind, ShmTransportSpec

pytestmark = pytest.mark.timeout(60)
N = 3000


def _h(seq):
    return Header(Kind.CONTROL, 0, 0, 0, seq, 0)


def test_a_listener_thread_and_a_blocked_sender_on_one_rank_each_get_distinct_intact_messages():
    spec = ShmTransportSpec(3, ring_bytes=64 << 10, send_timeout=10.0)
    r0, r1, r2 = (spec.connect(r) for r in range(3))
    got, lock, stop = [], threading.Lock(), threading.Event()

    def keep(msg):
        with lock:
            got.append((msg.header.seq, msg.tensors[0].clone()))

    def peer():          # rank 1 keeps rank 0's inbound ring busy; messages of a few sizes, some pooled (>= 64 KiB)
        for i in range(N):
            n = 64 if i % 7 else 5000
            r1.send(0, _h(i), [torch.full((n,), float(i))])

    def listener():      # rank 0's second receiver
        while not stop.is_set():
            msg = r0.recv(0.01)
            if msg is not None:
                keep(msg)

    def slow_reader():   # rank 2 reads rank 0's sends slowly, so rank 0's ring to it is often full
        while not stop.is_set():
            if r2.recv(0.01) is not None:
                stop.wait(0.0005)

    threads = [threading.Thread(target=f) for f in (peer, listener, slow_reader)]
    try:
        for t in threads:
            t.start()
        for i in range(300):                     # rank 0's main thread: sends that block and drain
            r0.send(2, _h(i), [torch.zeros(4000)])
        threads[0].join()
        while True:                              # what the blocked sends drained waits in the backlog
            with lock:
                if len(got) >= N:
                    break
            msg = r0.recv(0.5)
            if msg is not None:
                keep(msg)
            elif not threads[1].is_alive():
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
        for t in (r0, r1, r2):
            t.close()
        spec.cleanup()
    seqs = sorted(s for s, _ in got)
    assert seqs == list(range(N)), f"{len(seqs)} messages, {len(set(seqs))} distinct, of {N}"
    assert all(bool((x == s).all()) for s, x in got), "a message arrived with another's contents"
