"""Calibration: the simulated sync baseline against every published prefill point, the two-batch-overlap
gain, SGLang's prompt-length series, and op-rate fits for measured profiles.

Each point is simulated in its own published setup: DeepSeek-V3, closed batches of equal prompts, sync
DP32 attention + EP32 experts with 32 redundant experts (EPLB), two-batch overlap, per-batch drawn expert
loads (asap.cost.loads). Sources (REFERENCE.md unless said):
- DeepSeek's profile, 4 nodes of H800, 4K prompts, 16K tokens per GPU: 62,713 tokens/s per node (lmsys
  2025-05-05 "Profile Results"; ~7800 per GPU in open-infra-index day 6). Routing: "an absolutely balanced
  MoE routing strategy" (deepseek-ai/profile-data README) -> skew 0.
- SGLang, same setup on H100, "simulated perfect EPLB" (random experts under group-limited routing): 59,337
  per node -> skew 0 (only a finite batch's routing noise).
- SGLang, same setup, default expert distribution: 50,302 per node -> skew SKEW (below).
- CloudMatrix-Infer (arXiv 2506.12708 abstract): 6,688 tokens/s per 910C chip (2 dies) at 4K prompts.
  ASSUMED (the sources do not give them): 16,384 tokens per die per step on 32 dies (EP32), EPLB with 32
  redundant experts and the default skew.
- SGLang's two-batch overlap adds 27-35% at the same tokens per device; its 1K / 2K / 4K prompt series
  (57,674 / 54,543 / 50,302 per node) is printed as a shape check (ratios to 4K).

SKEW, the per-batch expert-popularity drift (asap.cost.loads), is DERIVED from a published expert-load
statistic, not fitted to these points: TensorRT-LLM's large-scale EP blog (part 1, Table 1; DeepSeek-R1,
EP32, 9 slots per rank with EPLB, 1,024 rows per rank per iteration) reports a busiest-rank imbalance
(max / mean - 1) of 0.109 and a per-rank std of 52.0 rows; the model gives 0.108 and 50.6 at skew 0.12
(`trtllm_check`). The alternative the issue allowed, fitting the skew so that SGLang's default point is
reproduced given its perfect-EPLB point, needs skew ~0.56 (fit_sglang_skew; it then sits as far above
SGLang's default as the perfect-EPLB point sits above its own, +15.6%); three independent checks reject
it: it implies an EPLB imbalance of ~0.5 at TensorRT-LLM's setting (published 0.109), a two-batch
overlap gain of ~+51% (SGLang: 27-35%), and a flatter prompt-length series. Putting the extra imbalance
on requests instead (each prompt its own popularity, so a batch's drift shrinks as 1/sqrt(prompts per
batch): skew_b(L)^2 = SKEW^2 + s_r^2 L / T, s_r fitted to the same 4K point) makes the series too steep
(1K / 2K ratios to 4K of ~1.25 / 1.15 vs SGLang's 1.147 / 1.084). So SGLang's default point is
NOT explained by routing imbalance as a cost model sees it (the busiest rank's GEMMs and traffic); the
lmsys blog itself puts the rest on communication kernels that run longer and more variably under
imbalance. `calibrate` prints both and says which points fall outside +-15%.
The hardware efficiencies are not fitted to any point (asap/cost/hardware.py says where each comes from).
"""
from __future__ import annotations

import numpy as np

from asap.cost.hardware import OpRate, get_hardware
from asap.cost.model import CostModel
from asap.scheduler.request import Request
from asap.sim.experts import DEFAULT_SKEW
from asap.sim.run import get_model, run, uniform_shares

SKEW = DEFAULT_SKEW                 # per-batch popularity drift, 0.12, from TensorRT-LLM's EPLB table (see above)
PUBLISHED_TOKENS_PER_GPU = 62713 / 8    # DeepSeek's profile (lmsys 2025-05-05)
ERROR_BAND = 0.15                   # the target for each published point
POINTS = (
    # name, hardware, published tokens/s per device, expert skew, source
    ("DeepSeek profile (H800, balanced)", "h800", 62713 / 8, 0.0,
     "lmsys 2025-05-05: 62,713/node; open-infra-index ~7800/GPU"),
    ("SGLang perfect EPLB (H100)", "h100", 59337 / 8, 0.0, "lmsys 2025-05-05: 59,337/node"),
    ("SGLang default (H100)", "h100", 50302 / 8, SKEW, "lmsys 2025-05-05: 50,302/node"),
    ("CloudMatrix-Infer (per die)", "cloudmatrix384", 6688 / 2, SKEW, "arXiv 2506.12708: 6,688/chip, 2 dies"),
)
SERIES = ((1024, 57674 / 8), (2048, 54543 / 8), (4096, 50302 / 8))     # SGLang default, per GPU
TBO_GAIN_BAND = (0.27, 0.35)        # SGLang: two-batch overlap adds 27-35% to prefill
TRTLLM_EPLB = dict(imbalance=0.109, std_rows=52.0, rows_per_rank=1024, workers=32, redundant=32)


def closed_batch(model="deepseek-v3", hardware="h800", devices: int = 32, prompt_len: int = 4096,
                 tokens_per_device: int = 16384, redundant_experts: int = 32, zipf: float = 0.0,
                 num_steps: int = 4, two_batch_overlap: bool = True, skew: float = 0.0,
                 expert_load: str = "drawn", seed: int = 0) -> tuple[float, float]:
    """(tokens/s per device, step seconds) of a closed batch of equal prompts on the sync engine."""
    per_step = devices * tokens_per_device // prompt_len
    requests = [Request(i, prompt_len) for i in range(per_step * num_steps)]
    res = run(requests, "sync", model, hardware, devices, token_budget=tokens_per_device,
              redundant_experts=redundant_experts, zipf=zipf, router="round-robin",
              two_batch_overlap=two_batch_overlap, expert_load=expert_load, expert_skew=skew, seed=seed)
    makespan = max(r.ttft for r in res.results)
    return len(requests) * prompt_len / makespan / devices, makespan / num_steps


def fit_sglang_skew(perfect: float, model="deepseek-v3", tol: float = 0.005, **kw) -> float:
    """The skew at which the simulated SGLang default / perfect-EPLB ratio is SGLang's (50,302 / 59,337),
    by bisection on [0, 2]; `perfect` is the simulated perfect-EPLB throughput (skew 0)."""
    target = 50302 / 59337
    lo, hi = 0.0, 2.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if closed_batch(model, "h100", skew=mid, **kw)[0] / perfect > target:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 3)


def trtllm_check(skew: float, model="deepseek-v3", seed: int = 0, samples: int = 50) -> dict:
    """The drawn model at TensorRT-LLM's EPLB setting (Table 1): mean busiest-rank imbalance and rank std."""
    from asap.sim.experts import load_model, plan_experts, zipf_loads
    m = get_model(model)
    t = TRTLLM_EPLB
    n_moe = sum(m.moe_layers)
    shares = plan_experts(zipf_loads(n_moe, m.num_experts, 0.0), t["workers"], t["redundant"],
                          load_model("drawn", skew, seed), m)
    tokens = t["rows_per_rank"] * t["workers"] / m.top_k
    rows = np.array([shares.draws.rows(layer, tokens) for layer in range(n_moe) for _ in range(samples)])
    return {"imbalance": float((rows.max(axis=1) / rows.mean(axis=1) - 1).mean()),
            "std_rows": float(rows.std(axis=1).mean())}


def calibrate(model="deepseek-v3", hardware="h800", devices: int = 32, prompt_len: int = 4096,
              tokens_per_device: int = 16384, redundant_experts: int = 32, zipf: float = 0.0,
              num_steps: int = 4, verbose: bool = True, seed: int = 0) -> dict:
    """Every published point, the TBO gain, the prompt-length series, the skew's checks and (for
    `hardware`) the step's per-op breakdown. The top-level "error" is `hardware`'s own point (DeepSeek's
    for h800). Everything is SIMULATED."""
    kw = dict(devices=devices, tokens_per_device=tokens_per_device, redundant_experts=redundant_experts,
              zipf=zipf, num_steps=num_steps, seed=seed)
    points = []
    for name, hw_name, published, skew, source in POINTS:
        sim, step = closed_batch(model, hw_name, prompt_len=prompt_len, skew=skew, **kw)
        points.append({"name": name, "hardware": hw_name, "skew": skew, "published_tokens_per_device_s": published,
                       "simulated_tokens_per_device_s": sim, "step_s": step, "error": sim / published - 1,
                       "within_band": abs(sim / published - 1) <= ERROR_BAND, "source": source})
    # The blog does not say which expert distribution its TBO ablation ran with: the gain is printed for
    # balanced routing (its profile setup: "tbo_gain") and for the default skew ("tbo_gain_default_skew").
    tbo_on, _ = closed_batch(model, "h100", prompt_len=prompt_len, skew=0.0, **kw)
    tbo_off, _ = closed_batch(model, "h100", prompt_len=prompt_len, skew=0.0, two_batch_overlap=False, **kw)
    gain = tbo_on / tbo_off - 1
    skew_off, _ = closed_batch(model, "h100", prompt_len=prompt_len, skew=SKEW, two_batch_overlap=False, **kw)
    series = [{"prompt_len": L, "published_tokens_per_device_s": pub,
               "simulated_tokens_per_device_s": closed_batch(model, "h100", prompt_len=L, skew=SKEW, **kw)[0]}
              for L, pub in SERIES]
    for s in series:
        s["published_ratio_to_4k"] = s["published_tokens_per_device_s"] / series[-1]["published_tokens_per_device_s"]
        s["simulated_ratio_to_4k"] = s["simulated_tokens_per_device_s"] / series[-1]["simulated_tokens_per_device_s"]
    gain_skew = points[2]["simulated_tokens_per_device_s"] / skew_off - 1
    fit = fit_sglang_skew(points[1]["simulated_tokens_per_device_s"], model=model, prompt_len=prompt_len, **kw)
    fit_default, _ = closed_batch(model, "h100", prompt_len=prompt_len, skew=fit, **kw)
    fit_tbo_off, _ = closed_batch(model, "h100", prompt_len=prompt_len, skew=fit, two_batch_overlap=False, **kw)
    # the same 4K point explained by per-request popularity instead: a batch of T tokens in prompts of L
    # has T / L prompts, so its drift is skew_b(L) with skew_b^2 = SKEW^2 + s_r^2 L / T
    batch = devices * tokens_per_device // 2
    s_r2 = (fit ** 2 - SKEW ** 2) * batch / prompt_len
    per_request = [closed_batch(model, "h100", prompt_len=L, skew=(SKEW ** 2 + s_r2 * L / batch) ** 0.5, **kw)[0]
                   for L, _ in SERIES]
    alternative = {"skew": fit, "sglang_default_tokens_per_device_s": fit_default,
                   "sglang_default_error": fit_default / (50302 / 8) - 1, "tbo_gain": fit_default / fit_tbo_off - 1,
                   "trtllm": trtllm_check(fit, model, seed),
                   "per_request_series_ratio_to_4k": [x / per_request[-1] for x in per_request]}
    mine = next((p for p in points if p["hardware"] == str(hardware)), None)
    if mine is None:
        sim, step = closed_batch(model, hardware, prompt_len=prompt_len, skew=SKEW, **kw)
        mine = {"name": f"{hardware} (no published point)", "hardware": str(hardware), "simulated_tokens_per_device_s": sim,
                "step_s": step, "published_tokens_per_device_s": None, "error": None, "within_band": None}
    cost = CostModel(get_model(model), get_hardware(hardware))
    step_ops = cost.step_breakdown([(prompt_len, 0)] * (tokens_per_device // prompt_len), tokens_per_device * devices,
                                   uniform_shares(cost.model, devices), devices, True, devices)
    out = {"label": "SIMULATED", "model": str(model), "hardware": str(hardware), "devices": devices,
           "prompt_len": prompt_len, "tokens_per_device_per_step": tokens_per_device, "skew": SKEW,
           "step_s": mine["step_s"], "simulated_tokens_per_device_s": mine["simulated_tokens_per_device_s"],
           "published_tokens_per_device_s": mine["published_tokens_per_device_s"], "error": mine["error"],
           "error_band": ERROR_BAND, "within_band": mine["within_band"], "points": points,
           "tbo_gain": gain, "tbo_gain_band": TBO_GAIN_BAND,
           "tbo_gain_within_band": TBO_GAIN_BAND[0] <= gain <= TBO_GAIN_BAND[1], "tbo_gain_default_skew": gain_skew,
           "prompt_series": series,
           "skew_check_trtllm": {"published": TRTLLM_EPLB, "simulated": trtllm_check(SKEW, model, seed)},
           "sglang_fit_alternative": alternative, "unoverlapped_step_breakdown_s": step_ops}
    if verbose:
        _print(out, model, devices, redundant_experts, tokens_per_device, hardware)
    return out


def _print(out: dict, model, devices: int, redundant: int, tokens_per_device: int, hardware) -> None:
    print(f"[SIMULATED] calibration: {model}, sync DP{devices} + EP{devices} with {redundant} redundant experts "
          f"(EPLB), {out['prompt_len']}-token prompts, {tokens_per_device} tokens per device per step, two-batch "
          f"overlap, drawn per-batch expert loads (skew 0 = balanced routing; SGLang default skew {SKEW}, from "
          f"TensorRT-LLM's EPLB table)")
    for p in out["points"]:
        print(f"[SIMULATED]   {p['name']:<36} skew {p['skew']:<4} simulated {p['simulated_tokens_per_device_s']:6.0f} "
              f"vs published {p['published_tokens_per_device_s']:6.0f} tok/s/device: error {p['error']:+.1%} "
              f"({'inside' if p['within_band'] else 'OUTSIDE'} +-{ERROR_BAND:.0%}; {p['source']})")
    gain = out["tbo_gain"]
    lo, hi = TBO_GAIN_BAND
    g2 = out["tbo_gain_default_skew"]
    print(f"[SIMULATED]   two-batch overlap gain on 32 x h100, balanced routing: {gain:+.1%} (SGLang reports "
          f"+{lo:.0%}..+{hi:.0%}: {'inside' if out['tbo_gain_within_band'] else 'OUTSIDE'}); with the default "
          f"skew {SKEW}: {g2:+.1%} ({'inside' if lo <= g2 <= hi else 'OUTSIDE'}; the blog does not say which "
          f"expert distribution its ablation used)")
    print("[SIMULATED]   SGLang prompt-length series (shape check, per GPU; ratio to 4K): " + ", ".join(
        f"{s['prompt_len'] // 1024}K simulated {s['simulated_tokens_per_device_s']:.0f} ({s['simulated_ratio_to_4k']:.3f}) "
        f"vs published {s['published_tokens_per_device_s']:.0f} ({s['published_ratio_to_4k']:.3f})"
        for s in out["prompt_series"]))
    t, a = out["skew_check_trtllm"], out["sglang_fit_alternative"]
    print(f"[SIMULATED]   skew check, TensorRT-LLM EPLB table (EP32, 9 slots, 1,024 rows/rank): busiest-rank "
          f"imbalance {t['simulated']['imbalance']:.3f} vs published {TRTLLM_EPLB['imbalance']}, rank std "
          f"{t['simulated']['std_rows']:.1f} vs {TRTLLM_EPLB['std_rows']} rows")
    print(f"[SIMULATED]   rejected alternative, skew {a['skew']} fitted to SGLang default / perfect EPLB: SGLang default "
          f"{a['sglang_default_tokens_per_device_s']:.0f} ({a['sglang_default_error']:+.1%}), but TBO gain "
          f"{a['tbo_gain']:+.1%} and TensorRT-LLM imbalance {a['trtllm']['imbalance']:.3f} (published "
          f"{TRTLLM_EPLB['imbalance']})")
    print("[SIMULATED]   rejected alternative, the same point from per-request popularity: 1K / 2K / 4K ratios "
          + " / ".join(f"{x:.3f}" for x in a["per_request_series_ratio_to_4k"])
          + " vs published " + " / ".join(f"{s['published_ratio_to_4k']:.3f}" for s in out["prompt_series"]))
    print(f"[SIMULATED] {hardware} per-step op seconds if nothing overlapped: "
          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(out["unoverlapped_step_breakdown_s"].items(),
                                                         key=lambda kv: -kv[1])))


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
