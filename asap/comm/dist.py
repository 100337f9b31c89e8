"""torch.distributed transport: point-to-point isend/irecv only, no collectives.

Each peer gets a link with two threads, so the caller never blocks on the wire:
  - a sender thread drains a bounded queue of outgoing messages, in order;
  - a receiver thread keeps one envelope irecv posted for that peer, then
    receives the payload tensors the envelope announces and files the message
    in the shared inbox.
Why threads rather than polling `Work.is_completed()`: gloo only marks p2p work
complete inside `wait()`, and a `wait(timeout)` that times out leaves the
process group unusable, so a blocking wait on a thread is the only safe way.

Envelopes travel with tag ENV_TAG and payloads with DATA_TAG so that they can
never match each other. With NCCL (which ignores tags and runs a pair's ops on
one stream, so a send queued behind a recv can deadlock), envelopes go over a
gloo group and payloads over two NCCL groups, one per direction (lower rank ->
higher rank and back), so each pair stream only ever carries one direction.

close() says goodbye to every peer and waits for every peer's goodbye, so no
peer is left with a message in flight when the process group goes away.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from asap.comm.headers import Header
from asap.comm.transport import (ENVELOPE_BYTES, BufferPool, CommTimeout, Message, Rows, Transport, TransportSpec,
                                 as_bytes, nbytes, pack_envelope, unpack_envelope)

ENV_TAG, DATA_TAG = 0, 1
_IDLE_WAIT = timedelta(days=365)   # an envelope may be a long time coming; that is not an error


@dataclass(frozen=True)
class DistTransportSpec(TransportSpec):
    backend: str = "gloo"               # "gloo" (CPU tensors) or "nccl" (CUDA tensors)
    init_method: str = "tcp://127.0.0.1:29500"
    world_size: int = 1
    device: str = "cpu"                 # "cpu", "cuda" (device LOCAL_RANK, else rank % count) or "cuda:N"
    send_timeout: float = 30.0
    max_inflight: int = 64              # queued, not yet delivered messages per destination
    max_pending: int = 256              # delivered, not yet taken messages (all sources)
    close_timeout: float = 30.0

    def __post_init__(self):
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if (self.backend == "nccl") != self.device.startswith("cuda"):
            raise ValueError(f"backend {self.backend!r} does not go with device {self.device!r}: "
                             "use gloo with cpu, nccl with cuda")
        if self.world_size < 1 or self.max_inflight < 1 or self.max_pending < 1:
            raise ValueError("world_size, max_inflight and max_pending must be >= 1")

    @classmethod
    def from_env(cls, backend: str = "gloo", device: str = "cpu", **kw) -> "DistTransportSpec":
        """For torchrun: reads WORLD_SIZE, MASTER_ADDR, MASTER_PORT; connect with int(os.environ['RANK'])."""
        env = os.environ
        return cls(backend=backend, init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                   world_size=int(env["WORLD_SIZE"]), device=device, **kw)

    def connect(self, rank: int) -> "DistTransport":
        return DistTransport(self, rank)


class DistTransport(Transport):
    def __init__(self, spec: DistTransportSpec, rank: int):
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} out of range for world_size {spec.world_size}")
        self.rank, self.world_size, self.send_timeout = rank, spec.world_size, spec.send_timeout
        self._spec = spec
        self.device = _pick_device(spec.device, rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(spec.backend, init_method=spec.init_method,
                                world_size=spec.world_size, rank=rank)
        # Group creation is collective, once, at start-up; the data path never is.
        if spec.backend == "nccl":
            self._ctrl = dist.new_group(backend="gloo")
            self._up, self._down = dist.new_group(backend="nccl"), dist.new_group(backend="nccl")
        else:
            self._ctrl = self._up = self._down = dist.group.WORLD
        self._cv = threading.Condition()
        self._inbox: deque[Message] = deque()
        self._send_waiting = False   # a blocked send lets the inbox grow past max_pending
        self._closing = False
        self.closed_peers: set[int] = set()   # peers that said goodbye
        self._error: BaseException | None = None
        self._outq = {p: queue.Queue(maxsize=spec.max_inflight) for p in self._peers()}
        self._threads = []
        for p in self._peers():
            for target in (self._send_loop, self._recv_loop):
                th = threading.Thread(target=self._guard, args=(target, p), daemon=True,
                                      name=f"asap-{target.__name__[1:5]}-{rank}-{p}")
                th.start()
                self._threads.append(th)

    def _peers(self):
        return [p for p in range(self.world_size) if p != self.rank]

    def _data_group(self, src: int, dst: int):
        return self._up if src < dst else self._down

    # ---- caller side ---------------------------------------------------
    def send(self, dst: int, header: Header, tensors: list[torch.Tensor]) -> None:
        self._check_dst(dst)
        self._raise_if_failed()
        envelope = pack_envelope(header, tensors)
        # Copy now so the caller may reuse its buffers at once, as with the shm transport
        # (a Rows gathers into a fresh tensor: that is the copy).
        payload = [as_bytes(t).to(self.device, copy=not isinstance(t, Rows)) for t in tensors if t.numel()]
        ready = None
        if self.device.type == "cuda":   # the sender thread's stream must wait for these copies
            ready = torch.cuda.Event()
            ready.record()
        item, q = (envelope, payload, ready), self._outq[dst]
        try:
            q.put_nowait(item)
            return
        except queue.Full:
            pass
        with self._cv:
            self._send_waiting = True
            self._cv.notify_all()
        try:
            q.put(item, timeout=self.send_timeout)
        except queue.Full:
            raise CommTimeout(f"rank {self.rank}: {q.maxsize} messages to rank {dst} still unsent "
                              f"after {self.send_timeout}s") from None
        finally:
            with self._cv:
                self._send_waiting = False

    def poll(self) -> Message | None:
        return self.recv(0.0)

    def recv(self, timeout: float | None) -> Message | None:
        with self._cv:
            self._cv.wait_for(lambda: self._inbox or self._error, timeout)
            if self._inbox:
                self._cv.notify_all()          # room again for a receiver thread
                return self._inbox.popleft()
        self._raise_if_failed()
        return None

    def close(self) -> None:
        if self._closing:
            return
        deadline = time.monotonic() + self._spec.close_timeout
        for q in self._outq.values():
            try:                               # goodbye, after everything already queued
                q.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass                           # that peer is stuck or gone; do not wait on it forever
        with self._cv:
            self._closing = True               # from here on, arrivals are dropped, not queued
            self._cv.notify_all()
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        dist.destroy_process_group()

    def _raise_if_failed(self):
        if self._error is not None:
            raise RuntimeError(f"rank {self.rank}: a peer link failed") from self._error

    # ---- link threads --------------------------------------------------
    def _guard(self, target, peer: int) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)   # the current device is per thread
            target(peer)
        except BaseException as e:                 # surfaced on the caller's next send/recv
            with self._cv:
                if self._error is None and not self._closing:
                    self._error = e
                self._cv.notify_all()

    def _send_loop(self, dst: int) -> None:
        group = self._data_group(self.rank, dst)
        while True:
            item = self._outq[dst].get()
            if item is None:
                dist.isend(torch.frombuffer(pack_envelope(None, []), dtype=torch.uint8), dst,
                           group=self._ctrl, tag=ENV_TAG).wait()
                return
            envelope, payload, ready = item
            if ready is not None:
                torch.cuda.current_stream().wait_event(ready)
            works = [dist.isend(torch.frombuffer(envelope, dtype=torch.uint8), dst, group=self._ctrl, tag=ENV_TAG)]
            works += [dist.isend(b, dst, group=group, tag=DATA_TAG) for b in payload]
            for w in works:
                w.wait()

    def _recv_loop(self, src: int) -> None:
        group = self._data_group(src, self.rank)
        envelope = torch.empty(ENVELOPE_BYTES, dtype=torch.uint8)
        # One small pool per link (this thread only); on a GPU the caching allocator already reuses.
        pool = BufferPool(max_buffers=4, max_bytes=128 << 20) if self.device.type == "cpu" else None
        while True:
            dist.irecv(envelope, src, group=self._ctrl, tag=ENV_TAG).wait(_IDLE_WAIT)
            header, layout = unpack_envelope(envelope.numpy())
            if header is None:
                with self._cv:
                    self.closed_peers.add(src)
                    self._cv.notify_all()
                return                                   # the peer closed; nothing more will come
            tensors = []
            for dtype, shape in layout:
                n = nbytes(dtype, shape)
                buf = pool.take(torch.uint8, (n,)) if pool else torch.empty(n, dtype=torch.uint8, device=self.device)
                if buf.numel():
                    dist.irecv(buf, src, group=group, tag=DATA_TAG).wait()
                tensors.append(buf.view(dtype).reshape(shape))
            if self.device.type == "cuda":   # hand over finished tensors, whatever stream the caller uses
                torch.cuda.current_stream().synchronize()
            self._deliver(Message(src, header, tensors))

    def _deliver(self, msg: Message) -> None:
        with self._cv:
            self._cv.wait_for(lambda: len(self._inbox) < self._spec.max_pending
                              or self._send_waiting or self._closing)
            if not self._closing:
                self._inbox.append(msg)
                self._cv.notify_all()


def _pick_device(device: str, rank: int) -> torch.device:
    if device == "cuda":
        local = os.environ.get("LOCAL_RANK")
        return torch.device("cuda", int(local) if local is not None else rank % torch.cuda.device_count())
    return torch.device(device)
