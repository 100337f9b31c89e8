"""Typed message headers: the control-plane half of every message.

A Header says what a message is (kind), whose it is (replica, layer,
microbatch, seq), which epoch of its replica it belongs to (epoch: bumped on a
timeout, so late answers of an abandoned step can be told apart and purged)
and how urgent it is (deadline, sent_at); under an emulated link, when it is due (ready_ns). It travels as a
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
    CONTROL = 3    # anything else (start/stop); never touches the expert queues
    BARRIER = 4    # sync step barrier: seq = step, microbatch = 1 if the sender has work (see barrier())


# 8 int64 fields then 2 float64 fields, little-endian, 8 bytes each.
HEADER_FORMAT = "<8q2d"
_LAYOUT = struct.Struct(HEADER_FORMAT)
HEADER_WORDS = _LAYOUT.size // 8
_KINDS = {int(k): k for k in Kind}


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
    # An emulated link (asap.workers.emulation.link): the receiving Mailbox files the message no earlier than
    # time.monotonic_ns() >= ready_ns, the time the hardware profile's link would deliver it; 0 = on receipt.
    ready_ns: int = 0
    epoch: int = 0               # the sending replica's epoch (asap.comm.mailbox: older epochs are purged)

    def __post_init__(self):
        if type(self.kind) is not Kind:
            object.__setattr__(self, "kind", Kind(self.kind))
        if self.num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {self.num_tokens}")

    @classmethod
    def of(cls, kind: Kind, replica: int, layer: int, microbatch: int, seq: int, num_tokens: int,
           deadline: float = math.inf, sent_at: float = 0.0, ready_ns: int = 0, epoch: int = 0) -> "Header":
        """Header(...) for the hot path: the same checks, without the frozen dataclass's ten
        object.__setattr__ calls (~1.5 us, a tenth of a 1-token message's budget)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        h = object.__new__(cls)
        h.__dict__.update(kind=kind if type(kind) is Kind else Kind(kind), replica=replica, layer=layer,
                          microbatch=microbatch, seq=seq, num_tokens=num_tokens, deadline=deadline,
                          sent_at=sent_at, ready_ns=ready_ns, epoch=epoch)
        return h

    def replace(self, **changes) -> "Header":
        """dataclasses.replace for the hot path (same checks)."""
        d = {**self.__dict__, **changes}
        return Header.of(**d)

    @property
    def key(self) -> tuple[int, int, int, int]:
        """Identifies one dispatch and the combine answers that belong to it."""
        return (self.replica, self.layer, self.microbatch, self.seq)

    def fields(self) -> tuple:
        """The words to_bytes packs, in wire order (HEADER_FORMAT)."""
        return (self.kind, self.replica, self.layer, self.microbatch, self.seq,
                self.num_tokens, self.ready_ns, self.epoch, self.deadline, self.sent_at)

    def to_bytes(self) -> bytes:
        return _LAYOUT.pack(*self.fields())

    @classmethod
    def from_fields(cls, kind, replica, layer, mb, seq, num_tokens, ready_ns, epoch, deadline, sent_at) -> "Header":
        """Inverse of fields(); ValueError for a kind or a row count no sender could have written."""
        if kind not in _KINDS:
            raise ValueError(f"{kind} is not a valid Kind")
        return cls.of(_KINDS[kind], replica, layer, mb, seq, num_tokens, deadline, sent_at, ready_ns, epoch)

    @classmethod
    def from_bytes(cls, data) -> "Header":
        return cls.from_fields(*_LAYOUT.unpack_from(data))

    def encode(self) -> torch.Tensor:
        """[HEADER_WORDS] int64 tensor (CPU)."""
        return torch.frombuffer(bytearray(self.to_bytes()), dtype=torch.int64)

    @classmethod
    def decode(cls, t: torch.Tensor) -> "Header":
        if t.dtype != torch.int64 or t.numel() != HEADER_WORDS:
            raise ValueError(f"a header is {HEADER_WORDS} int64 words, got {t.numel()} x {t.dtype}")
        return cls.from_bytes(t.detach().cpu().contiguous().numpy().tobytes())


def barrier(rank: int, step: int, has_work: bool, epoch: int = 0, ready_ns: int = 0) -> Header:
    """The sync engine's step-barrier flag: typed (Kind.BARRIER), carrying its step (seq); ready_ns: when the
    sender's emulated device finished its last step (asap.workers.emulation.clock; 0 on real devices)."""
    return Header(Kind.BARRIER, rank, -1, int(has_work), step, 0, epoch=epoch, ready_ns=ready_ns)
