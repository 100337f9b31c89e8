"""The stage split every engine is built on.

Per layer:
  attention_stage  (attention worker): input norm, attention, residual, post-attention norm,
                   and for an MoE layer the gate and shared experts; a dense layer finishes here.
  expert_stage     (expert worker, asap.model.moe): one shard's weighted partial sum.
  combine          (attention worker, asap.model.moe): residual + sum of partials.
`forward` (the reference engine) composes exactly these; the workers call the same functions.
Shape legend: T packed tokens, D hidden, K top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asap.model.config import ModelConfig
from asap.model.batch import Batch, KVCache
from asap.model.fp8 import BlockFp8Weight
from asap.model.layers import gated_ffn, rms_norm
from asap.model.moe import ExpertShard, combine, expert_stage, gate


@dataclass
class AttentionSide:
    """Everything an attention worker holds: embeddings, per-layer non-expert weights, head."""
    cfg: ModelConfig
    embed: torch.Tensor                 # [V,D]
    layers: list[dict]                  # per layer, HF names without "model.layers.{i}." (tensors or BlockFp8Weight)
    norm: torch.Tensor                  # [D]
    lm_head: torch.Tensor               # [V,D]

    def __post_init__(self):
        # The family binds its attention to this config: RoPE table, softmax scale, KV layout.
        self._attend = self.cfg.family.build_attention(self.cfg, self.embed.device)

    def nbytes(self) -> int:
        """Resident bytes of every weight held (block-FP8 weights: the FP8 bytes and their scales)."""
        ws = [self.embed, self.norm, *(w for layer in self.layers for w in layer.values())]
        ws += [self.lm_head] if self.lm_head is not self.embed else []
        return sum(w.nbytes() if isinstance(w, BlockFp8Weight) else w.numel() * w.element_size() for w in ws)


@dataclass
class StageOut:
    h: torch.Tensor                       # dense layer: the layer output; MoE layer: residual (+ shared experts)
    x: torch.Tensor | None = None         # MoE: normed input to the experts [T,D]
    topk_ids: torch.Tensor | None = None  # MoE: [T,K]
    topk_weights: torch.Tensor | None = None


def embed(side: AttentionSide, token_ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(token_ids, side.embed)


def attention_stage(side: AttentionSide, layer: int, h: torch.Tensor, batch: Batch, kv: KVCache) -> StageOut:
    cfg, w = side.cfg, side.layers[layer]
    a = side._attend(w, rms_norm(h, w["input_layernorm.weight"], cfg.rms_norm_eps), batch, kv, layer)
    h = h + a
    x = rms_norm(h, w["post_attention_layernorm.weight"], cfg.rms_norm_eps)
    if not cfg.moe_layers[layer]:
        return StageOut(h=h + gated_ffn(x, w["mlp.gate_up"], w["mlp.down_proj.weight"]))
    ids, weights = gate(cfg, w, x)
    if cfg.n_shared_experts:
        h = h + gated_ffn(x, w["mlp.shared_experts.gate_up"], w["mlp.shared_experts.down_proj.weight"])
    return StageOut(h=h, x=x, topk_ids=ids, topk_weights=weights)


def last_logits(side: AttentionSide, h: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Final norm + LM head at the given packed rows -> float32 [len(rows), V]."""
    hs = rms_norm(h[rows], side.norm, side.cfg.rms_norm_eps)
    return F.linear(hs, side.lm_head).float()


def prompt_logprobs(side: AttentionSide, h: torch.Tensor, rows: list[int], next_ids: torch.Tensor, k: int,
                    rows_per_step: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities of `next_ids` [n] at the packed `rows` [n], and the top-k there.

    -> (token_logprobs [n], top_ids [n,k], top_logprobs [n,k]), float32 / long. Only these rows go
    through the LM head, `rows_per_step` at a time, so memory stays O(rows_per_step x V)."""
    parts = []
    for i in range(0, len(rows), rows_per_step):
        lp = torch.log_softmax(last_logits(side, h, rows[i:i + rows_per_step]), dim=-1)
        top = lp.topk(k, dim=-1) if k else None
        parts.append((lp.gather(1, next_ids[i:i + rows_per_step, None].to(lp.device))[:, 0],
                      top.indices if top else torch.zeros(len(lp), 0, dtype=torch.long),
                      top.values if top else torch.zeros(len(lp), 0)))
    if not parts:
        return torch.zeros(0), torch.zeros(0, k, dtype=torch.long), torch.zeros(0, k)
    return tuple(torch.cat([p[j] for p in parts]).cpu() for j in range(3))


def forward(side: AttentionSide, shards: list[ExpertShard], token_ids: torch.Tensor, batch: Batch,
            kv: KVCache) -> torch.Tensor:
    """Single-process forward of one packed batch -> final hidden states [T,D]."""
    h = embed(side, token_ids)
    for layer in range(side.cfg.num_layers):
        s = attention_stage(side, layer, h, batch, kv)
        if s.x is None:
            h = s.h
        else:
            h = combine(s.h, [expert_stage(sh, layer, s.x, s.topk_ids, s.topk_weights) for sh in shards])
    return h
