"""Routed-expert math: the gate (attention side), the expert stage (expert side), combine.

Shape legend: T tokens, D hidden, K top-k, E experts in the model, El experts
in one shard, I per-expert width. Expert ids are global; -1 marks a (token, k)
pair that belongs to another shard.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from asap.model.config import ModelConfig


def gate(cfg: ModelConfig, w: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: x [T,D] -> (topk_ids [T,K] int64, topk_weights [T,K] float32)."""
    logits = F.linear(x.float(), w["mlp.gate.weight"].float())                     # [T,E]
    if cfg.scoring == "softmax":
        probs = logits.softmax(dim=-1)
        weights, ids = probs.topk(cfg.top_k, dim=-1)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights
    # DeepSeek-V3: sigmoid scores; the correction bias picks experts but does not weight them.
    scores = logits.sigmoid()
    choice = scores + w["mlp.gate.e_score_correction_bias"].float()
    T, E, G = x.shape[0], cfg.num_experts, cfg.n_group
    if G > 1:
        group_scores = choice.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)     # [T,G]
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(cfg.topk_group, dim=-1, sorted=False).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    ids = choice.topk(cfg.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling_factor


@dataclass
class ExpertShard:
    """One worker's experts for every MoE layer, stacked per layer (the set may differ per layer)."""
    expert_ids: dict[int, list[int]]            # layer -> global ids held, ascending
    gate_up: dict[int, torch.Tensor]            # layer -> [El, 2I, D]
    down: dict[int, torch.Tensor]               # layer -> [El, D, I]
    local_index: dict[int, torch.Tensor]        # layer -> [E+1] global id -> local slot, -1 if not held

    @classmethod
    def build(cls, num_experts: int, expert_ids: dict[int, list[int]], gate_up, down) -> "ExpertShard":
        local = {}
        device = next((w.device for w in gate_up.values()), torch.device("cpu"))   # tables live by the weights
        for layer, ids in expert_ids.items():
            t = torch.full((num_experts + 1,), -1, dtype=torch.long)   # last slot catches id -1
            t[torch.tensor(ids, dtype=torch.long)] = torch.arange(len(ids))
            local[layer] = t.to(device)
        return cls(expert_ids, gate_up, down, local)


def expert_stage(shard: ExpertShard, layer: int, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
    """This shard's weighted partial sum: [T,D]. Pairs of other shards contribute nothing."""
    T, K = topk_ids.shape
    out = torch.zeros_like(x)
    slot = shard.local_index[layer][topk_ids.reshape(-1)]                          # [T*K]
    pairs = (slot >= 0).nonzero().squeeze(1)
    if pairs.numel() == 0:
        return out
    slot = slot[pairs]
    order = slot.argsort(stable=True)                                             # group pairs by expert
    pairs, slot = pairs[order], slot[order]
    tokens = pairs // K
    xs = x[tokens]                                                                # [P,D], contiguous per expert
    counts = torch.bincount(slot, minlength=len(shard.expert_ids[layer])).tolist()
    gate_up, down = shard.gate_up[layer], shard.down[layer]
    ys = torch.empty_like(xs)
    s = 0
    for e, n in enumerate(counts):
        if n:
            g, u = F.linear(xs[s:s + n], gate_up[e]).chunk(2, dim=-1)
            ys[s:s + n] = F.linear(F.silu(g) * u, down[e])
            s += n
    ys *= topk_weights.reshape(-1)[pairs].to(ys.dtype)[:, None]
    return out.index_add_(0, tokens, ys)


def combine(residual: torch.Tensor, partials: list[torch.Tensor]) -> torch.Tensor:
    """Sum the shards' partials (in the order given) and add the residual."""
    out = residual.clone()
    for p in partials:
        out += p
    return out
