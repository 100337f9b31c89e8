"""Load a local HF-format directory, whole or one slice at a time, checked against its config.

A caller loads only its slice (the attention side, or a subset of experts of
every MoE layer); safetensors reads tensors by name from a memory map, so no
other tensor is read into memory. Every tensor read is checked against the
config (asap.model.tensors): present, of the expected shape, finite. Block-FP8
weights stay FP8 with their scales (keep_fp8): the experts in
asap.model.moe.ExpertShard, the attention side's linear weights as
asap.model.fp8.BlockFp8Weight. With keep_fp8=False the attention side's are
dequantised into the runtime dtype as they are read (asap.model.quant): the
old layout, the reference the FP8 one is checked against. Multi-token-
prediction layers (index >= num_hidden_layers) are never read. Anything wrong
is one ModelLoadError naming the file and tensor.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from asap.model.config import ModelConfig
from asap.model.errors import ModelLoadError
from asap.model.fp8 import BlockFp8Weight
from asap.model.moe import ExpertShard
from asap.model.quant import SCALE_SUFFIX, check_scale, dequantize
from asap.model.stages import AttentionSide
from asap.model.tensors import attention_side_tensors, expert_tensors, tensor_shapes

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT_NAME = re.compile(r"\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def runtime_dtype(cfg: ModelConfig, dtype: torch.dtype | str | None) -> torch.dtype:
    """The dtype asked for, else the checkpoint's torch_dtype, else float32 (block-FP8 checkpoints: bfloat16
    unless their config says otherwise, as their torch_dtype does)."""
    if dtype is None:
        return _DTYPES[cfg.dtype] if cfg.dtype else torch.float32
    return _DTYPES[dtype] if isinstance(dtype, str) else dtype


class Checkpoint:
    """Maps HF tensor names to the safetensors file that holds them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = ModelConfig.from_dir(self.path)
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            self.files = self._read_index(index)
        else:
            self.files = {}
            for f in sorted(self.path.glob("*.safetensors")):
                self.files.update({k: f for k in self._keys(f)})
        if not self.files:
            raise ModelLoadError(self.path, "no *.safetensors weights in this directory")
        self._check_names()

    def _read_index(self, index: Path) -> dict[str, Path]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(index, f"invalid JSON: {getattr(e, 'msg', e)}") from None
        except (KeyError, TypeError):
            raise ModelLoadError(index, "field 'weight_map' must map tensor names to file names") from None
        files = {k: self.path / v for k, v in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                name = next(k for k, v in files.items() if v == f)
                raise ModelLoadError(f, f"shard is missing (listed in {index.name} for {name!r})")
        return files

    def _open(self, f: Path):
        try:
            return safe_open(f, "pt")
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
            raise ModelLoadError(f, f"not a readable safetensors file (truncated or corrupt?): "
                                    f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    def _keys(self, f: Path) -> list[str]:
        with self._open(f) as fh:
            return list(fh.keys())

    def _check_names(self) -> None:
        """Every tensor in the checkpoint is one the config expects (or its FP8 scale, or an MTP layer's)."""
        cfg = self.config
        expected = set(tensor_shapes(cfg))
        for name, f in self.files.items():
            base = name[:-len(SCALE_SUFFIX)] if name.endswith(SCALE_SUFFIX) else name
            if base in expected or (name == "lm_head.weight" and cfg.tie_word_embeddings):   # tied: unused, as in HF
                continue
            m = _LAYER.match(name)
            if m and int(m.group(1)) >= cfg.num_layers:          # MTP layers: never read
                continue
            raise ModelLoadError(f, f"unexpected tensor {name!r}: the config (model_type {cfg.model_type!r}) "
                                    "has no such parameter")

    def read(self, names: list[str], dtype: torch.dtype, device, shapes: dict | None = None) -> dict[str, torch.Tensor]:
        """The named tensors in `dtype` on `device`, each checked (shape against `shapes`, finite)."""
        return dict(self.iter(names, dtype, device, shapes))

    def iter(self, names: list[str], dtype: torch.dtype, device, shapes: dict | None = None, keep_fp8: bool = False):
        """(name, tensor) pairs as `read`, one tensor at a time, so a caller can place each and drop it.
        keep_fp8: a block-FP8 tensor comes as (float8 weight, float32 scale) instead, not dequantised."""
        shapes = shapes if shapes is not None else tensor_shapes(self.config)
        missing = [n for n in names if n not in self.files]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ModelLoadError(self.path, f"tensor {missing[0]!r}{more} is missing from the checkpoint")
        by_file: dict[Path, list[str]] = {}
        for n in names:
            by_file.setdefault(self.files[n], []).append(n)
        for f, ns in by_file.items():
            with self._open(f) as fh:
                for n in ns:
                    t = self._get(fh, f, n, dtype, shapes.get(n), keep_fp8)
                    yield n, tuple(x.to(device) for x in t) if isinstance(t, tuple) else t.to(device)

    def _get(self, fh, f: Path, name: str, dtype: torch.dtype, shape, keep_fp8: bool = False):
        try:
            t = fh.get_tensor(name)
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(f, f"tensor {name!r} cannot be read: {str(e).splitlines()[0]}") from None
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ModelLoadError(f, f"tensor {name!r} has shape {tuple(t.shape)}, the config expects {tuple(shape)}")
        scale_name = name + SCALE_SUFFIX
        if t.dtype in _FP8:
            q = self.config.quant
            if q is None:
                raise ModelLoadError(f, f"tensor {name!r} is {t.dtype} but config.json has no quantization_config")
            if t.dtype != q.storage_dtype:
                raise ModelLoadError(f, f"tensor {name!r} is {t.dtype}, quantization_config says fp8 {q.fmt}")
            if scale_name not in self.files:
                raise ModelLoadError(f, f"tensor {name!r} is block-FP8 but {scale_name!r} is missing")
            with self._open(self.files[scale_name]) as sh:
                scale = sh.get_tensor(scale_name)
            if not torch.isfinite(scale).all():
                raise ModelLoadError(self.files[scale_name], f"tensor {scale_name!r} has non-finite values")
            if keep_fp8:
                check_scale(t, scale, q.block, name, f)
                if not torch.isfinite(t.float()).all():
                    raise ModelLoadError(f, f"tensor {name!r} has non-finite values (NaN)")
                return t, scale.float()
            t = dequantize(t, scale, q.block, dtype, name, f)
        elif scale_name in self.files:
            raise ModelLoadError(f, f"tensor {name!r} has a {scale_name!r} but is stored as {t.dtype}, not fp8")
        elif not t.dtype.is_floating_point:
            raise ModelLoadError(f, f"tensor {name!r} has dtype {t.dtype}; a floating-point dtype is expected")
        else:
            t = t.to(dtype)
        if not torch.isfinite(t).all():
            raise ModelLoadError(f, f"tensor {name!r} has non-finite values (NaN or inf)")
        return t


# Attention-side tensors not run through asap.model.layers.linear: a block-FP8 one among them (no known
# checkpoint has one) is dequantised at load. The router stays float32, as in HF.
_NOT_LINEAR = ("model.embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")


def _as_runtime_weight(name: str, t, block: tuple[int, int] | None, dtype: torch.dtype):
    """A tensor read with keep_fp8: a (float8 weight, float32 scale) pair becomes a BlockFp8Weight (kept FP8),
    unless `name` is one of _NOT_LINEAR; anything else is returned as read."""
    if not isinstance(t, tuple):
        return t
    w = BlockFp8Weight(t[0], t[1], block)
    return w.dequantize(dtype) if name.endswith(_NOT_LINEAR) else w


def _cat_rows(parts: list, dtype: torch.dtype):
    """Stack projections along their output rows (gate then up): one BlockFp8Weight where all are block-FP8
    and their blocks line up (asap.model.fp8.BlockFp8Weight.cat_rows), else one tensor in `dtype` (a
    block-FP8 part dequantised: the numbers dequantising at load gives)."""
    if all(isinstance(p, BlockFp8Weight) for p in parts):
        fused = BlockFp8Weight.cat_rows(parts)
        if fused is not None:
            return fused
    return torch.cat([p.dequantize(dtype) if isinstance(p, BlockFp8Weight) else p for p in parts], dim=0)


def _fuse_ffns(w: dict, dtype: torch.dtype) -> dict:
    """Concatenate gate and up projections so each FFN is two GEMMs."""
    for prefix in ("mlp.", "mlp.shared_experts."):
        g = w.pop(prefix + "gate_proj.weight", None)
        if g is not None:
            w[prefix + "gate_up"] = _cat_rows([g, w.pop(prefix + "up_proj.weight")], dtype)
    return w


def load_attention_side(path, dtype=None, device="cpu", keep_fp8: bool = True) -> AttentionSide:
    """Embeddings, every layer's non-expert weights, the final norm and LM head.
    dtype None: the checkpoint's torch_dtype (float32 when it names none).
    keep_fp8: a block-FP8 checkpoint's linear weights stay FP8 in memory (BlockFp8Weight, run by
    asap.model.layers.linear); False dequantises them into `dtype` at load. No effect on other checkpoints."""
    ck = Checkpoint(path)
    cfg = ck.config
    dtype = runtime_dtype(cfg, dtype)
    shapes = attention_side_tensors(cfg)
    keep_fp8 = keep_fp8 and cfg.quant is not None
    block = cfg.quant.block if keep_fp8 else None
    t = {n: _as_runtime_weight(n, v, block, dtype) for n, v in ck.iter(list(shapes), dtype, device, shapes, keep_fp8)}
    layers: list[dict] = [{} for _ in range(cfg.num_layers)]
    for n, v in t.items():
        m = _LAYER.match(n)
        if m:
            layers[int(m.group(1))][m.group(2)] = v
    for w in layers:
        _fuse_ffns(w, dtype)
        for k in ("mlp.gate.weight", "mlp.gate.e_score_correction_bias"):
            if k in w:                                  # the router is kept in fp32, as in HF
                w[k] = w[k].float()
    lm_head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return AttentionSide(cfg, t["model.embed_tokens.weight"], layers, t["model.norm.weight"], lm_head)


def load_expert_shard(path, expert_ids, dtype=None, device="cpu") -> ExpertShard:
    """expert_ids: the same ids for every MoE layer, or {layer: ids} (a placement with per-layer copies)."""
    ck = Checkpoint(path)
    cfg = ck.config
    dtype = runtime_dtype(cfg, dtype)
    per_layer = expert_ids if isinstance(expert_ids, dict) else {l: expert_ids for l in cfg.moe_layer_ids}
    per_layer = {int(l): sorted(set(int(e) for e in per_layer.get(l, ()))) for l in cfg.moe_layer_ids}
    for ids in per_layer.values():
        if any(not 0 <= e < cfg.num_experts for e in ids):
            raise ValueError(f"expert ids must be in [0, {cfg.num_experts}), got {ids}")
    names = {l: {k: v for e in ids for k, v in expert_tensors(cfg, l, e).items()} for l, ids in per_layer.items()}
    # Block-FP8 experts stay FP8 (with their scales) when every one of them has a scale; else the shard is
    # dequantised at load as the attention side is.
    fp8 = cfg.quant is not None and all(n + SCALE_SUFFIX in ck.files for s in names.values() for n in s)
    shard = empty_expert_shard(cfg, per_layer, dtype, device, fp8)
    I = cfg.moe_intermediate_size
    nI = -(-I // cfg.quant.block[0]) if fp8 else 0
    for layer, ids in per_layer.items():
        # Each tensor goes straight into its slot of the stacked weights: peak memory is the slice plus one tensor.
        gu, dn = shard.gate_up[layer], shard.down[layer]
        slot = {e: i for i, e in enumerate(ids)}
        for name, t in ck.iter(list(names[layer]), dtype, device, names[layer], fp8):          # fp8: keep_fp8
            e, proj = _EXPERT_NAME.search(name).groups()
            i = slot[int(e)]
            if fp8:
                t, scale = t
                gs, ds = shard.scales[layer]
                (ds[i] if proj == "down" else gs[i, :nI] if proj == "gate" else gs[i, nI:]).copy_(scale)
            (dn[i] if proj == "down" else gu[i, :I] if proj == "gate" else gu[i, I:]).copy_(t)
    return shard


def empty_expert_shard(cfg: ModelConfig, per_layer: dict[int, list[int]], dtype: torch.dtype, device="cpu",
                       fp8: bool = False) -> ExpertShard:
    """The stacked (uninitialised) tensors of a shard holding `per_layer` experts: FP8 weights + float32
    block scales when fp8, else `dtype`. On the meta device it sizes a layout without any memory."""
    I, D = cfg.moe_intermediate_size, cfg.hidden_size
    store = cfg.quant.storage_dtype if fp8 else dtype
    gate_up = {l: torch.empty(len(ids), 2 * I, D, dtype=store, device=device) for l, ids in per_layer.items()}
    down = {l: torch.empty(len(ids), D, I, dtype=store, device=device) for l, ids in per_layer.items()}
    if not fp8:
        return ExpertShard.build(cfg.num_experts, per_layer, gate_up, down)
    bo, bi = cfg.quant.block
    scales = {l: (torch.empty(len(ids), 2 * -(-I // bo), -(-D // bi), device=device),    # gate rows, then up rows
                  torch.empty(len(ids), -(-D // bo), -(-I // bi), device=device)) for l, ids in per_layer.items()}
    return ExpertShard.build(cfg.num_experts, per_layer, gate_up, down, scales, cfg.quant.block, dtype)
