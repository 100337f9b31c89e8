"""Typed message headers: the control-plane half of every message.

A Header says what a message is (kind), whose it is (replica, layer,
microbatch, seq) and how urgent it is (deadline, sent_at). It travels as a
fixed-size int64 tensor so that both transports can send it without pickling;
the two float fields are stored bit-for-bit in int64 words.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from enum import IntEnum

import torch


class Kind(IntEnum):
    DISPATCH = 1   # attention -> expert: tokens to run through this rank's experts
    COMBINE = 2    # expert -> attention: the partial expert output for a dispatch
    CONTROL = 3    # anything else (start/stop, step numbers); never touches the expert queues


# 7 int64 fields then 2 float64 fields, little-endian, 8 bytes each.
_LAYOUT = struct.Struct("<7q2d")
HEADER_WORDS = _LAYOUT.size // 8


@dataclass(frozen=True)
class Header:
    kind: Kind
    replica: int          # source attention replica (for COMBINE: the replica it goes back to)
    layer: int
    microbatch: int
    seq: int              # per-replica sequence number of the dispatch (unique with replica)
    num_tokens: int       # rows in this message
    deadline: float = math.inf   # earliest TTFT deadline among the tokens' requests
    sent_at: float = 0.0         # time.monotonic() at send; monotonic is machine-wide on Linux
    aux: int = 0                 # free field (e.g. a step number for the sync engine)

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        if self.num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {self.num_tokens}")

    @property
    def key(self) -> tuple[int, int, int, int]:
        """Identifies one dispatch and the combine answers that belong to it."""
        return (self.replica, self.layer, self.microbatch, self.seq)

    def to_bytes(self) -> bytes:
        return _LAYOUT.pack(int(self.kind), self.replica, self.layer, self.microbatch, self.seq,
                            self.num_tokens, self.aux, self.deadline, self.sent_at)

    @classmethod
    def from_bytes(cls, data) -> "Header":
        kind, replica, layer, mb, seq, num_tokens, aux, deadline, sent_at = _LAYOUT.unpack_from(data)
        return cls(Kind(kind), replica, layer, mb, seq, num_tokens, deadline, sent_at, aux)

    def encode(self) -> torch.Tensor:
        """[HEADER_WORDS] int64 tensor (CPU)."""
        return torch.frombuffer(bytearray(self.to_bytes()), dtype=torch.int64)

    @classmethod
    def decode(cls, t: torch.Tensor) -> "Header":
        if t.dtype != torch.int64 or t.numel() != HEADER_WORDS:
            raise ValueError(f"a header is {HEADER_WORDS} int64 words, got {t.numel()} x {t.dtype}")
        return cls.from_bytes(t.detach().cpu().contiguous().numpy().tobytes())
