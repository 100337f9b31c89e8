"""What a prefill returns."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PromptLogprobs:
    """Opt-in (submit(..., prompt_logprobs=k)): for prompt positions 1..T-1, the log-probability of the
    prompt's own token given the tokens before it, and the k most likely tokens there."""
    token_logprobs: torch.Tensor         # float32 [T-1]
    top_ids: torch.Tensor                # long [T-1, k]
    top_logprobs: torch.Tensor           # float32 [T-1, k]

    @classmethod
    def from_parts(cls, parts) -> "PromptLogprobs | None":
        """From the (token_logprobs, top_ids, top_logprobs) tuple a worker sends; None stays None."""
        return None if parts is None else cls(*parts)


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
    prompt_logprobs: PromptLogprobs | None = None   # only when asked for
