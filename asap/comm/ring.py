"""Single-producer single-consumer byte ring over a shared-memory buffer.

Layout: a 192-byte control block, then `capacity` data bytes. The control
block holds three uint64 words on separate cache lines: the write position
(only the producer stores it), the read position (only the consumer stores
it) and a "producer is waiting for space" flag. Positions count bytes ever
written/read and never wrap, so `write - read` is the fill level and there is
no full/empty ambiguity; only the data offsets wrap (modulo capacity).

A record is an 8-byte length followed by its parts, each padded to 8 bytes,
so every record starts 8-aligned and the length word never straddles the end
of the buffer. A record may straddle it; copies are split in two there.

Ordering: the producer copies the data, then stores the write position; the
consumer loads the write position, then copies the data. On x86-64 (TSO)
stores become visible in program order, which is all this needs; the
semaphore the transport posts after each write adds a full barrier as well.
"""
from __future__ import annotations

import numpy as np
import torch

CTRL_BYTES = 192
_WRITE, _READ, _WAITING = 0, 8, 16     # uint64 word indices, 64 bytes apart
_LEN = 8


def padded(n: int) -> int:
    return (n + 7) & ~7


class Ring:
    def __init__(self, buf: memoryview, capacity: int):
        if capacity <= 0 or capacity % 8:
            raise ValueError(f"ring capacity must be a positive multiple of 8, got {capacity}")
        if len(buf) < CTRL_BYTES + capacity:
            raise ValueError(f"buffer of {len(buf)} bytes cannot hold a {capacity}-byte ring")
        self.capacity = capacity
        self._ctrl = np.ndarray((CTRL_BYTES // 8,), dtype=np.uint64, buffer=buf)
        self._data = torch.frombuffer(buf, dtype=torch.uint8, count=capacity, offset=CTRL_BYTES)

    @staticmethod
    def segment_bytes(capacity: int) -> int:
        return CTRL_BYTES + capacity

    @staticmethod
    def record_bytes(part_sizes: list[int]) -> int:
        return _LEN + sum(padded(n) for n in part_sizes)

    def used(self) -> int:
        return int(self._ctrl[_WRITE]) - int(self._ctrl[_READ])

    def has_data(self) -> bool:
        return self.used() > 0

    # ---- producer side -------------------------------------------------
    def try_write(self, parts: list[torch.Tensor]) -> bool:
        """Append one record made of flat uint8 tensors; False (nothing written) if it does not fit."""
        size = self.record_bytes([p.numel() for p in parts])
        if size > self.capacity:
            raise ValueError(f"message needs {size} bytes but the ring holds only {self.capacity} (raise ring_bytes)")
        pos = int(self._ctrl[_WRITE])
        if size > self.capacity - (pos - int(self._ctrl[_READ])):
            return False
        self._put(pos, torch.tensor([size], dtype=torch.int64).view(torch.uint8))
        at = pos + _LEN
        for p in parts:
            self._put(at, p)
            at += padded(p.numel())
        self._ctrl[_WRITE] = pos + size        # publish: after the data, never before
        return True

    def mark_waiting(self) -> None:
        self._ctrl[_WAITING] = 1

    # ---- consumer side -------------------------------------------------
    def read(self) -> torch.Tensor | None:
        """Remove the oldest record; its parts, concatenated with padding, as a fresh uint8 tensor."""
        pos = int(self._ctrl[_READ])
        if int(self._ctrl[_WRITE]) == pos:
            return None
        size_word = torch.empty(1, dtype=torch.int64)
        self._get(pos, size_word.view(torch.uint8))
        size = int(size_word)
        body = torch.empty(size - _LEN, dtype=torch.uint8)
        self._get(pos + _LEN, body)
        self._ctrl[_READ] = pos + size         # the producer may reuse the space from here on
        return body

    def take_waiter(self) -> bool:
        """True (and clears the flag) if the producer asked to be woken when space frees up."""
        if self._ctrl[_WAITING]:
            self._ctrl[_WAITING] = 0
            return True
        return False

    def close(self) -> None:
        # Views into the buffer must go before the shared memory can be closed.
        del self._ctrl, self._data

    # ---- wrap-aware copies ---------------------------------------------
    def _put(self, pos: int, src: torch.Tensor) -> None:
        off, n = pos % self.capacity, src.numel()
        first = min(n, self.capacity - off)
        self._data[off:off + first].copy_(src[:first])
        if first < n:
            self._data[:n - first].copy_(src[first:])

    def _get(self, pos: int, dst: torch.Tensor) -> None:
        off, n = pos % self.capacity, dst.numel()
        first = min(n, self.capacity - off)
        dst[:first].copy_(self._data[off:off + first])
        if first < n:
            dst[first:].copy_(self._data[:n - first])
