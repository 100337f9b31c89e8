"""RoPE scaling as transformers computes it (modeling_rope_utils.py): inverse frequencies and the cos/sin factor.

Both spellings are read: transformers 5's `rope_parameters` (which carries
`rope_theta`) and the older `rope_scaling` (`type` or `rope_type`, with
`rope_theta` at the top level). Supported types: default, linear, yarn and
llama3. Others are refused by name: `dynamic` rescales with the sequence
length and `longrope` switches tables at a length, which a chunked prefill
would have to track per request.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from asap.model.errors import ModelLoadError, describe

SUPPORTED = ("default", "linear", "yarn", "llama3")
_NUMBERS = ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
            "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    theta: float = 10000.0
    params: tuple[tuple[str, float | bool | None], ...] = ()    # the type's own parameters, sorted by name

    def get(self, key: str, default=None):
        return dict(self.params).get(key, default)

    def inv_freq(self, dim: int, max_position_embeddings: int) -> torch.Tensor:
        """[dim/2] inverse frequencies of a rotary dimension `dim`."""
        base = self.theta
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        if self.rope_type == "linear":
            return inv / self.get("factor")
        if self.rope_type == "llama3":
            return _llama3(inv, self)
        if self.rope_type == "yarn":
            return _yarn_inv_freq(self, dim, max_position_embeddings)
        return inv

    def attention_factor(self, max_position_embeddings: int) -> float:
        """The factor transformers multiplies cos and sin by (YaRN's mscale ratio; 1 otherwise)."""
        if self.rope_type != "yarn":
            return 1.0
        if self.get("attention_factor") is not None:
            return float(self.get("attention_factor"))
        factor, m, m_all = self._yarn_factor(max_position_embeddings), self.get("mscale"), self.get("mscale_all_dim")
        if m and m_all:
            return float(yarn_mscale(factor, m) / yarn_mscale(factor, m_all))
        return yarn_mscale(factor)

    def _yarn_factor(self, max_position_embeddings: int) -> float:
        f = self.get("factor")
        return f if f is not None else max_position_embeddings / self.get("original_max_position_embeddings")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(r: RopeScaling, dim: int, max_pos: int) -> torch.Tensor:
    base, factor, orig = r.theta, r._yarn_factor(max_pos), r.get("original_max_position_embeddings")
    beta_fast, beta_slow = r.get("beta_fast") or 32, r.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if r.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _llama3(inv: torch.Tensor, r: RopeScaling) -> torch.Tensor:
    factor, lo, hi = r.get("factor"), r.get("low_freq_factor"), r.get("high_freq_factor")
    old = r.get("original_max_position_embeddings")
    low_wavelen, high_wavelen = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


_REQUIRED = {"linear": ("factor",), "yarn": (), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def parse_rope(hf: dict, source, default_theta: float = 10000.0) -> RopeScaling:
    """The config's RoPE settings, checked; ModelLoadError naming the field for anything unsupported."""
    raw = hf.get("rope_parameters")
    field = "rope_parameters"
    if raw is None:
        raw, field = hf.get("rope_scaling"), "rope_scaling"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ModelLoadError(source, f"field {field!r} must be an object, got {describe(raw)}")
    if any(isinstance(v, dict) for v in raw.values()):
        raise ModelLoadError(source, f"field {field!r}: per-layer-type RoPE parameters are not supported")
    rope_type = raw.get("rope_type", raw.get("type", "default"))
    if rope_type not in SUPPORTED:
        raise ModelLoadError(source, f"field {field!r}: rope_type {rope_type!r} is not supported "
                                     f"(supported: {', '.join(SUPPORTED)})")
    theta = raw.get("rope_theta", hf.get("rope_theta", default_theta))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 1:
        raise ModelLoadError(source, f"field 'rope_theta' must be a number > 1, got {describe(theta)}")
    params = {k: v for k, v in raw.items() if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor")}
    for k, v in params.items():
        if k in _NUMBERS and v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ModelLoadError(source, f"field {field!r}: {k} must be a non-negative number, got {describe(v)}")
    for k in _REQUIRED.get(rope_type, ()):
        if params.get(k) is None:
            raise ModelLoadError(source, f"field {field!r}: rope_type {rope_type!r} needs {k!r}")
    if rope_type in ("yarn", "llama3"):     # transformers' standardize_rope_params default
        params.setdefault("original_max_position_embeddings",
                          hf.get("original_max_position_embeddings", hf.get("max_position_embeddings")))
        if not params["original_max_position_embeddings"]:
            raise ModelLoadError(source, f"field {field!r}: rope_type {rope_type!r} needs "
                                         "'original_max_position_embeddings'")
    if rope_type == "yarn" and params.get("factor") is not None and params["factor"] <= 0:
        raise ModelLoadError(source, f"field {field!r}: factor must be > 0")
    if rope_type != "default" and "truncate" in params and not isinstance(params["truncate"], bool):
        raise ModelLoadError(source, f"field {field!r}: truncate must be true or false")
    return RopeScaling(rope_type, float(theta), tuple(sorted(params.items())))
