"""First-token sampling in the server, from the last-position logits the engine returns.

Greedy at temperature 0; otherwise temperature, then top-k, top-p and min-p filtering, as vLLM
applies them. A seed makes the draw reproducible: one generator per prompt, seeded with it.
params.py refuses the values that could empty the distribution (non-finite numbers, top_p / min_p below
float32's range); should the filtered distribution still hold no mass (logits that are all -inf or NaN),
the draw falls back to the most likely token rather than let torch.multinomial raise.
"""
from __future__ import annotations

import secrets

import torch

from asap.server.params import Sampling


def sample(logits: torch.Tensor, params: Sampling, n: int) -> list[int]:
    """n token ids (with replacement) from float32 logits [V]."""
    logits = logits.float()
    if params.logit_bias:
        logits = logits.clone()
        ids = torch.tensor([i for i in params.logit_bias if 0 <= i < logits.numel()], dtype=torch.long)
        if ids.numel():
            logits[ids] += torch.tensor([params.logit_bias[int(i)] for i in ids]).clamp(-100, 100)
    if params.greedy:
        return [int(logits.argmax())] * n
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if 0 < params.top_k < probs.numel():
        kth = probs.topk(params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(0) - sorted_p >= params.top_p * sorted_p.sum()   # keep the smallest nucleus
        probs = probs.scatter(0, order[drop], 0.0)
    if params.min_p > 0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, 0.0)
    total = float(probs.sum())
    if not (total > 0 and total != float("inf")):             # NaN too: nothing left to draw from
        return [int(torch.nan_to_num(logits, nan=-float("inf")).argmax())] * n
    gen = torch.Generator().manual_seed((params.seed if params.seed is not None else secrets.randbits(63)) % 2**64)
    return torch.multinomial(probs, n, replacement=True, generator=gen).tolist()
