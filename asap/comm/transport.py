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
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from asap.comm.headers import HEADER_WORDS, Header

MAX_TENSORS = 8
MAX_DIMS = 6

# Stable wire codes; the order only has to agree between sender and receiver.
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
_CODE = {dt: i for i, dt in enumerate(DTYPES)}

_HEAD = struct.Struct(f"<{HEADER_WORDS * 8}sq")      # header bytes, num_tensors
_SLOT = struct.Struct(f"<2q{MAX_DIMS}q")           # dtype code, ndim, dims
ENVELOPE_BYTES = _HEAD.size + MAX_TENSORS * _SLOT.size
CLOSE_MARK = -1    # num_tensors value reserved for a transport's own goodbye message


class CommTimeout(TimeoutError):
    """A bounded wait ran out: the peer is slow, stuck or gone."""


@dataclass
class Message:
    src: int
    header: Header
    tensors: list[torch.Tensor]


def pack_envelope(header: Header | None, tensors: list[torch.Tensor]) -> bytearray:
    """Fixed-size description of a message; header None makes a CLOSE mark."""
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"at most {MAX_TENSORS} tensors per message, got {len(tensors)}")
    if header is None:
        out = bytearray(ENVELOPE_BYTES)
        _HEAD.pack_into(out, 0, b"", CLOSE_MARK)
        return out
    out = bytearray(ENVELOPE_BYTES)
    _HEAD.pack_into(out, 0, header.to_bytes(), len(tensors))
    for i, t in enumerate(tensors):
        if t.dtype not in _CODE:
            raise ValueError(f"tensor {i}: dtype {t.dtype} not supported; use one of {DTYPES}")
        if t.dim() > MAX_DIMS:
            raise ValueError(f"tensor {i}: at most {MAX_DIMS} dims, got shape {tuple(t.shape)}")
        dims = list(t.shape) + [0] * (MAX_DIMS - t.dim())
        _SLOT.pack_into(out, _HEAD.size + i * _SLOT.size, _CODE[t.dtype], t.dim(), *dims)
    return out


def unpack_envelope(data) -> tuple[Header | None, list[tuple[torch.dtype, tuple[int, ...]]]]:
    """Inverse of pack_envelope; (None, []) for a CLOSE mark."""
    head, n = _HEAD.unpack_from(data, 0)
    if n == CLOSE_MARK:
        return None, []
    layout = []
    for i in range(n):
        code, ndim, *dims = _SLOT.unpack_from(data, _HEAD.size + i * _SLOT.size)
        layout.append((DTYPES[code], tuple(dims[:ndim])))
    return Header.from_bytes(head), layout


def nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a tensor's data (copies only if it is not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class Transport(ABC):
    """Point-to-point messages between `world_size` ranks; this end is `rank`."""
    rank: int
    world_size: int
    send_timeout: float

    @abstractmethod
    def send(self, dst: int, header: Header, tensors: list[torch.Tensor]) -> None:
        """Queue a message for dst. Blocks while dst's buffer is full; CommTimeout after
        send_timeout seconds. The caller must not modify the tensors afterwards."""

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
