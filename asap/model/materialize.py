"""Write a preset as a real HF-format directory with seeded random weights.

No weights can be downloaded here, so presets are materialised once
(`asap make-model PRESET DIR`, or on first use into the model cache) and then
read back through the same loader as any HF checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from asap.config import ModelConfig
from asap.model.tokenizer import write_tokenizer
from asap.model.presets import CONFIG_ONLY, PRESETS, preset_config

SHARD_BYTES = 512 * 2**20


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes of a model (no biases: presets have attention_bias=False)."""
    D, V = cfg.hidden_size, cfg.vocab_size
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        s["lm_head.weight"] = (V, D)
    ffn = lambda p, i: {p + "gate_proj.weight": (i, D), p + "up_proj.weight": (i, D), p + "down_proj.weight": (D, i)}  # noqa: E731
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        s[p + "input_layernorm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (D,)
        a = p + "self_attn."
        if cfg.is_mla:
            H, qk, r, R = cfg.num_heads, cfg.qk_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
            if cfg.q_lora_rank:
                s.update({a + "q_a_proj.weight": (cfg.q_lora_rank, D), a + "q_a_layernorm.weight": (cfg.q_lora_rank,),
                          a + "q_b_proj.weight": (H * qk, cfg.q_lora_rank)})
            else:
                s[a + "q_proj.weight"] = (H * qk, D)
            s.update({a + "kv_a_proj_with_mqa.weight": (r + R, D), a + "kv_a_layernorm.weight": (r,),
                      a + "kv_b_proj.weight": (H * (cfg.qk_nope_head_dim + cfg.v_head_dim), r),
                      a + "o_proj.weight": (D, H * cfg.v_head_dim)})
        else:
            H, Hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
            s.update({a + "q_proj.weight": (H * d, D), a + "k_proj.weight": (Hkv * d, D),
                      a + "v_proj.weight": (Hkv * d, D), a + "o_proj.weight": (D, H * d),
                      a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)})
        if not cfg.moe_layers[layer]:
            s.update(ffn(p + "mlp.", cfg.intermediate_size))
            continue
        s[p + "mlp.gate.weight"] = (cfg.num_experts, D)
        if cfg.scoring == "sigmoid":
            s[p + "mlp.gate.e_score_correction_bias"] = (cfg.num_experts,)
        if cfg.n_shared_experts:
            s.update(ffn(p + "mlp.shared_experts.", cfg.moe_intermediate_size * cfg.n_shared_experts))
        for e in range(cfg.num_experts):
            s.update(ffn(p + f"mlp.experts.{e}.", cfg.moe_intermediate_size))
    return s


def _init(name: str, shape, g: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith("e_score_correction_bias"):
        return 0.05 * torch.randn(shape, generator=g)
    return 0.02 * torch.randn(shape, generator=g)


def materialize(preset: str, out_dir: str | Path, seed: int = 0, shard_bytes: int = SHARD_BYTES) -> Path:
    """Write `preset` to `out_dir` (config.json + sharded safetensors + index). Returns the directory."""
    if preset in CONFIG_ONLY:
        raise ValueError(f"preset {preset!r} is config-only (full size); use it with the simulator")
    hf = preset_config(preset)
    cfg = ModelConfig.from_hf(hf)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    weight_map, shard, size, files = {}, {}, 0, []

    def flush():
        nonlocal shard, size
        if shard:
            fname = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, str(out / fname), metadata={"format": "pt"})
            files.append(fname)
            weight_map.update({k: fname for k in shard})
            shard, size = {}, 0

    for name, shape in tensor_shapes(cfg).items():
        t = _init(name, shape, g)
        shard[name] = t
        size += t.numel() * 4
        if size >= shard_bytes:
            flush()
    flush()
    total = sum(int(torch.tensor(s).prod()) * 4 for s in tensor_shapes(cfg).values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(dict(hf, dtype="float32", asap_seed=seed), indent=2))
    write_tokenizer(out, cfg.vocab_size)
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("ASAP_CACHE", Path.home() / ".cache" / "asap")) / "models"


def resolve_model(model: str | Path, config_only: bool = False) -> Path:
    """A model directory as given, or a preset materialised into the cache on first use.
    With config_only (emulated compute, simulator) a preset gets only its config.json: no weights."""
    p = Path(model)
    if (p / "config.json").is_file():
        return p
    name = str(model)
    try:
        preset_config(name)
    except ValueError:
        raise ValueError(f"{name!r} is neither a model directory (with config.json) nor a preset; "
                         f"presets: {', '.join(sorted(PRESETS))}") from None
    if config_only:
        target = cache_dir() / f"{name}.config-only"
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text(json.dumps(preset_config(name), indent=2))
        return target
    target = cache_dir() / name
    if not _is_current(target, name):
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        materialize(name, tmp)
        stale = target.with_name(target.name + f".stale{os.getpid()}")
        if target.exists():                  # written from an older version of the preset
            target.replace(stale)
        try:
            tmp.replace(target)
        except OSError:          # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
    return target


def _is_current(target: Path, name: str) -> bool:
    """A cached copy is used only if it is complete and was written from the preset as it is now."""
    if not (target / "model.safetensors.index.json").is_file():
        return False
    try:
        written = json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return {k: v for k, v in written.items() if k not in ("dtype", "asap_seed")} == preset_config(name)
