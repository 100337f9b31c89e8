"""asap.comm's wire format: headers and message envelopes, bit for bit (no transport needed)."""
from __future__ import annotations

import math

import pytest
import torch

from asap.comm import HEADER_WORDS, Header, Kind


def h(**kw):
    base = dict(kind=Kind.CONTROL, replica=0, layer=0, microbatch=0, seq=0, num_tokens=0)
    return Header(**{**base, **kw})


def test_header_survives_encode_decode_bit_for_bit():
    hd = Header(Kind.COMBINE, 3, 61, 2, 2**40, 7, deadline=math.inf, sent_at=123.456789, ready_ns=-5)
    enc = hd.encode()
    assert enc.dtype == torch.int64 and enc.numel() == HEADER_WORDS
    assert Header.decode(enc) == hd
    with pytest.raises(ValueError, match=f"{HEADER_WORDS} int64 words"):
        Header.decode(enc[:5])


def test_fast_header_constructors_agree_with_the_dataclass():
    import dataclasses
    import pickle
    slow = Header(Kind.DISPATCH, 1, 2, 3, 4, 5, deadline=6.5, sent_at=7.25, ready_ns=8, epoch=9)
    fast = Header.of(Kind.DISPATCH, 1, 2, 3, 4, 5, 6.5, 7.25, ready_ns=8, epoch=9)
    assert fast == slow and hash(fast) == hash(slow) and pickle.loads(pickle.dumps(fast)) == slow
    assert fast.replace(kind=Kind.COMBINE, num_tokens=0) == dataclasses.replace(slow, kind=Kind.COMBINE, num_tokens=0)
    assert Header.of(2, 0, 0, 0, 0, 0).kind is Kind.COMBINE           # a plain int becomes the Kind
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        Header.of(Kind.DISPATCH, 0, 0, 0, 0, -1)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        slow.replace(num_tokens=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 1                                                   # as frozen as the dataclass's own


def test_a_corrupt_envelope_is_an_error_naming_it():
    import struct
    from asap.comm.transport import HEADER_WORDS as W, pack_envelope, unpack_envelope
    env = pack_envelope(h(num_tokens=2), [torch.zeros(2, 3), torch.zeros(4, dtype=torch.long)])
    header, layout = unpack_envelope(env)
    assert header == h(num_tokens=2) and layout == ((torch.float32, (2, 3)), (torch.int64, (4,)))
    bad = bytearray(env)
    struct.pack_into("<q", bad, (W + 1) * 8, 99)                       # dtype code of the first tensor
    with pytest.raises(RuntimeError, match="corrupt envelope: dtype code 99"):
        unpack_envelope(bad)
    bad = bytearray(env)
    struct.pack_into("<q", bad, 0, 42)                                 # the header's kind
    with pytest.raises(ValueError, match="42 is not a valid Kind"):
        unpack_envelope(bad)


def test_decoded_layouts_are_cached_but_bounded():
    from asap.comm import transport
    from asap.comm.transport import pack_envelope, unpack_envelope
    for n in range(transport._MAX_LAYOUTS + 10):
        assert unpack_envelope(pack_envelope(h(), [torch.zeros(n, 2)]))[1] == ((torch.float32, (n, 2)),)
        assert len(transport._LAYOUTS) <= transport._MAX_LAYOUTS
