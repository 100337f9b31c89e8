"""Model configuration, normalised from a Hugging Face `config.json` by the model's family.

One frozen dataclass for every family: the fields all of them share, plus the
attention fields a family uses (None or a neutral default for the others).
Parsing, the KV layout and attention costs are the family's
(asap.model.families); everything downstream reads this object, never the raw JSON.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from asap.model.errors import ModelLoadError
from asap.model.quant import QuantConfig
from asap.model.rope import RopeScaling


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    rms_norm_eps: float
    intermediate_size: int          # dense MLP width (dense layers)
    moe_intermediate_size: int      # per-expert width
    num_experts: int                # routed experts per MoE layer
    top_k: int
    moe_layers: tuple[bool, ...]    # per layer: True = routed MoE, False = dense MLP
    norm_topk_prob: bool
    scoring: str                    # router: "sigmoid" (grouped, with correction bias) or "softmax"
    tie_word_embeddings: bool = False
    rope: RopeScaling = field(default_factory=RopeScaling)
    dtype: str | None = None        # the checkpoint's torch_dtype: the runtime default when none is asked for
    quant: QuantConfig | None = None
    num_mtp_layers: int = 0         # multi-token-prediction layers after the last one: never read
    # GQA (Qwen3-MoE, GLM-4.5)
    head_dim: int | None = None
    partial_rotary_factor: float = 1.0
    attention_bias: bool = False
    qk_norm: bool = False
    # MLA (DeepSeek-V3)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_interleave: bool = False
    # routing (DeepSeek-V3, GLM-4.5)
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        from asap.model.families import get_family
        get_family(self.model_type)
        if len(self.moe_layers) != self.num_layers:
            raise ValueError("moe_layers must have one entry per layer")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.top_k} must be in 1..{self.num_experts} (the routed experts)")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ValueError(f"n_group={self.n_group} must divide the {self.num_experts} experts and "
                             f"topk_group={self.topk_group} be <= n_group")
        if self.scoring == "sigmoid" and self.n_group > 1 and self.num_experts // self.n_group < 2:
            raise ValueError("grouped routing needs at least 2 experts per group")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")

    # ---- derived -------------------------------------------------------
    @property
    def family(self):
        from asap.model.families import get_family
        return get_family(self.model_type)

    @property
    def is_mla(self) -> bool:
        """Deprecated: nothing in asap/ reads it; use cfg.family / cfg.attention_cost()."""
        return self.kv_lora_rank is not None

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i, m in enumerate(self.moe_layers) if m]

    @property
    def qk_head_dim(self) -> int:
        return self.attention_cost().qk_head_dim

    @property
    def kv_cache_dims(self) -> dict[str, tuple[int, ...]]:
        """Per-token KV cache entry shapes of one layer (see docs/ARCHITECTURE.md)."""
        return self.family.kv_layout(self)

    def attention_cost(self):
        """The family's attention numbers for the cost model (asap.model.families.base.AttentionCost)."""
        return self.family.attention_cost(self)

    def num_params(self) -> dict[str, int]:
        """Parameter counts split the way the runtime places them, and those one token activates
        (`active`: everything but the embedding table and the routed experts it is not sent to).
        MTP layers are not counted: they are never loaded."""
        D = self.hidden_size
        attn = self.attention_cost().params
        ffn = lambda inter: 3 * D * inter  # noqa: E731
        n_moe = sum(self.moe_layers)
        n_dense = self.num_layers - n_moe
        body = self.num_layers * (attn + 2 * D) + n_dense * ffn(self.intermediate_size) \
            + n_moe * (self.num_experts * D + ffn(self.moe_intermediate_size * self.n_shared_experts)) + D
        attention_side = body + self.vocab_size * D * (1 if self.tie_word_embeddings else 2)
        experts = n_moe * self.num_experts * ffn(self.moe_intermediate_size)
        active = body + self.vocab_size * D + n_moe * self.top_k * ffn(self.moe_intermediate_size)
        return {"attention_side": attention_side, "experts": experts, "total": attention_side + experts,
                "active": active}

    def to_dict(self) -> dict:
        return asdict(self)

    # ---- construction --------------------------------------------------
    @classmethod
    def from_hf(cls, hf: dict, source="config.json") -> "ModelConfig":
        """Build from a parsed HF config.json dict; ModelLoadError (one line, naming `source`) if it is refused."""
        return cls._parse(hf, source)[0]

    @classmethod
    def unread_fields(cls, hf: dict) -> list[str]:
        """Fields of `hf` its family neither honours nor refuses nor knows to be inert."""
        return cls._parse(hf, "config.json")[1]

    @classmethod
    def _parse(cls, hf, source):
        from asap.model.families import get_family
        from asap.model.families.base import Fields
        f = Fields(hf, source)
        fam = get_family(f.get("model_type"), source)
        try:
            return cls(model_type=fam.model_type, **fam.parse(f)), f.unread()
        except ModelLoadError:
            raise
        except ValueError as e:
            raise ModelLoadError(source, str(e)) from None

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        p = Path(path) / "config.json"
        if not p.is_file():
            raise ModelLoadError(path, "no config.json in this directory")
        try:
            hf = json.loads(p.read_text())
        except UnicodeDecodeError:
            raise ModelLoadError(p, "not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise ModelLoadError(p, f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        except OSError as e:
            raise ModelLoadError(p, f"cannot read: {e.strerror}") from None
        cfg, unread = cls._parse(hf, p)
        if unread:
            warnings.warn(f"{p}: fields ASAP does not read (check that they do not change the model): "
                          f"{', '.join(unread)}", stacklevel=2)
        return cfg
