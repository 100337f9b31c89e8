"""Shared-memory transport: the default when every worker runs on one machine.

The launcher builds a ShmTransportSpec, which creates one SPSC ring (ring.py)
per allowed directed (src, dst) pair in POSIX shared memory plus two
semaphores per rank, before any worker starts. The spec is pickled into each
spawned worker, which attaches to the rings it sends or receives on by name.

Wake-ups go through named POSIX semaphores (semaphore.py):
  data[r]  counts messages published to rank r and not yet taken; recv waits on it.
  space[r] wakes rank r when it sleeps on a full ring and the receiver frees space.
A receiver polls data[r] for up to _SPIN_S (yielding the CPU between tries)
before it sleeps on it: a wake-up from a semaphore sleep costs tens of
microseconds to milliseconds on a loaded machine, more than a whole small message
(measured on the 2-core VM: ~35 us inside the waker's sem_post, ~50 us before
the sleeper runs), so a gap of a few hundred microseconds is cheaper spun through.

One copy each way: the sender writes the envelope and every tensor (gathering
rows straight from the activations, see transport.Rows) into the ring in place;
the receiver copies each tensor out once, into a pooled buffer (transport.BufferPool).
A message of >= 256 KiB is streamed: the receiver is woken as soon as the envelope
is in place and copies chunks (256 KiB to 1 MiB) out while the sender is still writing
the next ones, so the two copies overlap (with 1 MiB chunks a 1.8 MB message barely did).
Both ends do their per-message Python (envelope, header, allocation) before the big
copy: a copy of a few MB flushes the core's caches, and torch calls after it run cold.

Two threads of one rank may receive at once (the sync loop's idle listener receives
while the main thread's send, finding its ring full, drains the inbound rings): taking
a record off the inbound rings (and its pooled buffer) is serialised by one lock.

Segment and semaphore names carry the creating process's pid (shm_names.py); a new
spec first unlinks those whose creator is dead, so a SIGKILL of the whole process
group (no cleanup ran) leaks nothing past the next start. Once every worker has
connected, unlink_names() removes the names at once (the objects live on while open),
so such a kill leaks nothing at all.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import deque
from multiprocessing import shared_memory

import torch

from asap.comm.headers import Header
from asap.comm.ring import ALIGN, Ring, padded
from asap.comm.semaphore import NamedSemaphore
from asap.comm.shm_names import new_prefix, sweep_dead_segments
from asap.comm.streams import copy_to_host
from asap.comm.transport import (ENVELOPE_BYTES, BufferPool, CommTimeout, Message, Rows, Transport,
                                 TransportSpec, describe, pack_envelope_into, unpack_envelope)

# Upper bound on one nap while a send waits for space; the space semaphore
# usually wakes the sender sooner. Bounded so a lost wake-up (the waiting flag
# is set and checked without a fence) costs at most this much.
_SPACE_NAP_S = 0.002
_ALIVE_CHECK_S = 0.5       # how often a blocked send asks `alive`
# How long a receiver polls before it sleeps on its semaphore. An idle receiver that times out
# and asks again burns this much per call (0.6% of a core for the async expert loop's 50 ms waits).
_SPIN_S = 300e-6
# Bodies at least this big are streamed: the receiver is woken once the envelope is in the ring and
# copies each chunk out while the sender writes the next, so a big message costs ~one copy, not two.
# A streamed body goes in chunks of an eighth of it, 256 KiB to 1 MiB: small enough that a 2 MB message
# overlaps its two copies, few enough that a 60 MB one is not hundreds of hand-offs (whenever the
# receiver catches up it yields its core, on a loaded machine to another process).
_STREAM_BYTES = 256 << 10
_MIN_CHUNK, _MAX_CHUNK = 256 << 10, 1 << 20
_ENV = padded(ENVELOPE_BYTES, ALIGN)


class ShmTransportSpec(TransportSpec):
    """Allocates the rings and semaphores; pass it to the workers (it pickles by name).
    Call cleanup() once the workers exit."""

    def __init__(self, world_size: int, ring_bytes: int = 64 << 20,
                 pairs: list[tuple[int, int]] | None = None, send_timeout: float = 30.0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if ring_bytes < 1024:
            raise ValueError(f"ring_bytes must be >= 1024, got {ring_bytes}")
        if pairs is None:
            pairs = [(s, d) for s in range(world_size) for d in range(world_size) if s != d]
        for s, d in pairs:
            if not (0 <= s < world_size and 0 <= d < world_size) or s == d:
                raise ValueError(f"bad pair ({s}, {d}) for world_size {world_size}")
        self.world_size = world_size
        self.ring_bytes = padded(ring_bytes, ALIGN)
        self.pairs = tuple(sorted(set(pairs)))
        self.send_timeout = send_timeout
        sweep_dead_segments()
        self.prefix = new_prefix()
        self._owned: list[shared_memory.SharedMemory] = []
        self._owned_sems: list[str] = []
        self._data: tuple[NamedSemaphore, ...] = ()
        self._space: tuple[NamedSemaphore, ...] = ()
        try:
            self._data = tuple(self._semaphore(f"d{r}") for r in range(world_size))
            self._space = tuple(self._semaphore(f"s{r}") for r in range(world_size))
            for pair in self.pairs:   # fresh POSIX shm is zero-filled: both positions start at 0
                self._owned.append(shared_memory.SharedMemory(
                    name=self.segment_name(pair), create=True, size=Ring.segment_bytes(self.ring_bytes)))
        except BaseException:
            self.cleanup()
            raise

    def segment_name(self, pair: tuple[int, int]) -> str:
        return f"{self.prefix}_{pair[0]}_{pair[1]}"

    def _semaphore(self, tag: str) -> NamedSemaphore:
        name = f"/{self.prefix}_{tag}"
        sem = NamedSemaphore(name, create=True)
        self._owned_sems.append(name)
        return sem

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_owned"], state["_owned_sems"] = [], []   # only the launcher owns (and unlinks) them
        return state

    def __repr__(self):
        return (f"ShmTransportSpec(world_size={self.world_size}, ring_bytes={self.ring_bytes}, "
                f"pairs={len(self.pairs)}, prefix={self.prefix!r})")

    def connect(self, rank: int) -> "ShmTransport":
        return ShmTransport(self, rank)

    def unlink_names(self) -> None:
        """Remove every segment's and semaphore's name; call it once every rank has connected (the segments
        and semaphores live on while open, and vanish with their last user, even if all are SIGKILLed)."""
        for shm in self._owned:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        for name in self._owned_sems:
            NamedSemaphore.unlink(name)

    def cleanup(self) -> None:
        while self._owned:
            shm = self._owned.pop()
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        if self._owned_sems:
            for sem in self._data + self._space:    # the owner's handles: nobody waits on them any more
                sem.close()
        while self._owned_sems:
            NamedSemaphore.unlink(self._owned_sems.pop())


class ShmTransport(Transport):
    def __init__(self, spec: ShmTransportSpec, rank: int):
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} out of range for world_size {spec.world_size}")
        self.rank, self.world_size, self.send_timeout = rank, spec.world_size, spec.send_timeout
        self._spec = spec
        self._segments: list[shared_memory.SharedMemory] = []
        self._out: dict[int, Ring] = {}
        self._in: list[tuple[int, Ring]] = []
        for s, d in spec.pairs:
            if rank in (s, d):
                # Attaching registers the name with the resource tracker too; spawned
                # children share the launcher's tracker, so that is a harmless repeat.
                shm = shared_memory.SharedMemory(name=spec.segment_name((s, d)))
                self._segments.append(shm)
                ring = Ring(shm.buf, spec.ring_bytes)
                if s == rank:
                    self._out[d] = ring
                else:
                    self._in.append((s, ring))
        self._backlog: deque[Message] = deque()   # taken off the rings while a send waited
        self._pool = BufferPool()
        self._next_in = 0
        self._take_lock = threading.Lock()       # inbound rings, pool and _next_in: one receiving thread at a time

    def send(self, dst: int, header: Header, tensors: list) -> None:
        """tensors: torch tensors (any device, any strides) or Rows, each copied once into the ring."""
        ring = self._out.get(dst)
        if ring is None:
            self._check_dst(dst)
            raise ValueError(f"no ring from rank {self.rank} to {dst}; add the pair to the spec")
        words, sizes = describe(tensors)
        body = _ENV
        for n in sizes:
            body += (n + ALIGN - 1) & -ALIGN
        deadline = None
        while (off := ring.reserve(body)) is None:
            now = time.monotonic()
            if deadline is None:
                deadline, check = now + self.send_timeout, now + _ALIVE_CHECK_S
            if now >= deadline:
                raise CommTimeout(f"rank {self.rank}: ring to rank {dst} stayed full for {self.send_timeout}s "
                                  f"({ring.used()}/{ring.capacity} bytes used)")
            if self.alive is not None and now >= check:
                check = now + _ALIVE_CHECK_S
                if not self.alive():
                    raise CommTimeout(f"rank {self.rank}: ring to rank {dst} is full and the engine is gone")
            ring.mark_waiting()
            if (off := ring.reserve(body)) is not None:
                break
            # Keep our own inbound rings moving while we wait: dst may itself be stuck
            # sending to us, and two ranks blocked on each other's full ring never recover.
            if not self._drain_one():
                self._spec._space[self.rank].acquire(timeout=min(_SPACE_NAP_S, deadline - now))
        pack_envelope_into(ring.mem, ring.base + off, header, tensors, words)
        stream = body >= _STREAM_BYTES
        if stream:
            ring.progress(_ENV)
            self._spec._data[dst].release()
        at = off + _ENV
        for t, n in zip(tensors, sizes):
            if n:
                _write(ring, at, n, t, off if stream else None, _chunk_bytes(body))
            at += padded(n, ALIGN)
        ring.commit()
        if not stream:
            self._spec._data[dst].release()

    def poll(self) -> Message | None:
        if (msg := self._from_backlog()) is not None:
            return msg
        return self._take() if self._spec._data[self.rank].acquire(block=False) else None

    def recv(self, timeout: float | None) -> Message | None:
        if (msg := self._from_backlog()) is not None:
            return msg
        sem = self._spec._data[self.rank]
        if sem.acquire(block=False):
            return self._take()
        if timeout is not None and timeout <= 0:
            return None
        start = time.perf_counter()
        spin = _SPIN_S if timeout is None else min(_SPIN_S, timeout)
        while time.perf_counter() - start < spin:
            os.sched_yield()
            if sem.acquire(block=False):
                return self._take()
        if timeout is not None:
            timeout = max(0.0, timeout - (time.perf_counter() - start))
        return self._take() if sem.acquire(timeout=timeout) else None

    def close(self) -> None:
        for _, ring in self._in:
            ring.close()
        for ring in self._out.values():
            ring.close()
        self._in, self._out = [], {}
        while self._segments:
            self._segments.pop().close()

    def _from_backlog(self) -> Message | None:
        if not self._backlog:        # the usual case, checked without raising (~1 us per receive)
            return None
        try:
            return self._backlog.popleft()
        except IndexError:           # emptied by the other receiving thread since
            return None

    def _drain_one(self) -> bool:
        if not self._spec._data[self.rank].acquire(block=False):
            return False
        self._backlog.append(self._take())
        return True

    def _take(self) -> Message:
        """Read one message; the caller has already taken its count from data[rank]."""
        with self._take_lock:
            return self._take_locked()

    def _take_locked(self) -> Message:
        n = len(self._in)
        for _ in range(1000):   # the count is posted after the write, so a record is (nearly) always there
            for i in range(n):   # round-robin so one chatty sender cannot starve the others
                src, ring = self._in[(self._next_in + i) % n]
                found = ring.peek()
                if found is not None:
                    msg = self._read(src, ring, found[0])
                    if not ring.committed():
                        self._wait(ring, ring.committed, src)
                    ring.release()
                    self._next_in = (self._next_in + i + 1) % n
                    if ring.take_waiter():
                        self._spec._space[src].release()
                    return msg
            time.sleep(0)
        raise RuntimeError(f"rank {self.rank}: message count posted but no ring holds a message")


    def _read(self, src: int, ring: Ring, off: int) -> Message:
        """Copy one record's tensors out of the ring, each once, into tensors of their own; a record
        still being streamed is copied as far as it is written, chunk by chunk. Every output is
        allocated before the first byte moves: a big copy flushes the core's cache, and torch calls
        made after it run cold (~10-30 us each at 1.8 MB)."""
        header, layout = unpack_envelope(ring.mem, ring.base + off)
        tensors = [self._pool.take(dtype, shape) for dtype, shape in layout]
        at, base = off + _ENV, ring.addr
        if ring.committed():
            for out in tensors:
                n = out.nbytes
                if n:
                    ctypes.memmove(out.data_ptr(), base + at, n)
                at += (n + ALIGN - 1) & -ALIGN
            return Message(src, header, tensors)
        for out in tensors:
            n, done, dst = out.nbytes, 0, out.data_ptr()
            while done < n:
                have = min(n, ring.available() - (at - off))
                if have <= done:
                    self._wait(ring, lambda: ring.available() - (at - off) > done, src)
                    continue
                ctypes.memmove(dst + done, base + at + done, have - done)
                done = have
            at += (n + ALIGN - 1) & -ALIGN
        return Message(src, header, tensors)

    def _wait(self, ring: Ring, ready, src: int) -> None:
        """Spin (yielding the CPU) until a streaming sender has got further; it is mid-copy, not blocked."""
        if ready():
            return
        start = time.monotonic()
        while not ready():
            waited = time.monotonic() - start
            if waited > self.send_timeout or (waited > _ALIVE_CHECK_S and self.alive is not None
                                              and not self.alive()):
                raise CommTimeout(f"rank {self.rank}: rank {src} stopped for {waited:.1f}s in the "
                                  "middle of writing a message")
            if waited < 0.001:
                os.sched_yield()
            else:                       # descheduled or gone: stop burning a core on it
                time.sleep(0.0001)


def _chunk_bytes(body: int) -> int:
    return min(_MAX_CHUNK, max(_MIN_CHUNK, (body // 8) & -ALIGN))


def _write(ring: Ring, at: int, n: int, t, body: int | None = None, chunk: int = _MAX_CHUNK) -> None:
    """One copy into the ring at data offset `at`; from another device this is the comm boundary's
    one transfer. Contiguous CPU tensors go by memmove (no tensor views to build: ~1 us less each).
    body: the record's body offset when it is streamed; the copy then goes in chunks of `chunk`
    bytes, each published."""
    chunk = chunk if body is not None else n
    if isinstance(t, torch.Tensor) and t.is_cpu and t.is_contiguous():
        src, dst = t.data_ptr(), ring.addr + at
        if body is None:
            ctypes.memmove(dst, src, n)
            return
        for a in range(0, n, chunk):
            ctypes.memmove(dst + a, src + a, min(chunk, n - a))
            if body is not None:
                ring.progress(at + min(a + chunk, n) - body)
        return
    dst = ring.data[at:at + n].view(t.dtype).view(t.shape)
    if isinstance(t, Rows) and t.src.device.type == "cpu":
        rows = max(1, chunk // max(1, n // max(1, t.index.numel())))     # rows per chunk
        for a in range(0, t.index.numel(), rows):
            torch.index_select(t.src, 0, t.index[a:a + rows], out=dst[a:a + rows])
            if body is not None:
                ring.progress(at + min(n, (a + rows) * (n // t.index.numel())) - body)
        return
    src = t.materialize() if isinstance(t, Rows) else t.detach()   # a Rows of device rows: gathered there
    if src.device.type == "cuda":
        _pin(ring)
    copy_to_host(dst, src)        # from a GPU: on the comm stream, after the kernels that made src
    if body is not None:
        ring.progress(at + n - body)


def _pin(ring: Ring) -> None:
    """Page-lock a ring the first time a CUDA tensor is written into it, so the device copies straight into
    shared memory by DMA rather than through the driver's pageable bounce buffer (a second copy)."""
    if getattr(ring, "pinned", None) is None:
        try:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(ring.addr, ring.capacity, 0))
            ring.pinned = True
        except Exception:  # noqa: BLE001 - not registrable here: the copy stays pageable, as before
            ring.pinned = False

