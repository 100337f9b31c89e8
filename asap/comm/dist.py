"""torch.distributed transport: batched point-to-point, one communication thread per rank.

Every rank's thread runs the same rounds with every live peer, on one process
group (gloo on CPU, NCCL on GPU; the same code path on both):
  1. headers: a fixed-size block to and from each peer in one batch_isend_irecv:
     up to SLOTS message envelopes (asap.comm.transport), a goodbye mark, and
     whether this rank takes payloads this round (its inbox has room);
  2. payloads: one batch_isend_irecv of the tensors those envelopes announce, to
     peers that said they take them; a message a peer did not take stays at the
     head of its queue for the next round (per-peer flow control, no blocking).
All p2p work is issued from this one thread in the same order on every rank,
so NCCL never sees two threads or two communicators racing (which can hang it),
and headers need no second (gloo) group. On a GPU the thread works on its own
CUDA stream, so communication overlaps the compute stream. An idle rank waits
a little between empty rounds (woken at once by a send), so idle rounds cost
no busy CPU.

close() says goodbye to every peer; a pair is dropped after the round in
which either side said goodbye, so no peer is left with a message in flight
when the process group goes away.
"""
from __future__ import annotations

import os
import queue
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asap.comm.headers import Header
from asap.comm.transport import (ENVELOPE_BYTES, BufferPool, CommTimeout, Message, Rows, Transport, TransportSpec,
                                 as_bytes, nbytes, pack_envelope_into, unpack_envelope)

SLOTS = 8                                   # messages per peer per round
_BLOCK_HEAD = struct.Struct("<qq")          # count (-1: goodbye), takes payloads (0/1)
BLOCK_BYTES = _BLOCK_HEAD.size + SLOTS * ENVELOPE_BYTES
_IDLE_MAX_S = 0.0005                        # longest nap between empty rounds


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
        # The caller's stream, which reads what arrives: received buffers are made on the communication
        # thread's stream and recorded on this one, so their memory is not reused while its kernels read it.
        self._consumer = None
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self._consumer = torch.cuda.current_stream(self.device)
        dist.init_process_group(spec.backend, init_method=spec.init_method,
                                world_size=spec.world_size, rank=rank)
        self._cv = threading.Condition()
        self._inbox: deque[Message] = deque()
        self._send_waiting = False   # a blocked send lets the inbox grow past max_pending
        self._closing = False        # close() was called: say goodbye once the queues are empty
        self.closed_peers: set[int] = set()   # peers that said goodbye
        self.num_dropped = 0                  # messages to a peer that had already said goodbye
        self._error: BaseException | None = None
        self._outq = {p: queue.Queue(maxsize=spec.max_inflight) for p in self._peers()}
        self._held: dict[int, deque] = {p: deque() for p in self._peers()}   # taken from _outq, not yet sent
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._guard, daemon=True, name=f"asap-comm-{rank}")
        self._thread.start()

    def _peers(self):
        return [p for p in range(self.world_size) if p != self.rank]

    # ---- caller side ---------------------------------------------------
    def send(self, dst: int, header: Header, tensors: list[torch.Tensor]) -> None:
        self._check_dst(dst)
        self._raise_if_failed()
        if self._closing:
            raise RuntimeError(f"rank {self.rank}: send after close")
        envelope = bytearray(ENVELOPE_BYTES)
        pack_envelope_into(envelope, 0, header, tensors)
        # No copy (the caller must not modify sent tensors): a Rows gathers, others are flat views. The queue
        # holds them until the round that sends them has synchronized its stream, so memory the caller's
        # stream frees is not reused under an unfinished send.
        payload = [as_bytes(t).to(self.device) for t in tensors if t.numel()]
        ready = None
        if self.device.type == "cuda":   # the communication stream must wait for the caller's kernels
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        item, q = (envelope, payload, ready), self._outq[dst]
        try:
            q.put_nowait(item)
            self._wake.set()
            return
        except queue.Full:
            pass
        with self._cv:
            self._send_waiting = True
            self._cv.notify_all()
        try:
            q.put(item, timeout=self.send_timeout)
            self._wake.set()
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
                self._wake.set()                   # room again: the next round may take payloads
                return self._inbox.popleft()
        self._raise_if_failed()
        return None

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True                       # goodbye to each peer after what is queued for it
        self._wake.set()
        self._thread.join(self._spec.close_timeout)
        dist.destroy_process_group()

    def _raise_if_failed(self):
        if self._error is not None:
            raise RuntimeError(f"rank {self.rank}: the communication thread failed") from self._error

    # ---- the communication thread ---------------------------------------
    def _guard(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)            # the current device is per thread
                with torch.cuda.stream(torch.cuda.Stream(self.device)):
                    self._loop()
            else:
                self._loop()
        except BaseException as e:                 # surfaced on the caller's next send/recv
            with self._cv:
                if self._error is None:
                    self._error = e
                self._cv.notify_all()

    def _loop(self) -> None:
        live = self._peers()
        pool = BufferPool(max_buffers=4, max_bytes=128 << 20) if self.device.type == "cpu" else None
        nap = 0.0
        while live:
            busy, live = self._round(live, pool)
            for p in set(self._peers()) - set(live):       # a dropped pair: its queue never drains by itself
                while not self._outq[p].empty():
                    self._outq[p].get_nowait()
                    self.num_dropped += 1
            if busy:
                nap = 0.0
            else:                                  # nothing moved: wait for a send, a bit longer each time
                nap = min(_IDLE_MAX_S, nap * 2 or 5e-5)
                self._wake.wait(nap)
            self._wake.clear()

    def _round(self, live: list[int], pool) -> tuple[bool, list[int]]:
        """One round with every live peer -> (whether anything moved, the peers still live after it)."""
        takes = self._closing or self._send_waiting or len(self._inbox) < self._spec.max_pending
        out = torch.zeros(len(live), BLOCK_BYTES, dtype=torch.uint8)
        bye = set()
        for i, p in enumerate(live):
            held = self._held[p]
            while len(held) < SLOTS:
                try:
                    held.append(self._outq[p].get_nowait())
                except queue.Empty:
                    break
            buf = out[i].numpy()
            if self._closing and not held:
                _BLOCK_HEAD.pack_into(buf, 0, -1, int(takes))
                bye.add(p)
                continue
            _BLOCK_HEAD.pack_into(buf, 0, len(held), int(takes))
            for j, (env, _, _) in enumerate(held):
                buf[_BLOCK_HEAD.size + j * ENVELOPE_BYTES:_BLOCK_HEAD.size + (j + 1) * ENVELOPE_BYTES] = env
        dev_out = out.to(self.device)
        dev_in = torch.empty(len(live), BLOCK_BYTES, dtype=torch.uint8, device=self.device)
        _run([dist.P2POp(dist.isend, dev_out[i], p) for i, p in enumerate(live)]
             + [dist.P2POp(dist.irecv, dev_in[i], p) for i, p in enumerate(live)])
        blocks = dev_in.cpu().numpy()

        ops, arriving, sent, left = [], [], [], set()
        for i, p in enumerate(live):
            count, peer_takes = _BLOCK_HEAD.unpack_from(blocks[i], 0)
            if count == -1:
                left.add(p)
            held = self._held[p]
            # Both ends decide alike from the two blocks: payloads move iff the sender announced some, the
            # receiver takes payloads this round, and neither said goodbye.
            if held and peer_takes and count != -1 and p not in bye:
                for _, payload, ready in held:
                    if ready is not None:
                        torch.cuda.current_stream().wait_event(ready)
                    ops += [dist.P2POp(dist.isend, b, p) for b in payload]
                sent.append((p, len(held)))
            if count > 0 and takes and p not in bye:
                for j in range(count):
                    header, layout = unpack_envelope(blocks[i], _BLOCK_HEAD.size + j * ENVELOPE_BYTES)
                    tensors = []
                    for dtype, shape in layout:
                        n = nbytes(dtype, shape)
                        if pool:
                            buf = pool.take(torch.uint8, (n,))
                        else:     # made on this thread's stream, read on the caller's: not reused before
                            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
                            buf.record_stream(self._consumer)
                        if n:
                            ops.append(dist.P2POp(dist.irecv, buf, p))
                        tensors.append(buf.view(dtype).reshape(shape))
                    arriving.append(Message(p, header, tensors))
        if ops:
            _run(ops)
            if self.device.type == "cuda":     # tensors complete before any stream of the caller reads them
                torch.cuda.current_stream().synchronize()
        for p, n in sent:
            for _ in range(n):
                self._held[p].popleft()
        for m in arriving:
            self._deliver(m)
        gone = bye | left
        for p in gone:                         # the pair is dropped: what is still held for it is lost
            self.num_dropped += len(self._held[p])
            self._held[p].clear()
        if left:
            with self._cv:
                self.closed_peers |= left
                self._cv.notify_all()
        return bool(sent or arriving or gone), [p for p in live if p not in gone]

    def _deliver(self, msg: Message) -> None:
        with self._cv:
            if not self._closing:
                self._inbox.append(msg)
                self._cv.notify_all()


def _run(ops: list) -> None:
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def _pick_device(device: str, rank: int) -> torch.device:
    if device == "cuda":
        local = os.environ.get("LOCAL_RANK")
        return torch.device("cuda", int(local) if local is not None else rank % torch.cuda.device_count())
    return torch.device(device)
