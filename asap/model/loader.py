"""Load a local HF-format directory, whole or one slice at a time.

A caller loads only its slice (the attention side, or a subset of experts of
every MoE layer); safetensors reads tensors by name from a memory map, so no
other tensor is read into memory.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from asap.config import ModelConfig
from asap.model.moe import ExpertShard
from asap.model.stages import AttentionSide

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"\.mlp\.experts\.")


class Checkpoint:
    """Maps HF tensor names to the safetensors file that holds them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = ModelConfig.from_dir(self.path)
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            self.files = {k: self.path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        else:
            self.files = {}
            for f in sorted(self.path.glob("*.safetensors")):
                with safe_open(f, "pt") as fh:
                    self.files.update({k: f for k in fh.keys()})
        if not self.files:
            raise FileNotFoundError(f"no *.safetensors weights in {self.path}")

    def read(self, names: list[str], dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
        missing = [n for n in names if n not in self.files]
        if missing:
            raise KeyError(f"{self.path}: missing tensors {missing[:3]}{'...' if len(missing) > 3 else ''}")
        out: dict[str, torch.Tensor] = {}
        by_file: dict[Path, list[str]] = {}
        for n in names:
            by_file.setdefault(self.files[n], []).append(n)
        for f, ns in by_file.items():
            with safe_open(f, "pt") as fh:
                for n in ns:
                    out[n] = fh.get_tensor(n).to(device=device, dtype=dtype)
        return out


def _fuse_ffns(w: dict) -> dict:
    """Concatenate gate and up projections so each FFN is two GEMMs."""
    for prefix in ("mlp.", "mlp.shared_experts."):
        g = w.pop(prefix + "gate_proj.weight", None)
        if g is not None:
            w[prefix + "gate_up"] = torch.cat((g, w.pop(prefix + "up_proj.weight")), dim=0)
    return w


def load_attention_side(path, dtype=torch.float32, device="cpu") -> AttentionSide:
    ck = Checkpoint(path)
    cfg = ck.config
    names = [n for n in ck.files if not _EXPERT.search(n)]
    t = ck.read(names, dtype, device)
    layers: list[dict] = [{} for _ in range(cfg.num_layers)]
    for n, v in t.items():
        m = _LAYER.match(n)
        if m and int(m.group(1)) < cfg.num_layers:      # skips e.g. DeepSeek's MTP layer
            layers[int(m.group(1))][m.group(2)] = v
    for w in layers:
        _fuse_ffns(w)
        for k in ("mlp.gate.weight", "mlp.gate.e_score_correction_bias"):
            if k in w:                                  # the router is kept in fp32, as in HF
                w[k] = w[k].float()
    lm_head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return AttentionSide(cfg, t["model.embed_tokens.weight"], layers, t["model.norm.weight"], lm_head)


def load_expert_shard(path, expert_ids, dtype=torch.float32, device="cpu") -> ExpertShard:
    """expert_ids: the same ids for every MoE layer, or {layer: ids} (a placement with per-layer copies)."""
    ck = Checkpoint(path)
    cfg = ck.config
    per_layer = expert_ids if isinstance(expert_ids, dict) else {l: expert_ids for l in cfg.moe_layer_ids}
    per_layer = {int(l): sorted(set(int(e) for e in per_layer.get(l, ()))) for l in cfg.moe_layer_ids}
    gate_up, down = {}, {}
    for layer, ids in per_layer.items():
        if any(not 0 <= e < cfg.num_experts for e in ids):
            raise ValueError(f"expert ids must be in [0, {cfg.num_experts}), got {ids}")
        p = f"model.layers.{layer}.mlp.experts."
        t = ck.read([p + f"{e}.{proj}_proj.weight" for e in ids for proj in ("gate", "up", "down")], dtype, device)
        gate_up[layer] = torch.stack([torch.cat((t[p + f"{e}.gate_proj.weight"], t[p + f"{e}.up_proj.weight"]))
                                      for e in ids]) if ids else torch.empty(0)
        down[layer] = torch.stack([t[p + f"{e}.down_proj.weight"] for e in ids]) if ids else torch.empty(0)
    return ExpertShard.build(cfg.num_experts, per_layer, gate_up, down)
