"""What a model family declares, and the checked reader its config parsing goes through.

A family (one module under asap/model/families/) owns everything that differs
between model architectures: which config.json fields it reads and how, its
attention (and the KV layout that attention caches), the names and shapes of
its attention tensors, and the attention-side numbers the cost model needs.
The FFN side (SwiGLU dense layers, routed experts, shared experts) is common
to every family here; a family only says which layers are MoE and how the
router scores (`scoring`). Nothing outside a family's module branches on its
model_type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from asap.model.errors import ModelLoadError, describe

REQUIRED = object()


@dataclass(frozen=True)
class AttentionCost:
    """One layer's attention, as the cost model and the FLOP counter see it."""
    params: int                 # every attention-side parameter of the layer (projections, norms, biases)
    proj_params: int            # projection weights applied once per new token
    context_proj_params: int    # weights applied once per context token (MLA's kv_b expansion); 0 for GQA
    proj_act: int               # activation elements per token the projections read and write
    heads: int                  # query heads of the core attention
    kv_heads: int               # K/V heads the core attention reads per context token
    qk_head_dim: int
    v_head_dim: int
    kv_cache_elems: int         # cached elements per token and layer
    kv_layout: str              # the KV format's name, as KV hand-off metadata states it ("mla", "gqa")
    token_weights: tuple[str, ...] = ()      # projection weights applied per new token (names under a layer)
    context_weights: tuple[str, ...] = ()    # applied per context token (MLA's kv_b_proj); asap profile times them

    @property
    def core_flops_per_pair(self) -> int:
        """QK^T and PV for one (query, key) pair over all heads."""
        return 2 * self.heads * (self.qk_head_dim + self.v_head_dim)

    def kv_read_bytes_per_ctx(self, act_bytes: int) -> int:
        return self.kv_heads * (self.qk_head_dim + self.v_head_dim) * act_bytes

    def q_bytes_per_token(self, act_bytes: int) -> int:
        return self.heads * (self.qk_head_dim + self.v_head_dim) * act_bytes


# attend(w, x, batch, kv, layer) -> [T, D]: one layer's attention over a packed batch (asap.model.attention)
Attend = Callable


class Family:
    model_type: str = ""
    architecture: str = ""          # transformers' class name
    presets: dict[str, dict] = {}
    config_only: frozenset[str] = frozenset()

    def parse(self, f: "Fields") -> dict:
        """ModelConfig keyword arguments from the config's fields (common ones included)."""
        raise NotImplementedError

    def build_attention(self, cfg, device) -> Attend:
        raise NotImplementedError

    def kv_layout(self, cfg) -> dict[str, tuple[int, ...]]:
        """Per-token KV cache entry shapes of one layer."""
        raise NotImplementedError

    def attention_tensors(self, cfg) -> dict[str, tuple[int, ...]]:
        """One layer's attention tensors: HF names after "model.layers.{i}." -> shapes."""
        raise NotImplementedError

    def attention_cost(self, cfg) -> AttentionCost:
        raise NotImplementedError


class Fields:
    """Typed access to a config.json dict; every error is one line naming the file and the field.
    Records which keys were read, so a test can check that every field is honoured or refused."""

    def __init__(self, hf: dict, source):
        if not isinstance(hf, dict):
            raise ModelLoadError(source, f"expected a JSON object, got {type(hf).__name__}")
        self.hf, self.source, self.read = hf, source, set()

    def error(self, key: str, message: str) -> ModelLoadError:
        return ModelLoadError(self.source, f"field {key!r} {message}")

    def get(self, key: str, default=REQUIRED):
        self.read.add(key)
        if key not in self.hf or self.hf[key] is None:
            if default is REQUIRED:
                raise self.error(key, "is missing")
            return default
        return self.hf[key]

    def _absent(self, key: str) -> bool:
        return key not in self.hf or self.hf[key] is None

    def int(self, key: str, default=REQUIRED, min: int = 1) -> int:
        v = self.get(key, default)
        if self._absent(key):
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(key, f"must be an integer, got {describe(v)}")
        if v < min:
            raise self.error(key, f"must be >= {min}, got {v}")
        return v

    def float(self, key: str, default=REQUIRED, positive: bool = True) -> float:
        v = self.get(key, default)
        if self._absent(key):
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(key, f"must be a number, got {describe(v)}")
        if positive and not v > 0:
            raise self.error(key, f"must be > 0, got {v}")
        return float(v)

    def bool(self, key: str, default=REQUIRED) -> bool:
        v = self.get(key, default)
        if self._absent(key):
            return v
        if not isinstance(v, bool):
            raise self.error(key, f"must be true or false, got {describe(v)}")
        return v

    def int_list(self, key: str, default=()) -> tuple[int, ...]:
        v = self.get(key, list(default))
        if self._absent(key):
            return tuple(v)
        if not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
            raise self.error(key, f"must be a list of integers, got {describe(v)}")
        return tuple(v)

    def require(self, key: str, allowed: tuple, default=None, why: str = ""):
        """A field ASAP does not implement beyond the given values: anything else is refused by name."""
        v = self.get(key, default)
        if v not in allowed:
            raise self.error(key, f"= {describe(v)} is not supported (supported: "
                                  f"{', '.join(map(repr, allowed))}){'; ' + why if why else ''}")
        return v

    def inert(self, *keys: str) -> None:
        """Fields that do not change a prefill's result (metadata, training-only settings, generation ids)."""
        self.read.update(keys)

    def unread(self) -> list[str]:
        return sorted(k for k in self.hf if k not in self.read)


DTYPES = ("float32", "bfloat16", "float16")
# Fields that cannot change a prefill's result: metadata, generation ids, training-only settings.
INERT = ("architectures", "model_type", "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id",
         "initializer_range", "use_cache", "auto_map", "attention_dropout", "output_router_logits",
         "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "ep_size", "asap_seed", "name_or_path", "_name_or_path")


def parse_common(f: Fields, default_theta: float = 10000.0, norm_topk_prob: bool = True, rms_norm_eps: float = 1e-6,
                 max_position_embeddings: int = 4096) -> dict:
    """The fields every family here reads the same way; defaults (for absent fields) are transformers' for
    the family."""
    from asap.model.quant import parse_quant
    from asap.model.rope import parse_rope
    f.inert(*INERT)
    f.require("hidden_act", ("silu",), "silu")
    f.require("pretraining_tp", (1,), 1, "tensor-parallel pretraining slices are not emulated")
    f.get("rope_scaling", None), f.get("rope_parameters", None), f.get("rope_theta", None)
    dtype, torch_dtype = f.get("dtype", None), f.get("torch_dtype", None)      # transformers 5, and 4's name
    dtype = dtype or torch_dtype
    if dtype is not None and dtype not in DTYPES:
        raise f.error("torch_dtype", f"= {describe(dtype)} is not supported (supported: {', '.join(DTYPES)})")
    f.get("quantization_config", None)
    heads = f.int("num_attention_heads")
    max_pos = f.int("max_position_embeddings", max_position_embeddings)
    return dict(
        vocab_size=f.int("vocab_size"), hidden_size=f.int("hidden_size"), num_layers=f.int("num_hidden_layers"),
        num_heads=heads, num_kv_heads=f.int("num_key_value_heads", heads), max_position_embeddings=max_pos,
        rms_norm_eps=f.float("rms_norm_eps", rms_norm_eps), intermediate_size=f.int("intermediate_size"),
        moe_intermediate_size=f.int("moe_intermediate_size"), top_k=f.int("num_experts_per_tok"),
        norm_topk_prob=f.bool("norm_topk_prob", norm_topk_prob), tie_word_embeddings=f.bool("tie_word_embeddings", False),
        rope=parse_rope(f.hf, f.source, default_theta), dtype=dtype, quant=parse_quant(f.hf, f.source),
    )
