"""A packed prefill batch and the per-request KV cache.

A batch is a list of chunks (request_id, start, num_tokens): tokens
[start, start+num_tokens) of one request's prompt, packed back to back into
one [T, D] tensor. Chunks with start > 0 attend to the KV already in the cache
(chunked prefill). Any object with those three attributes is a chunk.

KV layout, per request and per layer: the family's (cfg.kv_cache_dims; asap.model.families), e.g.
  MLA (DeepSeek-V3): kv_latent [L, kv_lora_rank] (after kv_a_layernorm), k_rope [L, qk_rope_head_dim] (after RoPE)
  GQA (Qwen3-MoE, GLM-4.5): k [L, num_kv_heads, head_dim] (after k_norm and RoPE), v [L, num_kv_heads, head_dim]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from asap.model.config import ModelConfig


class Chunk(NamedTuple):
    request_id: int
    start: int
    num_tokens: int


@dataclass
class Batch:
    chunks: list                 # objects with request_id, start, num_tokens
    positions: torch.Tensor      # [T] absolute position of each packed token
    offsets: list[int]           # chunk i occupies rows offsets[i]:offsets[i+1]

    @classmethod
    def build(cls, chunks, device=None) -> "Batch":
        offsets = [0]
        for c in chunks:
            offsets.append(offsets[-1] + c.num_tokens)
        positions = torch.cat([torch.arange(c.start, c.start + c.num_tokens) for c in chunks]) if chunks \
            else torch.zeros(0, dtype=torch.long)
        return cls(list(chunks), positions.to(device), offsets)

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    def segments(self):
        """Yield (chunk, row slice) pairs."""
        for i, c in enumerate(self.chunks):
            yield c, slice(self.offsets[i], self.offsets[i + 1])


class KVCache:
    """Prompt-length KV buffers per request, written chunk by chunk."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device=None):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self._store: dict[int, list[dict[str, torch.Tensor]]] = {}

    def allocate(self, request_id: int, num_tokens: int) -> None:
        if request_id in self._store:
            return
        self._store[request_id] = [
            {k: torch.empty((num_tokens, *shape), dtype=self.dtype, device=self.device)
             for k, shape in self.cfg.kv_cache_dims.items()}
            for _ in range(self.cfg.num_layers)
        ]

    def write(self, request_id: int, layer: int, start: int, **entries: torch.Tensor) -> None:
        buf = self._store[request_id][layer]
        for k, v in entries.items():
            buf[k][start:start + v.shape[0]] = v

    def read(self, request_id: int, layer: int, end: int) -> dict[str, torch.Tensor]:
        return {k: v[:end] for k, v in self._store[request_id][layer].items()}

    def pop(self, request_id: int) -> list[dict[str, torch.Tensor]]:
        return self._store.pop(request_id)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._store

    def __len__(self) -> int:
        return len(self._store)
