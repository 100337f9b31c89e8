"""Transport interface and the wire format both transports share.

A Transport moves (Header, list of tensors) between ranks, point-to-point.
Every message is an *envelope* (header + the shape and dtype of each tensor,
fixed size) followed by the raw bytes of each tensor. Shapes and dtypes ride
in-band, so the receiver needs no prior agreement and nothing is pickled.

A TransportSpec is the picklable recipe built by the launcher before the
workers start; each worker calls `spec.connect(rank)` exactly once.
"""
from __future__ import annotations

import struct
import sys
from typing import Callable
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from asap.comm.headers import HEADER_FORMAT, HEADER_WORDS, Header

MAX_TENSORS = 8
MAX_DIMS = 6

# Stable wire codes; the order only has to agree between sender and receiver.
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
_CODE = {dt: i for i, dt in enumerate(DTYPES)}

_HEAD = struct.Struct(HEADER_FORMAT + "q")          # header words, num_tensors (the same bytes as Header.to_bytes)
_COUNT = struct.Struct("<q")                         # num_tensors alone, at offset HEADER_WORDS * 8
_SLOT = struct.Struct(f"<2q{MAX_DIMS}q")           # dtype code, ndim, dims
ENVELOPE_BYTES = _HEAD.size + MAX_TENSORS * _SLOT.size
CLOSE_MARK = -1    # num_tensors value reserved for a transport's own goodbye message
_NO_HEADER = (0,) * 8 + (0.0, 0.0)


class CommTimeout(TimeoutError):
    """A bounded wait ran out: the peer is slow, stuck or gone."""


@dataclass
class Message:
    src: int
    header: Header
    tensors: list[torch.Tensor]


@dataclass(frozen=True)
class Rows:
    """`src[index]` along dim 0, left for the transport to gather straight into its send buffer
    (shm: one copy from the activations into shared memory, no staging tensor)."""
    src: torch.Tensor
    index: torch.Tensor      # int64 row numbers, on src's device

    @property
    def dtype(self) -> torch.dtype:
        return self.src.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.index.numel(), *self.src.shape[1:])

    @property
    def nbytes(self) -> int:
        return self.numel() * self.src.dtype.itemsize

    def dim(self) -> int:
        return self.src.dim()

    def numel(self) -> int:
        n = self.index.numel()
        for d in self.src.shape[1:]:
            n *= d
        return n

    def materialize(self) -> torch.Tensor:
        return self.src.index_select(0, self.index)


def pack_envelope(header: Header | None, tensors: list) -> bytearray:
    """Fixed-size description of a message; header None makes a CLOSE mark."""
    out = bytearray(ENVELOPE_BYTES)
    if header is None:
        _HEAD.pack_into(out, 0, *_NO_HEADER, CLOSE_MARK)
    else:
        pack_envelope_into(out, 0, header, tensors)
    return out


def describe(tensors: list) -> tuple[list[int], list[int]]:
    """The wire format's limits, checked before anything is written, in the same pass that makes
    the tensors' envelope words (dtype code, ndim, dims per slot) and their sizes in bytes."""
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"at most {MAX_TENSORS} tensors per message, got {len(tensors)}")
    words, sizes = [], []
    for i, t in enumerate(tensors):
        code, shape = _CODE.get(t.dtype), t.shape
        if code is None:
            raise ValueError(f"tensor {i}: dtype {t.dtype} not supported; use one of {DTYPES}")
        if len(shape) > MAX_DIMS:
            raise ValueError(f"tensor {i}: at most {MAX_DIMS} dims, got shape {tuple(shape)}")
        words += (code, len(shape), *shape, *_ZEROS[len(shape):])
        sizes.append(t.nbytes)
    return words, sizes


def check_tensors(tensors: list) -> None:
    """The wire format's limits, checked before anything is written."""
    describe(tensors)


def _envelope_struct(n: int) -> struct.Struct:
    """Header, count and n slots as one struct: one pack/unpack call per message."""
    if _STRUCTS[n] is None:
        _STRUCTS[n] = struct.Struct(_HEAD.format + _SLOT.format[1:] * n)
    return _STRUCTS[n]


_STRUCTS: list[struct.Struct | None] = [None] * (MAX_TENSORS + 1)
_ZEROS = (0,) * MAX_DIMS


def pack_envelope_into(buf, offset: int, header: Header, tensors: list, words: list[int] | None = None) -> None:
    """pack_envelope of the tensors, written at buf[offset:] (e.g. straight into a ring); words:
    describe(tensors)[0] if the caller has it already."""
    if words is None:
        words = describe(tensors)[0]
    _envelope_struct(len(tensors)).pack_into(buf, offset, *header.fields(), len(tensors), *words)


def unpack_envelope(data, offset: int = 0) -> tuple[Header | None, list[tuple[torch.dtype, tuple[int, ...]]]]:
    """Inverse of pack_envelope; (None, []) for a CLOSE mark."""
    (n,) = _COUNT.unpack_from(data, offset + HEADER_WORDS * 8)
    if n == CLOSE_MARK:
        return None, []
    if not 0 <= n <= MAX_TENSORS:
        raise RuntimeError(f"corrupt envelope: {n} tensors")
    words = _envelope_struct(n).unpack_from(data, offset)
    slots = words[HEADER_WORDS + 1:]
    layout = _LAYOUTS.get(slots)
    if layout is None:
        layout = _layout(slots)
    return Header.from_fields(*words[:HEADER_WORDS]), layout


# Layouts by their slot words: a stream of messages repeats a few shapes, and decoding the slots
# again costs more than the rest of the envelope. Bounded: cleared when full.
_LAYOUTS: dict[tuple, tuple] = {}
_MAX_LAYOUTS = 1024


def _layout(slots: tuple) -> tuple[tuple[torch.dtype, tuple[int, ...]], ...]:
    layout = []
    for w in range(0, len(slots), 2 + MAX_DIMS):
        code, ndim = slots[w], slots[w + 1]
        if not (0 <= code < len(DTYPES) and 0 <= ndim <= MAX_DIMS):
            raise RuntimeError(f"corrupt envelope: dtype code {code}, {ndim} dims")
        layout.append((DTYPES[code], slots[w + 2:w + 2 + ndim]))
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    layout = _LAYOUTS[slots] = tuple(layout)     # shared by every message of this shape: not to be changed
    return layout


def nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def as_bytes(t) -> torch.Tensor:
    """Flat uint8 view of a tensor's data (copies only if it is not contiguous, or is a Rows)."""
    if isinstance(t, Rows):
        t = t.materialize()
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class BufferPool:
    """Receive buffers that are reused once every tensor viewing them is gone, so a large message is
    copied into memory that is already mapped: a fresh 60 MB allocation costs ~3x its memcpy in page
    faults. A buffer is a numpy array; torch.from_numpy keeps it referenced while any view of it lives,
    so its reference count says whether it is free."""

    def __init__(self, max_buffers: int = 16, min_bytes: int = 64 << 10, max_bytes: int = 512 << 20):
        self.max_buffers, self.min_bytes, self.max_bytes = max_buffers, min_bytes, max_bytes
        self._bufs: list[np.ndarray] = []       # kept: at most max_buffers, max_bytes in all

    def take(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A contiguous tensor nobody else holds (contents undefined)."""
        n = nbytes(dtype, shape)
        if n < self.min_bytes:
            return torch.empty(*shape, dtype=dtype) if shape else torch.empty((), dtype=dtype)
        free = [b for b in self._bufs if sys.getrefcount(b) <= 3 and b.nbytes >= n]   # list, loop var, arg
        if free:
            buf = min(free, key=lambda b: b.nbytes)
        else:
            size = padded_mib(n)
            while self._bufs and (len(self._bufs) >= self.max_buffers
                                  or sum(b.nbytes for b in self._bufs) + size > self.max_bytes):
                # a generator, not a list: a list of candidates would itself raise their counts
                victim = min((b for b in self._bufs if sys.getrefcount(b) <= 3), key=lambda b: b.nbytes, default=None)
                if victim is None:
                    break
                self._bufs.remove(victim)
                _unpin(victim)
                del victim
            if len(self._bufs) >= self.max_buffers or sum(b.nbytes for b in self._bufs) + size > self.max_bytes:
                return torch.empty(shape, dtype=dtype)       # over the cap: a plain allocation, freed after use
            buf = np.empty(size, dtype=np.uint8)
            _pin(buf)
            self._bufs.append(buf)
        return torch.from_numpy(buf[:n]).view(dtype).view(shape)


def _pin(buf: np.ndarray) -> None:
    """In a process that uses CUDA, page-lock a pooled receive buffer (once: buffers are reused), so its
    tensors reach the device by one DMA copy instead of through the driver's pageable bounce buffer."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(buf.ctypes.data, buf.nbytes, 0))
            _PINNED.add(buf.ctypes.data)
        except Exception:  # noqa: BLE001 - not registrable: the buffer stays pageable, as before
            pass


def _unpin(buf: np.ndarray) -> None:
    if buf.ctypes.data in _PINNED:
        _PINNED.discard(buf.ctypes.data)
        torch.cuda.cudart().cudaHostUnregister(buf.ctypes.data)


_PINNED: set[int] = set()


def padded_mib(n: int) -> int:
    return (n + (1 << 20) - 1) & ~((1 << 20) - 1)


class Transport(ABC):
    """Point-to-point messages between `world_size` ranks; this end is `rank`."""
    rank: int
    world_size: int
    send_timeout: float
    # Whether blocked sends are still wanted (a worker sets its engine's liveness): a send waiting on a full
    # buffer gives up with CommTimeout once it says no, rather than waiting out send_timeout.
    alive: Callable[[], bool] | None = None

    @abstractmethod
    def send(self, dst: int, header: Header, tensors: list[torch.Tensor]) -> None:
        """Queue a message for dst. Blocks while dst's buffer is full; CommTimeout after
        send_timeout seconds (or once `alive` says no). The caller must not modify the tensors afterwards."""

    @abstractmethod
    def poll(self) -> Message | None:
        """The next arrived message from any source, or None; never blocks."""

    @abstractmethod
    def recv(self, timeout: float | None) -> Message | None:
        """Like poll, but waits up to timeout seconds (None = forever) for a message."""

    @abstractmethod
    def close(self) -> None:
        """Release this end; the transport is unusable afterwards."""

    def _check_dst(self, dst: int) -> None:
        if not 0 <= dst < self.world_size or dst == self.rank:
            raise ValueError(f"rank {self.rank}: bad destination {dst} (world_size {self.world_size})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TransportSpec(ABC):
    """Picklable recipe for a transport, built by the launcher before workers start."""

    @abstractmethod
    def connect(self, rank: int) -> Transport:
        """Called once inside each worker process."""

    def cleanup(self) -> None:
        """Called by the launcher after all workers exit (frees shared resources)."""
