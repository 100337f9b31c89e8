"""Calibration: the simulated sync baseline against a published prefill throughput, and
op-rate fits for measured profiles.

`calibrate()` simulates DeepSeek's own prefill setup (REFERENCE.md, open-infra-index day 6):
DeepSeek-V3 on 4 nodes of 8 H800 (32 GPUs), routed experts EP32 with 32 redundant
experts (EPLB), MLA and the shared expert DP32, two micro-batches, 4K prompts, 16K
tokens per GPU per step. Published: ~7.8k input tokens/s per GPU. The hardware
efficiencies are not fitted to this point (see asap/sim/hardware.py); the error is
reported as it comes out, and a test holds it inside ERROR_BAND.
"""
from __future__ import annotations

import numpy as np

from asap.scheduler.request import Request
from asap.sim.cost import CostModel
from asap.sim.hardware import OpRate, get_hardware
from asap.sim.run import get_model, run, uniform_shares

PUBLISHED_TOKENS_PER_GPU = 7800.0   # DeepSeek open-infra-index day 6 profile (REFERENCE.md)
ERROR_BAND = 0.35                   # |simulated / published - 1| we accept for an unfitted roofline model


def calibrate(model="deepseek-v3", hardware="h800", devices: int = 32, prompt_len: int = 4096,
              tokens_per_device: int = 16384, redundant_experts: int = 32, zipf: float = 0.0,
              num_steps: int = 4, verbose: bool = True) -> dict:
    """Steady-state sync prefill throughput per device for a closed batch of equal prompts."""
    per_step = devices * tokens_per_device // prompt_len
    requests = [Request(i, prompt_len) for i in range(per_step * num_steps)]
    res = run(requests, "sync", model, hardware, devices, token_budget=tokens_per_device,
              redundant_experts=redundant_experts, zipf=zipf, router="round-robin")
    makespan = max(r.ttft for r in res.results)
    tokens_per_device_s = len(requests) * prompt_len / makespan / devices
    error = tokens_per_device_s / PUBLISHED_TOKENS_PER_GPU - 1
    cost = CostModel(get_model(model), get_hardware(hardware))
    step_ops = cost.step_breakdown([(prompt_len, 0)] * (tokens_per_device // prompt_len), tokens_per_device * devices,
                                   uniform_shares(cost.model, devices), devices, True, devices)
    out = {"label": "SIMULATED", "model": str(model), "hardware": str(hardware), "devices": devices,
           "prompt_len": prompt_len, "tokens_per_device_per_step": tokens_per_device,
           "step_s": makespan / num_steps, "simulated_tokens_per_device_s": tokens_per_device_s,
           "published_tokens_per_device_s": PUBLISHED_TOKENS_PER_GPU, "error": error,
           "error_band": ERROR_BAND, "within_band": abs(error) <= ERROR_BAND,
           "unoverlapped_step_breakdown_s": step_ops}
    if verbose:
        print(f"[SIMULATED] sync {model} prefill on {devices} x {hardware}: {tokens_per_device_s:.0f} input tokens/s "
              f"per GPU (step {out['step_s']:.3f} s); published ~{PUBLISHED_TOKENS_PER_GPU:.0f}; "
              f"error {error:+.1%} (band +-{ERROR_BAND:.0%})")
        print("[SIMULATED] per-step op seconds if nothing overlapped: "
              + ", ".join(f"{k} {v:.3f}" for k, v in sorted(step_ops.items(), key=lambda kv: -kv[1])))
    return out


def fit_op_rate(samples: list[tuple[float, float, float]], weights=None) -> OpRate:
    """Fit time = overhead + max(flops / F, bytes / B) to measured (flops, bytes, seconds) samples.

    For `asap profile`: measure one op at several sizes, fit, and store the rates in a
    hardware JSON (asap.sim.hardware schema). Least squares on the sum form
    overhead + flops/F + bytes/B with non-negative terms, which bounds the max form from above
    (OpRate(overlap=False) keeps the sum form). `weights` scale each sample's error
    (1 / seconds: relative errors, so small samples count as much as large ones).
    """
    a = np.asarray(samples, dtype=float)
    if a.ndim != 2 or a.shape[1] != 3 or len(a) < 3:
        raise ValueError("need at least 3 (flops, bytes, seconds) samples")
    X = np.column_stack([np.ones(len(a)), a[:, 0], a[:, 1]])
    w = np.ones(len(a)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (len(a),) or not (w > 0).all():
        raise ValueError("weights must be one positive number per sample")
    coef = _nnls(X * w[:, None], a[:, 2] * w)
    tiny = 1e-30
    return OpRate(flops_per_s=1 / max(coef[1], tiny), bytes_per_s=1 / max(coef[2], tiny), overhead_s=coef[0])


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for 3 unknowns: best over all subsets of free columns."""
    best, best_err = np.zeros(X.shape[1]), float(np.sum(y ** 2))
    scale = np.abs(X).max(axis=0) + 1e-300
    Xs = X / scale
    for mask in range(1, 2 ** X.shape[1]):
        cols = [j for j in range(X.shape[1]) if mask >> j & 1]
        c, *_ = np.linalg.lstsq(Xs[:, cols], y, rcond=None)
        if (c < 0).any():
            continue
        err = float(np.sum((Xs[:, cols] @ c - y) ** 2))
        if err < best_err:
            best_err = err
            best = np.zeros(X.shape[1])
            best[cols] = c
    return best / scale
