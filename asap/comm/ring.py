"""Single-producer single-consumer byte ring over a shared-memory buffer.

Layout: a 192-byte control block, then `capacity` data bytes. The control
block holds three uint64 words on separate cache lines: the write position
(only the producer stores it), the read position (only the consumer stores
it) and a "producer is waiting for space" flag. Positions count bytes ever
written/read and never wrap, so `write - read` is the fill level and there is
no full/empty ambiguity; only the data offsets wrap (modulo capacity).

A record is contiguous in the buffer, so both ends can address it as one
slice (typed tensor views, one copy in and one copy out): a 64-byte slot whose
first word is the record's total size, then the body, the whole padded to 64
bytes so every body starts 64-aligned. A record that would run past the end of
the buffer is preceded by a SKIP word, and the consumer jumps to offset 0; so is
every record written into an empty ring, so that a ring used one message at a
time keeps reusing its first bytes (warm in cache) instead of walking through all of them.

Writing is two steps, so the caller can fill the body in place:
  off = ring.reserve(n)   # None if it does not fit yet; else the body's data offset
  ... write n bytes at ring.data[off:off + n], calling ring.progress(done) as it goes ...
  ring.commit()           # publish
and reading likewise: `peek()` -> (offset, size) of the oldest body, `release()`.
A large record may be *streamed*: the consumer may copy its first `available()`
bytes before it is committed (its size word is written at reserve, and the
fill word says how far the producer has got), so the two copies overlap.

Ordering: the producer copies the data, then stores the write position; the
consumer loads the write position, then copies the data. On x86-64 (TSO)
stores become visible in program order, which is all this needs; the
semaphore the transport posts after each write adds a full barrier as well.
"""
from __future__ import annotations

import ctypes

import torch

CTRL_BYTES = 192
ALIGN = 64
_WRITE, _READ, _WAITING = 0, 8, 16     # uint64 word indices, 64 bytes apart
_FILL = 4                              # producer: how far the record being streamed is written (absolute)
_SKIP = -1                             # size word of "nothing more before the end of the buffer"


def padded(n: int, align: int = 8) -> int:
    return (n + align - 1) & ~(align - 1)


class Ring:
    def __init__(self, buf: memoryview, capacity: int):
        if capacity <= 0 or capacity % ALIGN:
            raise ValueError(f"ring capacity must be a positive multiple of {ALIGN}, got {capacity}")
        if len(buf) < CTRL_BYTES + capacity:
            raise ValueError(f"buffer of {len(buf)} bytes cannot hold a {capacity}-byte ring")
        self.capacity = capacity
        self.data = torch.frombuffer(buf, dtype=torch.uint8, count=capacity, offset=CTRL_BYTES)
        self.addr = self.data.data_ptr()             # where data offset 0 is, for ctypes.memmove
        # Control and size words as ctypes arrays over the same bytes: a load or store is ~3x cheaper
        # than numpy's (the transport makes a dozen per message), each is one aligned 8-byte access,
        # and unlike a memoryview they do not pin the mapping open (close() drops them first).
        self._ctrl = (ctypes.c_uint64 * (CTRL_BYTES // 8)).from_address(self.addr - CTRL_BYTES)
        self._words = (ctypes.c_int64 * (capacity // 8)).from_address(self.addr)
        self.mem, self.base = buf, CTRL_BYTES       # the same bytes, for struct.pack_into (no sub-view:
                                                    # a sliced memoryview would pin the mapping open)
        self._reserved: tuple[int, int] | None = None     # (record position, record bytes)
        self._peeked: tuple[int, int] | None = None       # (position, record bytes) of the record peek() returned

    @staticmethod
    def segment_bytes(capacity: int) -> int:
        return CTRL_BYTES + capacity

    @staticmethod
    def record_bytes(body_bytes: int) -> int:
        return ALIGN + padded(body_bytes, ALIGN)

    def used(self) -> int:
        return self._ctrl[_WRITE] - self._ctrl[_READ]

    def has_data(self) -> bool:
        return self.used() > 0

    # ---- producer side -------------------------------------------------
    def reserve(self, body_bytes: int) -> int | None:
        """Room for a body of body_bytes: its data offset, or None (nothing reserved) if it does not fit yet."""
        size = self.record_bytes(body_bytes)
        if size > self.capacity:
            raise ValueError(f"message needs {size} bytes but the ring holds only {self.capacity} (raise ring_bytes)")
        pos = self._ctrl[_WRITE]
        free = self.capacity - (pos - self._ctrl[_READ])
        off = pos % self.capacity
        # Would straddle the end, or the ring is empty: start at offset 0. Restarting an empty ring at
        # its start keeps messages in the same (cache- and TLB-warm) bytes instead of walking the ring.
        tail = self.capacity - off
        if off and (off + size > self.capacity or (free == self.capacity and size <= free - tail)):
            if tail > free:
                return None
            self._words[off // 8] = _SKIP
            pos, free, off = pos + tail, free - tail, 0
            self._ctrl[_WRITE] = pos             # the consumer may step over the skip already
        if size > free:
            return None
        self._words[off // 8] = size              # unseen until progress() or commit() moves a position
        self._reserved = (pos, size)
        return off + ALIGN

    def progress(self, done: int) -> None:
        """The first `done` body bytes of the reserved record are in place: the consumer may take them."""
        self._ctrl[_FILL] = self._reserved[0] + ALIGN + done

    def commit(self) -> None:
        pos, size = self._reserved
        self._ctrl[_WRITE] = pos + size          # publish: after the data, never before
        self._reserved = None

    def try_write(self, parts: list[torch.Tensor]) -> bool:
        """Append one record made of flat uint8 tensors, each padded to 8 bytes; False if it does not fit."""
        n = sum(padded(p.numel()) for p in parts)
        off = self.reserve(n)
        if off is None:
            return False
        for p in parts:
            self.data[off:off + p.numel()].copy_(p)
            off += padded(p.numel())
        self.commit()
        return True

    def mark_waiting(self) -> None:
        self._ctrl[_WAITING] = 1

    # ---- consumer side -------------------------------------------------
    def peek(self) -> tuple[int, int] | None:
        """(data offset, size rounded up to 64) of the oldest body, committed or being streamed;
        None if the ring is empty."""
        while True:
            pos = self._ctrl[_READ]
            if self._ctrl[_WRITE] == pos and self._ctrl[_FILL] <= pos:
                return None
            off = pos % self.capacity
            size = self._words[off // 8]
            if size != _SKIP:                    # a skip is only ever published by the write position
                self._peeked = (pos, size)
                return off + ALIGN, size - ALIGN
            self._ctrl[_READ] = pos + self.capacity - off

    def available(self) -> int:
        """How many body bytes of the peeked record are in place (all of them once it is committed)."""
        pos, size = self._peeked
        if self._ctrl[_WRITE] >= pos + size:
            return size - ALIGN
        return max(0, self._ctrl[_FILL] - pos - ALIGN)

    def committed(self) -> bool:
        pos, size = self._peeked
        return self._ctrl[_WRITE] >= pos + size

    def release(self) -> None:
        """Free the (committed) body peek() returned; the producer may reuse the space from here on."""
        pos, size = self._peeked
        self._ctrl[_READ] = pos + size
        self._peeked = None

    def read(self) -> torch.Tensor | None:
        """Remove the oldest record; its body (parts with their padding) as a fresh uint8 tensor."""
        found = self.peek()
        if found is None or not self.committed():
            return None
        off, n = found
        body = self.data[off:off + n].clone()
        self.release()
        return body

    def take_waiter(self) -> bool:
        """True (and clears the flag) if the producer asked to be woken when space frees up."""
        if self._ctrl[_WAITING]:
            self._ctrl[_WAITING] = 0
            return True
        return False

    def close(self) -> None:
        # Views into the buffer must go before the shared memory can be closed.
        del self._ctrl, self._words, self.data, self.mem
