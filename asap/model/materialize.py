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

from asap.model.config import ModelConfig
from asap.model.errors import ModelLoadError
from asap.model.presets import CONFIG_ONLY, PRESETS, preset_config
from asap.model.quant import SCALE_SUFFIX, quantizable, quantize
from asap.model.tensors import tensor_shapes  # noqa: F401 - re-exported: the names and shapes written
from asap.model.tokenizer import write_tokenizer

SHARD_BYTES = 512 * 2**20


def _init(name: str, shape, g: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith("e_score_correction_bias"):
        return 0.05 * torch.randn(shape, generator=g)
    return 0.02 * torch.randn(shape, generator=g)


def materialize(preset: str, out_dir: str | Path, seed: int = 0, shard_bytes: int = SHARD_BYTES,
                fp8_block: tuple[int, int] | None = None) -> Path:
    """Write `preset` to `out_dir` (config.json + sharded safetensors + index). Returns the directory.
    fp8_block: write the linear weights as block-FP8 (DeepSeek-V3's format) with blocks of this size."""
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

    total = 0
    for name, shape in tensor_shapes(cfg).items():
        t = _init(name, shape, g)
        if fp8_block and quantizable(name, shape):
            t, shard[name + SCALE_SUFFIX] = quantize(t, fp8_block)
        shard[name] = t
        size += sum(shard[n].numel() * shard[n].element_size() for n in (name, name + SCALE_SUFFIX) if n in shard)
        total += t.numel() * t.element_size()
        if size >= shard_bytes:
            flush()
    flush()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    if fp8_block:
        hf = dict(hf, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                           "weight_block_size": list(fp8_block)})
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
    if p.is_dir():
        raise ModelLoadError(p, "no config.json in this directory")
    try:
        preset_config(name)
    except ValueError:
        raise ModelLoadError("", f"{name!r} is neither a model directory (with config.json) nor a preset; "
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
    if (target / "tokenizer.json").is_file() and not (target / "tokenizer_config.json").is_file():
        return False                         # the tokenizer of an older version (no config, 257 ids)
    try:
        written = json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return {k: v for k, v in written.items() if k not in ("dtype", "asap_seed")} == preset_config(name)
