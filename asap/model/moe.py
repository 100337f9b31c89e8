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
from asap.model.quant import dequantize_into


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
        choice = choice.view(T, G, E // G).masked_fill(~keep[:, :, None], float("-inf")).view(T, E)
    ids = choice.topk(cfg.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling_factor


@dataclass
class ExpertShard:
    """One worker's experts for every MoE layer, stacked per layer (the set may differ per layer).

    Block-FP8 checkpoints stay FP8 here (float8_e4m3fn weights + float32 block scales, asap.model.quant):
    `weights` dequantises one layer's experts into `dtype` when that layer runs, so a shard's resident
    size is the FP8 size and only one layer is ever held in the compute dtype."""
    expert_ids: dict[int, list[int]]            # layer -> global ids held, ascending
    gate_up: dict[int, torch.Tensor]            # layer -> [El, 2I, D]
    down: dict[int, torch.Tensor]               # layer -> [El, D, I]
    local_index: dict[int, torch.Tensor]        # layer -> [E+1] global id -> local slot, -1 if not held
    scales: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None   # FP8: layer -> (gate_up, down) scales
    block: tuple[int, int] | None = None        # FP8: the (out, in) block of one scale
    dtype: torch.dtype | None = None            # FP8: the compute dtype

    @classmethod
    def build(cls, num_experts: int, expert_ids: dict[int, list[int]], gate_up, down, scales=None, block=None,
              dtype=None) -> "ExpertShard":
        local = {}
        device = next((w.device for w in gate_up.values()), torch.device("cpu"))   # tables live by the weights
        for layer, ids in expert_ids.items():
            t = torch.full((num_experts + 1,), -1, dtype=torch.long)   # last slot catches id -1
            t[torch.tensor(ids, dtype=torch.long)] = torch.arange(len(ids))
            local[layer] = t.to(device)
        return cls(expert_ids, gate_up, down, local, scales, block, dtype)

    def weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [El,2I,D], down [El,D,I]) in the compute dtype."""
        if self.scales is None:
            return self.gate_up[layer], self.down[layer]
        gu, dn = self.gate_up[layer], self.down[layer]
        (gs, ds), (bo, _) = self.scales[layer], self.block
        I = dn.shape[2]
        nI = -(-I // bo)                  # gate and up are scaled in blocks of their own: split at row I
        out = torch.empty(gu.shape, dtype=self.dtype, device=gu.device)
        dequantize_stacked(gu[:, :I], gs[:, :nI], self.block, out[:, :I])
        dequantize_stacked(gu[:, I:], gs[:, nI:], self.block, out[:, I:])
        return out, dequantize_stacked(dn, ds, self.block, torch.empty(dn.shape, dtype=self.dtype, device=dn.device))

    def nbytes(self) -> int:
        """Resident bytes of the weights and scales (FP8 shards: the FP8 size)."""
        ts = [*self.gate_up.values(), *self.down.values()]
        ts += [s for pair in (self.scales or {}).values() for s in pair]
        return sum(t.numel() * t.element_size() for t in ts)


def dequantize_stacked(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], out: torch.Tensor):
    """w [El,O,I] float8 with scale [El,ceil(O/bo),ceil(I/bi)] -> out[:] = w * scale, one expert at a time
    through asap.model.quant.dequantize_into (the arithmetic the loader uses: the same numbers), so the
    float32 transient stays bounded."""
    for e in range(w.shape[0]):
        dequantize_into(w[e], scale[e], block, out[e])
    return out


# (device type, dtype) -> whether to use torch._grouped_mm there. CPU float32 starts off: torch's CPU kernel
# ran ~4.5x slower than a loop of MKL GEMMs (P=4096, D=1024, I=512, 8 experts; bf16 ran ~4x faster than the
# loop). A pair the kernel refuses is switched off at its first refusal.
_GROUPED_MM: dict[tuple[str, torch.dtype], bool] = {("cpu", torch.float32): False}


def _grouped_mm_ok(xs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    if not hasattr(torch, "_grouped_mm") or _GROUPED_MM.get((xs.device.type, xs.dtype)) is False:
        return False     # torch < 2.8, or a (device, dtype) that is slow or was refused once
    es = xs.element_size()      # the kernel wants 16-byte aligned row strides
    return (xs.shape[1] * es) % 16 == 0 and (down.shape[2] * es) % 16 == 0


def grouped_swiglu(xs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """xs [P,D] grouped by expert; offs [El] int32, the end row of each expert's group. Row block e goes
    through expert e's SwiGLU FFN: -> [P,D]. Rows past offs[-1] are left undefined (never computed).
    One grouped GEMM per projection, no host sync, where torch has torch._grouped_mm; else a loop of two
    GEMMs per expert after one host copy of the offsets."""
    if _grouped_mm_ok(xs, gate_up, down):
        try:
            h = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=offs)            # [P,2I]
            g, u = h.chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(g).mul_(u), down.transpose(1, 2), offs=offs)   # [P,D]
        except RuntimeError:         # this build has no kernel for this device/dtype (e.g. fp32 on CUDA)
            _GROUPED_MM[(xs.device.type, xs.dtype)] = False
    ys = torch.empty_like(xs)
    s = 0
    for e, end in enumerate(offs.tolist()):
        if end > s:
            g, u = F.linear(xs[s:end], gate_up[e]).chunk(2, dim=-1)
            ys[s:end] = F.linear(F.silu(g).mul_(u), down[e])
            s = end
    return ys


def expert_stage(shard: ExpertShard, layer: int, x: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
    """This shard's weighted partial sum: [T,D]. Pairs of other shards contribute nothing.

    No host sync: the (token, k) pairs are sorted by local slot with this shard's pairs first (others
    last, under slot El), counted on the device, and run through one grouped GEMM per projection whose
    offsets end at the last local pair; the other pairs' rows are never computed and are zeroed before
    the scatter back to tokens."""
    T, K = topk_ids.shape
    gate_up, down = shard.weights(layer)
    El = gate_up.shape[0]
    if El == 0 or T == 0:
        return torch.zeros_like(x)
    slot = shard.local_index[layer][topk_ids.reshape(-1)]                          # [T*K], -1: elsewhere
    mine = slot >= 0
    key = torch.where(mine, slot, El)
    order = key.argsort(stable=True)                                              # grouped by expert, others last
    tokens = order // K                                                           # [T*K]
    counts = torch.zeros(El + 1, dtype=torch.int32, device=x.device)
    counts.index_add_(0, key, torch.ones_like(key, dtype=torch.int32))
    offs = counts[:El].cumsum(0, dtype=torch.int32)                               # [El] end row of each expert
    xs = x[tokens]                                                                # [T*K,D], contiguous per expert
    ys = grouped_swiglu(xs, gate_up, down, offs)                                  # [T*K,D]; rows past offs[-1]: junk
    w = torch.where(mine, topk_weights.reshape(-1), 0)[order].to(ys.dtype)        # [T*K]
    ys = torch.where(mine[order, None], ys * w[:, None], 0)                       # junk rows (even NaN) -> 0
    return torch.zeros_like(x).index_add_(0, tokens, ys)


def combine(residual: torch.Tensor, partials: list[torch.Tensor]) -> torch.Tensor:
    """Sum the shards' partials (in the order given) and add the residual."""
    out = residual.clone()
    for p in partials:
        out += p
    return out
