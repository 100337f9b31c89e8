"""Prefilled KV caches waiting to be claimed by a decode instance.

A completion asked for with kv_transfer_params {"do_remote_decode": true} keeps its KV cache under a
random handle until it is claimed (GET /v1/kv/{handle}: served once, then freed) or expires `ttl_s`
after the prefill (the server's timer sweeps expired caches every second or sooner); other requests
keep nothing. The handle is a bearer capability: whoever holds it can read that one cache, once.
Memory is bounded by `max_bytes`, caches being read included (they count until their last byte is
sent or the reader goes): when a new cache does not fit, the OLDEST unclaimed caches are evicted
(requests are never refused for want of KV space); a cache that does not fit beside those being read
is not kept at all.

Wire format: one safetensors file. Tensors are named `layers.{i}.{name}` with
the per-layer names of PrefillOutput.kv: MLA (DeepSeek-V3) `kv_latent`
[T, kv_lora_rank] and `k_rope` [T, qk_rope_head_dim]; GQA (Qwen3-MoE) `k`, `v`
[T, num_kv_heads, head_dim]. T is the prompt length. String metadata: see
`kv_metadata`. A pulled cache is streamed (`stream_chunks`: the safetensors header, then each tensor's
bytes 1 MiB at a time), never encoded whole in memory.
"""
from __future__ import annotations

import json
import secrets
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

import torch
from safetensors.torch import save

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
CHUNK_BYTES = 1 << 20


def _own(t: torch.Tensor) -> torch.Tensor:
    """A tensor holding only its own bytes (a view would keep its whole base alive, unaccounted)."""
    t = t.detach().contiguous()
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


def kv_tensors(kv: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"layers.{i}.{name}": _own(t) for i, layer in enumerate(kv) for name, t in layer.items()}


def kv_metadata(cfg, model: str, completion_id: str, prompt_tokens: int, first_token: int) -> dict[str, str]:
    return {"format": "pt", "model": model, "model_type": cfg.model_type, "layout": cfg.attention_cost().kv_layout,
            "num_layers": str(cfg.num_layers), "num_tokens": str(prompt_tokens),
            "first_token": str(first_token), "completion_id": completion_id}


@dataclass
class _Entry:
    expires: float
    num_bytes: int
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]


def encode(entry: "_Entry") -> bytes:
    """The cache as one safetensors file, whole in memory (tests; the server streams it: stream_chunks)."""
    return save(entry.tensors, metadata=entry.metadata)


def _header(entry: "_Entry") -> bytes:
    """The safetensors header: 8-byte little-endian length, then JSON padded to 8 bytes."""
    meta, offset = {"__metadata__": entry.metadata}, 0
    for name, t in entry.tensors.items():
        size = t.numel() * t.element_size()
        meta[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def stream_size(entry: "_Entry") -> int:
    return len(_header(entry)) + entry.num_bytes


def stream_chunks(entry: "_Entry", chunk_bytes: int = CHUNK_BYTES):
    """The cache as one safetensors file, in pieces of at most chunk_bytes (one copy of each piece at a time)."""
    yield _header(entry)
    for t in entry.tensors.values():
        flat = t.reshape(-1).view(torch.uint8)           # _own() made it contiguous
        for i in range(0, flat.numel(), chunk_bytes):
            yield flat[i:i + chunk_bytes].numpy().tobytes()


def transfer_params(handle: str, public_url: str, engine_id: str, num_tokens: int, num_bytes: int,
                    ttl_s: float) -> dict:
    """The response's kv_transfer_params (vLLM's P/D convention: the decode side pulls from the prefill side).
    public_url is the server's configured address (--public-url), never a request's Host header."""
    url = urlsplit(public_url)
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engine_id,
            "remote_request_id": handle, "remote_host": url.hostname, "remote_port": url.port or
            (443 if url.scheme == "https" else 80), "remote_block_ids": None, "tp_size": 1,
            "kv_url": f"{public_url.rstrip('/')}/v1/kv/{handle}", "kv_format": "safetensors",
            "num_tokens": num_tokens, "num_bytes": num_bytes, "expires_in_s": ttl_s}


class KVStore:
    """Not thread-safe: the server only touches it from its event loop (encoding happens elsewhere)."""

    def __init__(self, max_bytes: int, ttl_s: float, clock=time.monotonic):
        self.max_bytes, self.ttl_s, self.clock = max_bytes, ttl_s, clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()   # oldest first (one TTL for all)
        self._reading: dict[str, _Entry] = {}     # claimed, still being sent: counted until released
        self.num_bytes = 0                        # unclaimed + being read
        self.num_evicted = {"ttl": 0, "memory": 0}
        self.num_stored = self.num_claimed = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> str | None:
        """Keep a cache; returns its handle, or None if it alone exceeds max_bytes."""
        self.sweep()
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if size > self.max_bytes - sum(e.num_bytes for e in self._reading.values()):
            return None                           # does not fit even with every unclaimed cache evicted
        while self.num_bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)), "memory")
        handle = "kv-" + secrets.token_hex(16)
        self._entries[handle] = _Entry(self.clock() + self.ttl_s, size, tensors, metadata)
        self.num_bytes += size
        self.num_stored += 1
        return handle

    def take(self, handle: str) -> _Entry | None:
        """The cache, claimed (nobody else can take it) but still counted against max_bytes until
        release(handle); None if unknown, claimed or expired."""
        self.sweep()
        entry = self._entries.pop(handle, None)
        if entry is None:
            return None
        self._reading[handle] = entry
        self.num_claimed += 1
        return entry

    def release(self, handle: str) -> None:
        """A claimed cache has been sent (or its reader went): free it."""
        entry = self._reading.pop(handle, None)
        if entry is not None:
            self.num_bytes -= entry.num_bytes

    def sweep(self) -> None:
        now = self.clock()
        while self._entries and next(iter(self._entries.values())).expires <= now:
            self._drop(next(iter(self._entries)), "ttl")

    def _drop(self, handle: str, reason: str) -> None:
        self.num_bytes -= self._entries.pop(handle).num_bytes
        self.num_evicted[reason] += 1
