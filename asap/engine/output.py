"""What a prefill returns."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillOutput:
    """One prompt's prefill result.

    kv: one dict per layer; layout in asap/model/batch.py and docs/ARCHITECTURE.md
    (MLA: kv_latent [L, kv_lora_rank], k_rope [L, qk_rope_head_dim];
     GQA: k, v [L, num_kv_heads, head_dim]).
    """
    first_token: int
    logits: torch.Tensor                 # float32 [vocab] at the last prompt position
    kv: list[dict[str, torch.Tensor]]
    num_tokens: int
    request_id: int = -1
    timings: dict = field(default_factory=dict)   # arrival/first-token times etc., engine-specific
