"""Prompt checks shared by every engine and the server."""
from __future__ import annotations

import torch

from asap.config import ModelConfig


def check_prompt(cfg: ModelConfig, prompt, index: int = 0) -> list[int]:
    """Return the prompt as a list of ints, or raise ValueError naming prompt `index`."""
    if isinstance(prompt, (str, bytes, dict)) or not hasattr(prompt, "__len__"):
        raise ValueError(f"prompt {index}: expected a list of token ids, got {type(prompt).__name__}")
    if len(prompt) == 0:
        raise ValueError(f"prompt {index}: empty prompt")
    if len(prompt) > cfg.max_position_embeddings:
        raise ValueError(f"prompt {index}: {len(prompt)} tokens exceeds the model's "
                         f"max_position_embeddings={cfg.max_position_embeddings}")
    try:
        ids = torch.as_tensor(prompt)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"prompt {index}: token ids must be a flat list of integers") from None
    if ids.dim() != 1 or ids.dtype in (torch.bool,) or ids.dtype.is_floating_point or ids.is_complex():
        raise ValueError(f"prompt {index}: token ids must be a flat list of integers")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= cfg.vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"prompt {index}: token id {bad} outside the vocabulary [0, {cfg.vocab_size})")
    return ids.tolist()
