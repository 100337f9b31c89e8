"""The tensors a checkpoint must hold for a config: HF names -> shapes.

The loader checks every tensor it reads against this table (presence and
shape); `materialize` writes exactly these. The attention part is the
family's; embeddings, norms, dense MLPs, the router and experts are common.
"""
from __future__ import annotations

from asap.model.config import ModelConfig


def _ffn(prefix: str, inter: int, D: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (inter, D), prefix + "up_proj.weight": (inter, D),
            prefix + "down_proj.weight": (D, inter)}


def expert_tensors(cfg: ModelConfig, layer: int, expert: int) -> dict[str, tuple[int, ...]]:
    return _ffn(f"model.layers.{layer}.mlp.experts.{expert}.", cfg.moe_intermediate_size, cfg.hidden_size)


def attention_side_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Everything but the routed experts."""
    return _tensors(cfg, experts=False)


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model, in the order presets are written (MTP layers excluded: never read)."""
    return _tensors(cfg, experts=True)


def _tensors(cfg: ModelConfig, experts: bool) -> dict[str, tuple[int, ...]]:
    D, V = cfg.hidden_size, cfg.vocab_size
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        s["lm_head.weight"] = (V, D)
    attn = cfg.family.attention_tensors(cfg)
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        s[p + "input_layernorm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (D,)
        s.update({p + k: v for k, v in attn.items()})
        if not cfg.moe_layers[layer]:
            s.update(_ffn(p + "mlp.", cfg.intermediate_size, D))
            continue
        s[p + "mlp.gate.weight"] = (cfg.num_experts, D)
        if cfg.scoring == "sigmoid":
            s[p + "mlp.gate.e_score_correction_bias"] = (cfg.num_experts,)
        if cfg.n_shared_experts:
            s.update(_ffn(p + "mlp.shared_experts.", cfg.moe_intermediate_size * cfg.n_shared_experts, D))
        for e in range(cfg.num_experts if experts else 0):
            s.update(expert_tensors(cfg, layer, e))
    return s
