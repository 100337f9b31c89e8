"""GPU check for one H200 (or any one CUDA device), in at most ~7 minutes, always ending in a VERDICT line
and a JSON file. Runs uninstalled, on the machine's own torch:

    PYTHONPATH=. python benchmarks/gpu_check.py [--json gpu_check.json]
    PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --quick     # dry run of this script's logic

Every check runs as its own phase in a child process (a fresh process group) under a per-phase timeout
(<= 60 s), inside a hard overall deadline (420 s): a hung phase is killed and recorded as failed, and
the deadline writes the JSON and the verdict whatever is still running.

Phases (the two short kernel checks first, so a deadline hit in the long phases cannot skip them):
  fp8_linear  asap.model.fp8.fp8_linear on DeepSeek-V3-shaped block-FP8 weights (128x128 blocks: q_b_proj,
         o_proj, kv_b_proj, the shared expert's gate_up) at T = 1K and 4K bf16 tokens, against F.linear of
         the dequantised weight: which path ran (the block-scaled FP8 GEMM, or the dequantise-per-linear
         fallback and fp8.SCALED_MM_FAILED's reason), relative max error and cosine, median times of both
         and of the fallback. On a CUDA sm90+ device it fails unless the block-scaled GEMM ran and stayed
         within the bounds (FP8_COSINE_MIN, FP8_REL_MAX_ERR); elsewhere (the CPU dry run: small shapes) the
         fallback must equal the dequantised linear exactly.
  attention_timer  asap.workers.timing.AttentionTimer: on CUDA, steps of matmul "attention ops" timed
         with its events, counting every host sync inside start()/stop() (torch.cuda.set_sync_debug_mode
         and counted synchronize calls): none is allowed but the bounded MAX_OPEN wait, which is forced and
         checked; the durations it returns (plus what is left unread after a final synchronize) must be
         within 20% of event-timed ground truth. On the CPU dry run: the monotonic-clock durations.
  exact  <model> <dtype> <engine>: tiny DeepSeek-V3 (MLA) and tiny Qwen3-MoE (GQA), float32 and bfloat16,
         through async 1+1, async 2+2 and sync with 2 ranks (shm transport; one GPU cannot host two NCCL
         ranks), against the reference engine on the same device: first tokens, final logits, every
         layer's KV and the prompt logprobs. Every worker writes where its weights are and its peak device
         memory (ASAP_WORKER_REPORT, asap.workers.compute); the phase fails if any worker ran elsewhere
         than the device asked for, or none reported.
  layer  one DeepSeek-V3-shaped MoE layer (full dims, bf16, 1/8 of the routed experts as under EP8) at
         T = 1K and 4K tokens: attention stage and expert stage times against the measured bf16 matmul peak,
         the expert stage with the shard kept in FP8 (and the per-layer dequantisation alone),
         forced-flash SDPA on MLA's shapes, torch._grouped_mm against the per-expert loop, and the host
         syncs of one layer step counted by torch.cuda.set_sync_debug_mode (on the CPU dry run: tiny dims,
         no sync count). Informational, except that a failing op fails the phase.
asap.comm.streams (host<->device copies on a comm stream) has no phase of its own: the exact phases'
shm transport on CUDA runs through it (asap.comm.shm, asap.comm.primitives, asap.workers.compute).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

DEADLINE_S, PHASE_S = 420.0, 60.0
MODELS = ("tiny-deepseek-v3", "tiny-qwen3-moe")
DTYPES = ("float32", "bfloat16")
ENGINES = {"async-1+1": ("async", dict(attention_workers=1, expert_workers=1)),
           "async-2+2": ("async", dict(attention_workers=2, expert_workers=2, microbatches=2)),
           "sync-2": ("sync", dict(devices=2))}
# Engine vs reference on one device. float32: the exactness tests' bounds. bfloat16: the engines batch
# tokens differently from the reference (other GEMM shapes, other rounding), so bounds are bf16-sized.
TOL = {"float32": dict(logits=1e-4, kv=1e-5, logprobs=1e-4), "bfloat16": dict(logits=0.05, kv=0.1, logprobs=0.05)}
LOGPROBS_K = 2


# ---- phases (each in its own process) ------------------------------------------------------------

def _prompts():
    import torch
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 17, 300, 64, 3)]


def phase_exact(model: str, dtype: str, engine: str, device: str) -> dict:
    import torch
    import asap
    prompts, tol = _prompts(), TOL[dtype]
    t0 = time.monotonic()
    with asap.LLM(model, engine="reference", dtype=dtype, device=device) as ref:
        want = [f.result(timeout=PHASE_S) for f in [ref.submit(p, prompt_logprobs=LOGPROBS_K) for p in prompts]]
    kind, kw = ENGINES[engine]
    t1 = time.monotonic()
    with asap.LLM(model, engine=kind, dtype=dtype, device=device, transport="shm", token_budget=128, **kw) as llm:
        futures = [llm.submit(p, prompt_logprobs=LOGPROBS_K) for p in prompts]
        got = [f.result(timeout=PHASE_S) for f in futures]
    worst = dict(logits=0.0, kv=0.0, logprobs=0.0)
    tokens_equal = near_ties = 0
    for o, r in zip(got, want):
        d = (o.logits.float() - r.logits.float()).abs().max().item()
        worst["logits"] = max(worst["logits"], d)
        if o.first_token == r.first_token:
            tokens_equal += 1
        else:     # a different argmax is acceptable only where the reference's top two are within the bound
            top2 = r.logits.float().topk(2).values
            near_ties += int((top2[0] - top2[1]).item() <= 2 * tol["logits"])
        for a, b in zip(o.kv, r.kv):
            for name in b:
                worst["kv"] = max(worst["kv"], (a[name].float() - b[name].float()).abs().max().item())
        a, b = o.prompt_logprobs.token_logprobs, r.prompt_logprobs.token_logprobs
        if a.shape != b.shape:
            worst["logprobs"] = float("inf")
        elif b.numel():
            top = (o.prompt_logprobs.top_logprobs - r.prompt_logprobs.top_logprobs).abs().max().item()
            worst["logprobs"] = max(worst["logprobs"], (a - b).abs().max().item(), top)
    ok = all(worst[k] <= tol[k] for k in worst) and tokens_equal + near_ties == len(prompts)
    return {"ok": ok, "worst": worst, "bounds": tol, "first_tokens_equal": tokens_equal,
            "first_tokens_near_ties": near_ties, "prompts": len(prompts),
            "reference_s": round(t1 - t0, 2), "engine_s": round(time.monotonic() - t1, 2),
            "torch": torch.__version__}


def _time(fn, device, reps: int = 3) -> float:
    """Median seconds of fn() on the device (CUDA events on a GPU; wall clock on the CPU), after a warm-up."""
    import torch
    fn()
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return sorted(out)[len(out) // 2]


def phase_layer(device: str, tokens: list[int]) -> dict:
    import torch
    import torch.nn.functional as F
    import asap.model.moe as moe
    from asap.model.attention import _sdpa
    from asap.model.batch import Batch, Chunk, KVCache
    from asap.model.config import ModelConfig
    from asap.model.loader import _fuse_ffns
    from asap.model.presets import PRESETS
    from asap.model.stages import AttentionSide, attention_stage
    from asap.model.tensors import attention_side_tensors
    dev = torch.device(device)
    gpu = dev.type == "cuda"
    preset = "deepseek-v3" if gpu else "tiny-deepseek-v3"
    cfg = ModelConfig.from_hf(dict(PRESETS[preset], num_hidden_layers=1, first_k_dense_replace=0))
    dt = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    w = {}
    for name, shape in attention_side_tensors(cfg).items():
        if name.startswith("model.layers.0."):
            w[name[len("model.layers.0."):]] = (1.0 + 0.1 * torch.randn(shape, generator=g, device=dev)
                                                 if name.endswith("norm.weight") else
                                                 0.02 * torch.randn(shape, generator=g, device=dev)).to(dt)
    _fuse_ffns(w, dt)
    for k in ("mlp.gate.weight", "mlp.gate.e_score_correction_bias"):
        w[k] = w[k].float()
    side = AttentionSide(cfg, torch.zeros(1, cfg.hidden_size, dtype=dt, device=dev), [w],
                         torch.ones(cfg.hidden_size, dtype=dt, device=dev), torch.zeros(1, cfg.hidden_size, device=dev))
    El, I, D = cfg.num_experts // 8, cfg.moe_intermediate_size, cfg.hidden_size        # EP8: 1/8 of the experts
    shard = moe.ExpertShard.build(cfg.num_experts, {0: list(range(El))},
                                  {0: (0.02 * torch.randn(El, 2 * I, D, generator=g, device=dev)).to(dt)},
                                  {0: (0.02 * torch.randn(El, D, I, generator=g, device=dev)).to(dt)})
    # The same shard as block-FP8 (DeepSeek-V3's 128x128 blocks; the numbers do not matter for timing):
    # resident in FP8, dequantised one layer at a time when it runs (asap.model.moe.ExpertShard.weights).
    bo = bi = 128
    fp8 = moe.ExpertShard.build(
        cfg.num_experts, {0: list(range(El))},
        {0: shard.gate_up[0].to(torch.float8_e4m3fn)}, {0: shard.down[0].to(torch.float8_e4m3fn)},
        {0: (torch.rand(El, 2 * -(-I // bo), -(-D // bi), generator=g, device=dev),
             torch.rand(El, -(-D // bo), -(-I // bi), generator=g, device=dev))}, (bo, bi), dt)
    out: dict = {"preset": preset, "dtype": "bfloat16", "experts_held": El,
                 "expert_bytes_bf16": shard.nbytes(), "expert_bytes_fp8": fp8.nbytes()}
    n = 8192 if gpu else 512
    a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
    peak = 2 * n ** 3 / _time(lambda: a @ b, dev)
    out["matmul_peak_tflops"] = round(peak / 1e12, 2)
    for T in tokens:
        batch = Batch.build([Chunk(0, 0, T)], dev)
        kv = KVCache(cfg, dt, dev)
        kv.allocate(0, T)
        h = torch.randn(T, D, generator=g, device=dev).to(dt)
        s = attention_stage(side, 0, h, batch, kv)
        # Route half the pairs here (as if 4 of the 8 chosen experts were local), spread over the shard.
        ids = s.topk_ids % El + torch.where(torch.arange(cfg.top_k, device=dev) < cfg.top_k // 2, 0, El)
        pairs = int((ids < El).sum())
        t_att = _time(lambda: attention_stage(side, 0, h, batch, kv), dev)
        t_exp = _time(lambda: moe.expert_stage(shard, 0, s.x, ids, s.topk_weights), dev)
        t_fp8 = _time(lambda: moe.expert_stage(fp8, 0, s.x, ids, s.topk_weights), dev)
        t_deq = _time(lambda: fp8.weights(0), dev)
        flops = 6 * pairs * D * I                                   # gate_up (2 x 2I x D) + down (2 x I x D)
        saved, moe._GROUPED_MM = moe._GROUPED_MM, {(dev.type, dt): False}
        try:
            t_loop = _time(lambda: moe.expert_stage(shard, 0, s.x, ids, s.topk_weights), dev)
        finally:
            moe._GROUPED_MM = saved
        row = {"T": T, "local_pairs": pairs, "attention_stage_ms": round(t_att * 1e3, 3),
               "expert_stage_ms": round(t_exp * 1e3, 3), "expert_loop_ms": round(t_loop * 1e3, 3),
               "expert_stage_fp8_ms": round(t_fp8 * 1e3, 3), "fp8_dequantise_ms": round(t_deq * 1e3, 3),
               "expert_gemm_fraction_of_peak": round(flops / t_exp / peak, 3),
               "grouped_mm_used": bool(hasattr(torch, "_grouped_mm") and moe._GROUPED_MM.get((dev.type, dt), True))}
        H, dn, R, dv = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q = torch.randn(H, T, dn + R, device=dev, dtype=dt)
        k = torch.randn(H, T, dn + R, device=dev, dtype=dt)
        v = torch.randn(H, T, dv, device=dev, dtype=dt)
        row["sdpa_ms"] = round(_time(lambda: _sdpa(q, k, v, 0, 0.1), dev) * 1e3, 3)
        if gpu:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            vp = F.pad(v, (0, dn + R - dv))                 # MLA's V padded to 192: what the CPU path does
            for key, vv in (("sdpa_forced_flash_ms", v), ("sdpa_padded_v_forced_flash_ms", vp)):
                try:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        row[key] = round(_time(lambda: F.scaled_dot_product_attention(
                            q[None], k[None], vv[None], is_causal=True), dev) * 1e3, 3)
                except RuntimeError as e:
                    row[key] = f"refused: {str(e).splitlines()[0][:160]}"
            row["host_syncs_one_layer"] = _count_syncs(lambda: moe.combine(s.h, [moe.expert_stage(
                shard, 0, attention_stage(side, 0, h, batch, kv).x, ids, s.topk_weights)]))
            row["host_syncs_expert_stage"] = _count_syncs(lambda: moe.expert_stage(shard, 0, s.x, ids,
                                                                                   s.topk_weights))
        out.setdefault("rows", []).append(row)
        del kv
    if gpu:
        out["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
    syncs = [r.get("host_syncs_expert_stage", 0) for r in out["rows"]]
    out["ok"] = all(s <= 1 for s in syncs)
    return out


def _count_syncs(fn) -> int:
    import warnings
    import torch
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


# fp8_linear's bounds for the block-scaled GEMM against F.linear of the dequantised weight. They come from
# the FP8 rounding of the activations (1x128 groups, e4m3: 3 mantissa bits, so each element is off by up to
# 2^-4 of itself, ~2.6% rms): the K-long dot products average those independent errors, so an output is
# off by ~2.6% of its own typical size (emulated on a CPU: cosine 0.9996, max error / max |reference| 0.027
# at DeepSeek-V3's shapes). A wrong scale layout or a transposed operand is off by ~100%, far outside.
FP8_COSINE_MIN, FP8_REL_MAX_ERR = 0.999, 0.05
# DeepSeek-V3's block-FP8 linears (name -> [out, in]); the CPU dry run takes small stand-ins, one of them
# ending inside a block (448 = 3.5 x 128), which the fallback must handle too.
FP8_SHAPES = {"q_b_proj": (24576, 1536), "o_proj": (7168, 16384), "kv_b_proj": (32768, 512),
              "shared_experts.gate_up": (4096, 7168)}
FP8_SHAPES_CPU = {"q_b_proj": (768, 384), "o_proj": (448, 1024), "kv_b_proj": (1024, 128),
                  "shared_experts.gate_up": (256, 448)}
TIMER_TOLERANCE = 0.2       # attention_timer: summed durations within 20% of event-timed ground truth
# An op: 1-3 matmuls of this size (~1.5 ms each on an H200, so a few microseconds of host time between the
# timer's events and the ground truth's are noise). The MAX_OPEN case's sleep: ~1 s at an H200's ~2 GHz,
# longer than queueing MAX_OPEN ops takes the host, so they all queue behind it.
TIMER_MATMUL_N, TIMER_SLEEP_CYCLES = 8192, 2_000_000_000


def _no_gemm_reason(x, w) -> str:
    """Why fp8_linear would not run the block-scaled GEMM for x and w (asap.model.fp8._scaled_mm_applies)."""
    import torch
    import asap.model.fp8 as fp8
    if x.device.type not in fp8.SCALED_MM_ON:
        return f"{x.device.type} is not a device the block-scaled GEMM is tried on ({sorted(fp8.SCALED_MM_ON)})"
    if x.device in fp8.SCALED_MM_FAILED:
        return f"failed earlier on {x.device}: {fp8.SCALED_MM_FAILED[x.device]}"
    if fp8.block_scaled_mm_api() is None:
        return f"torch {torch.__version__} has no F.scaled_mm block-wise recipes (BlockWise1x128/128x128)"
    cap = fp8._capability(x.device)
    if cap < (9, 0):
        return f"compute capability {cap[0]}.{cap[1]} < 9.0"
    return f"shape/dtype/block not taken: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} block {w.block}"


def phase_fp8_linear(device: str, tokens: list[int]) -> dict:
    import warnings
    import torch
    import torch.nn.functional as F
    import asap.model.fp8 as fp8
    from asap.model.quant import quantize
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    gpu = dev.type == "cuda"
    cap = torch.cuda.get_device_capability(dev) if gpu else None
    need_gemm = gpu and cap >= (9, 0)       # where a fallback means the FP8 GEMM went untested: a FAIL
    dt, block = torch.bfloat16, (128, 128)
    g = torch.Generator(device=dev).manual_seed(0)
    out: dict = {"torch": torch.__version__, "capability": f"{cap[0]}.{cap[1]}" if cap else None,
                 "gemm_required": need_gemm, "api": fp8.block_scaled_mm_api() is not None,
                 "bounds": dict(cosine_min=FP8_COSINE_MIN, rel_max_err=FP8_REL_MAX_ERR) if need_gemm else
                 "fallback: equal to F.linear of the dequantised weight", "rows": []}
    t0 = time.monotonic()
    weights = {}
    for name, (n, k) in (FP8_SHAPES if gpu else FP8_SHAPES_CPU).items():
        raw = (0.02 * torch.randn(n, k, generator=g, device=dev)).to(dt).cpu()
        q, scale = quantize(raw, block)              # DeepSeek's conversion (asap.model.quant; a CPU function)
        weights[name] = fp8.BlockFp8Weight(q.to(dev), scale.to(dev), block)
    out["quantise_s"] = round(time.monotonic() - t0, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for T in tokens:
            for name, w in weights.items():
                n, k = w.shape
                x = torch.randn(T, k, generator=g, device=dev).to(dt)
                wd = w.dequantize(dt)
                tries_gemm = fp8._scaled_mm_applies(x, w)
                why = None if tries_gemm else _no_gemm_reason(x, w)
                got = fp8.fp8_linear(x, w)
                ran_gemm = tries_gemm and x.device not in fp8.SCALED_MM_FAILED
                if tries_gemm and not ran_gemm:
                    why = f"SCALED_MM_FAILED: {fp8.SCALED_MM_FAILED[x.device]}"
                ref = F.linear(x, wd)
                d = (got.float() - ref.float()).abs().max().item()
                rel = d / max(ref.float().abs().max().item(), 1e-30)
                cos = F.cosine_similarity(got.double().flatten(), ref.double().flatten(), dim=0).item()
                row = {"weight": name, "shape": [n, k], "T": T,
                       "path": "block-scaled FP8 GEMM" if ran_gemm else "fallback (dequantise per linear)",
                       "rel_max_err": float(f"{rel:.3g}"), "cosine": round(cos, 6)}
                if why:
                    row["why_fallback"] = why
                if ran_gemm:
                    # Informational: against the GEMM's own numbers emulated in float32 (activations quantised
                    # per 1x128 exactly as the CUDA branch does), so only accumulation and output rounding differ.
                    qa, sa = fp8.quantize_activations_1x128(x)
                    emu = F.linear((qa.float().view(T, -1, 128) * sa[..., None]).view(T, k),
                                   w.dequantize(torch.float32))
                    e = (got.float() - emu).abs().max().item() / max(emu.abs().max().item(), 1e-30)
                    row["rel_max_err_vs_emulated"] = float(f"{e:.3g}")
                    del qa, sa, emu
                    row["ok"] = cos > FP8_COSINE_MIN and rel < FP8_REL_MAX_ERR
                else:
                    row["exact"] = bool(torch.equal(got, ref))
                    row["ok"] = row["exact"] and not need_gemm
                row["fp8_linear_ms"] = round(_time(lambda: fp8.fp8_linear(x, w), dev, 5) * 1e3, 3)
                row["bf16_linear_ms"] = round(_time(lambda: F.linear(x, wd), dev, 5) * 1e3, 3)
                row["dequantise_then_linear_ms"] = round(_time(lambda: F.linear(x, w.dequantize(dt)), dev, 5) * 1e3, 3)
                out["rows"].append(row)
                del x, wd, got, ref
    out["scaled_mm_failed"] = {str(k): v for k, v in fp8.SCALED_MM_FAILED.items()}
    out["warnings"] = sorted({str(w.message)[:300] for w in caught})
    paths = sorted({r["path"] for r in out["rows"]})
    out["path"] = " + ".join(paths)
    whys = sorted({r["why_fallback"] for r in out["rows"] if "why_fallback" in r})
    if whys:
        out["why_fallback"] = whys
    out["ok"] = bool(out["rows"]) and all(r["ok"] for r in out["rows"])
    if gpu:
        out["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
    return out


class _TimerCompute:
    """What AttentionTimer reads of a worker's compute (asap.workers.compute.RealCompute): its device and
    synchronize(), counted here (the CPU path calls it once per stop; the GPU path must not call it)."""

    def __init__(self, device):
        self.device, self.syncs = device, 0

    def synchronize(self) -> None:
        self.syncs += 1


def phase_attention_timer(device: str) -> dict:
    import torch
    from asap.workers import timing
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    compute = _TimerCompute(dev)
    timer = timing.AttentionTimer(compute)
    out: dict = {"on_gpu": timer.on_gpu, "max_open": timing.MAX_OPEN, "tolerance": TIMER_TOLERANCE}
    if dev.type != "cuda":
        # The CPU path: each stop returns the monotonic clock's time since its start, synchronize() once.
        a, ok, took = torch.randn(192, 192), not timer.on_gpu, []
        for i in range(5):
            tok = timer.start()
            ok &= tok <= time.monotonic()
            for _ in range(1 + i):
                a = torch.tanh(a @ a)
            time.sleep(0.002)
            before = time.monotonic()
            d = timer.stop(tok)
            after = time.monotonic()
            ok &= before - tok <= d <= after - tok
            took.append(d)
        out.update(ok=bool(ok and compute.syncs == 5), durations_ms=[round(d * 1e3, 3) for d in took],
                   compute_synchronize_calls=compute.syncs)
        return out
    return _attention_timer_cuda(dev, timer, compute, out)


def _attention_timer_cuda(dev, timer, compute, out: dict) -> dict:
    """Every host sync inside start()/stop() is counted: torch.cuda.set_sync_debug_mode's warnings, and the
    synchronize() of an event, a stream, the device and the compute (wrapped here, in this phase's own
    process). An event's wait is allowed only when the open list is over MAX_OPEN (the bounded case)."""
    import warnings
    import torch
    from asap.workers import timing
    real_sync = torch.cuda.synchronize
    state = {"inside": False, "timer": timer}
    seen = {"event_sync_open_lens": [], "stream_syncs": 0, "device_syncs": 0, "debug_mode_warnings": 0}

    def counted(cls_or_mod, attr, key):
        orig = getattr(cls_or_mod, attr)

        def wrapper(*a, **kw):
            if state["inside"]:
                if key == "event_sync_open_lens":
                    seen[key].append(len(state["timer"]._open))
                else:
                    seen[key] += 1
            return orig(*a, **kw)
        setattr(cls_or_mod, attr, wrapper)
    counted(torch.cuda.Event, "synchronize", "event_sync_open_lens")
    counted(torch.cuda.Stream, "synchronize", "stream_syncs")
    counted(torch.cuda, "synchronize", "device_syncs")

    def call(fn, *a):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state["inside"] = True
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return fn(*a)
            finally:
                torch.cuda.set_sync_debug_mode(0)
                state["inside"] = False
                seen["debug_mode_warnings"] += sum("synchroniz" in str(w.message).lower() for w in caught)

    def event():
        return torch.cuda.Event(enable_timing=True)

    # 1. Steps of "attention ops" (1-3 bf16 matmuls each), ground truth from events of our own just inside
    #    the timer's. Steps 0-1 only queue (nothing waits, as when the GPU is behind); in steps 2-3 the host
    #    waits for each op after its stop, as an MoE layer's dispatch does, so the next stop reads it.
    n, steps, ops = TIMER_MATMUL_N, 4, 8
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16) / n ** 0.5
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    (a @ b).sum()
    real_sync()
    gt, returned, read_in_loop, per_step = [], 0.0, 0, []
    for step in range(steps):
        got = 0.0
        for i in range(ops):
            tok = call(timer.start)
            e0, e1 = event(), event()
            e0.record()
            c = b
            for _ in range(1 + i % 3):
                c = a @ c
            e1.record()
            took = call(timer.stop, tok)
            gt.append((e0, e1))
            got += took
            read_in_loop += took > 0
            if step >= 2:
                real_sync()                     # outside start/stop: not counted
        per_step.append(round(got * 1e3, 3))
        returned += got
    real_sync()
    tail = timer._resolve()             # what the next step's first stop would have returned
    truth = sum(e0.elapsed_time(e1) for e0, e1 in gt) / 1e3
    main_syncs = dict(seen, event_sync_open_lens=len(seen["event_sync_open_lens"]))
    out["steps"] = {"ops": steps * ops, "returned_ms_per_step": per_step, "left_unread_ms": round(tail * 1e3, 3),
                    "timer_total_ms": round((returned + tail) * 1e3, 3), "ground_truth_ms": round(truth * 1e3, 3),
                    "rel_diff": round(abs(returned + tail - truth) / truth, 4),
                    "stops_that_read_a_finished_op": read_in_loop, "open_after_final_resolve": len(timer._open),
                    "host_syncs_in_start_stop": main_syncs}
    ok_steps = (abs(returned + tail - truth) <= TIMER_TOLERANCE * truth and not timer._open
                and read_in_loop > 0 and not any(main_syncs.values()))

    # 2. The bounded case: one op held up by a ~1 s GPU sleep, then MAX_OPEN + 8 empty ops queued behind it.
    #    A stop that leaves more than MAX_OPEN ops unread waits for the oldest (and only then): expect one or
    #    a few such waits, each with the list over MAX_OPEN, and every op still counted once.
    for k in seen:
        seen[k] = [] if k == "event_sync_open_lens" else 0
    bounded = timing.AttentionTimer(compute)
    state["timer"] = bounded
    tok = call(bounded.start)
    e0, e1 = event(), event()
    e0.record()
    torch.cuda._sleep(TIMER_SLEEP_CYCLES)
    e1.record()
    returned = call(bounded.stop, tok)
    extra = timing.MAX_OPEN + 8
    t = time.monotonic()
    for _ in range(extra):
        returned += call(bounded.stop, call(bounded.start))
    enqueue_s = time.monotonic() - t
    real_sync()
    tail = bounded._resolve()
    truth = e0.elapsed_time(e1) / 1e3
    lens = seen["event_sync_open_lens"]
    out["max_open_case"] = {"ops": extra + 1, "sleep_ms": round(truth * 1e3, 3),
                            "host_enqueue_ms": round(enqueue_s * 1e3, 1),
                            "timer_total_ms": round((returned + tail) * 1e3, 3),
                            "forced_waits": len(lens), "open_lens_at_waits": sorted(set(lens)),
                            "other_syncs": {k: v for k, v in seen.items() if k != "event_sync_open_lens"},
                            "exercised": bool(lens)}
    # cudaEventSynchronize may itself count as a sync for the debug mode: allowed as many as the forced waits.
    ok_bounded = (all(n_open > timing.MAX_OPEN for n_open in lens) and len(lens) <= 8 + 1
                  and seen["stream_syncs"] == seen["device_syncs"] == 0
                  and seen["debug_mode_warnings"] <= len(lens) and not bounded._open
                  and abs(returned + tail - truth) <= TIMER_TOLERANCE * truth)
    out["compute_synchronize_calls"] = compute.syncs
    out["ok"] = bool(ok_steps and ok_bounded and compute.syncs == 0)
    return out


def run_phase(spec: dict) -> dict:
    if spec["kind"] == "fp8_linear":
        return phase_fp8_linear(spec["device"], spec["tokens"])
    if spec["kind"] == "attention_timer":
        return phase_attention_timer(spec["device"])
    if spec["kind"] == "exact":
        return phase_exact(spec["model"], spec["dtype"], spec["engine"], spec["device"])
    return phase_layer(spec["device"], spec["tokens"])


# ---- the driver -----------------------------------------------------------------------------------

class Driver:
    def __init__(self, args):
        self.args, self.results, self.child = args, [], None
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.done = False

    def remaining(self) -> float:
        return self.args.deadline - (time.monotonic() - self.t0)

    def run(self, spec: dict) -> dict:
        name = " ".join(str(spec[k]) for k in ("kind", "model", "dtype", "engine") if k in spec)
        budget = min(self.args.phase_timeout, self.remaining() - 5)
        if budget < 5:
            res = {"phase": name, "ok": False, "error": "not run: the overall deadline is too close", "seconds": 0.0}
            self.results.append(res)
            return res
        reports = tempfile.mkdtemp(prefix="asap-gpu-check-")
        env = dict(os.environ, ASAP_WORKER_REPORT=reports)
        t = time.monotonic()
        with self.lock:
            self.child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--phase", json.dumps(spec)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                          start_new_session=True)
        try:
            stdout, stderr = self.child.communicate(timeout=budget)
            line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("RESULT ")), None)
            res = json.loads(line[7:]) if line else \
                {"ok": False, "error": f"exit {self.child.returncode}: " + " | ".join(stderr.strip().splitlines()[-3:])}
        except subprocess.TimeoutExpired:
            _kill(self.child)
            res = {"ok": False, "error": f"timed out after {budget:.0f} s (killed)"}
        res = dict(res, phase=name, seconds=round(time.monotonic() - t, 1))
        if spec["kind"] == "exact":
            res["workers"] = _reports(reports)
            want = self.args.expect_device
            wrong = [w for w in res["workers"] if not str(w.get("weights_on", "")).startswith(want)]
            if not res["workers"]:
                res["ok"], res["device_check"] = False, "no worker reported where it ran"
            elif wrong:
                res["ok"], res["device_check"] = False, f"{len(wrong)} worker(s) not on {want}: " + \
                    ", ".join(f"pid {w['pid']} on {w['weights_on']}" for w in wrong)
            else:
                res["device_check"] = f"all {len(res['workers'])} workers on {want}"
        with self.lock:
            self.child = None
            self.results.append(res)
        return res

    def finish(self, reason: str | None = None) -> int:
        """Write the JSON, print the verdict; -> exit code. Called once (the deadline may race the end)."""
        with self.lock:
            if self.done:
                return 0
            self.done = True
            if self.child is not None:
                _kill(self.child)
        failed = [r["phase"] for r in self.results if not r.get("ok")]
        dry = self.args.device == "cpu"
        verdict = "FAIL" if failed or reason else "PASS"
        what = f"{len(self.results) - len(failed)}/{len(self.results)} phases passed on {self.args.device}"
        if reason:
            what += f"; {reason}"
        if failed:
            what += f"; failed: {', '.join(failed)}"
        what += "; NCCL not checked (one GPU cannot host two NCCL ranks)"
        if dry:
            what += "; DRY RUN ON THE CPU, not a GPU result"
        summary = {"verdict": verdict, "summary": what, "device": self.args.device, "dry_run": dry,
                   "elapsed_s": round(time.monotonic() - self.t0, 1), "phases": self.results}
        try:
            import torch
            summary["torch"] = torch.__version__
            if torch.cuda.is_available():
                summary["gpu"] = torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001
            pass
        with open(self.args.json, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"VERDICT: {verdict} - {what} (JSON: {self.args.json})", flush=True)
        return 0 if verdict == "PASS" else 1


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)      # the phase and every worker it started
    except (ProcessLookupError, PermissionError):
        pass
    p.wait(10)


def _reports(folder: str) -> list[dict]:
    out = []
    for f in sorted(os.listdir(folder)):
        try:
            with open(os.path.join(folder, f)) as fh:
                out.append(json.load(fh))
        except (OSError, ValueError):
            pass
    return out


def _print(res: dict) -> None:
    ok = "ok  " if res.get("ok") else "FAIL"
    if "worst" in res:
        w = res["worst"]
        mem = [f"{x['peak_bytes'] / 2**20:.0f}" for x in res.get("workers", []) if x.get("peak_bytes") is not None]
        print(f"{ok} {res['phase']}: |dlogits| {w['logits']:.1e} |dKV| {w['kv']:.1e} |dlogprobs| {w['logprobs']:.1e}"
              f" (bounds {res['bounds']}); first tokens {res['first_tokens_equal']}/{res['prompts']} equal"
              f" (+{res['first_tokens_near_ties']} near ties); {res.get('device_check')}"
              + (f"; peak MiB per worker {', '.join(mem)}" if mem else "") + f"; {res['seconds']} s", flush=True)
    elif res["phase"] == "fp8_linear" and "rows" in res:
        print(f"{ok} {res['phase']}: path {res['path']}"
              + (f" (why: {'; '.join(res['why_fallback'])})" if res.get("why_fallback") else "")
              + f"; bounds {res['bounds']}; torch {res['torch']}, capability {res['capability']}; "
              f"{res['seconds']} s", flush=True)
        for r in res["rows"]:
            print("      " + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("path", "why_fallback")),
                  flush=True)
    elif res["phase"] == "attention_timer" and "on_gpu" in res:
        if "steps" in res:
            st, mo = res["steps"], res["max_open_case"]
            print(f"{ok} {res['phase']}: {st['ops']} ops, timer {st['timer_total_ms']} ms vs events "
                  f"{st['ground_truth_ms']} ms (rel diff {st['rel_diff']}, bound {res['tolerance']}), "
                  f"{st['stops_that_read_a_finished_op']} stops read a finished op, host syncs in start/stop "
                  f"{st['host_syncs_in_start_stop']}; MAX_OPEN case: {mo['forced_waits']} forced wait(s) at open "
                  f"{mo['open_lens_at_waits']}, other syncs {mo['other_syncs']}, timer {mo['timer_total_ms']} ms vs "
                  f"sleep {mo['sleep_ms']} ms; {res['seconds']} s", flush=True)
        else:
            print(f"{ok} {res['phase']}: CPU path (monotonic clock), durations ms {res.get('durations_ms')}, "
                  f"compute.synchronize() x{res.get('compute_synchronize_calls')}; {res['seconds']} s", flush=True)
    elif "rows" in res:
        print(f"{ok} {res['phase']}: {res['preset']} layer, bf16 matmul peak {res['matmul_peak_tflops']} TFLOP/s; "
              f"{res['seconds']} s", flush=True)
        for r in res["rows"]:
            print("      " + ", ".join(f"{k} {v}" for k, v in r.items()), flush=True)
    else:
        print(f"{ok} {res['phase']}: {res.get('error')}; {res.get('device_check', '')} {res.get('seconds', 0)} s",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=(
        "phases, in order: fp8_linear (block-FP8 GEMM vs dequantised linear), attention_timer (event timing "
        "without host syncs), exact <model> <dtype> <engine> (engines vs the reference), layer (one "
        "DeepSeek-V3 layer's times); each <= 60 s in its own process, all within the deadline. Details: "
        "this script's docstring."))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of this script's logic on a machine without a GPU")
    ap.add_argument("--expect-device", default=None, help="where every worker must have run (default: --device)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--tokens", nargs="+", type=int, default=None, help="layer phase T (default 1024 4096; CPU 64)")
    ap.add_argument("--skip-layer", action="store_true")
    ap.add_argument("--skip-fp8", action="store_true", help="skip the fp8_linear phase")
    ap.add_argument("--skip-timer", action="store_true", help="skip the attention_timer phase")
    ap.add_argument("--quick", action="store_true", help="one model, dtype and engine for the exact phases (CI's dry run)")
    ap.add_argument("--deadline", type=float, default=DEADLINE_S)
    ap.add_argument("--phase-timeout", type=float, default=PHASE_S)
    ap.add_argument("--json", default="gpu_check.json")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase:                                      # inside a phase's child process
        print("RESULT " + json.dumps(run_phase(json.loads(args.phase))), flush=True)
        return 0
    args.expect_device = args.expect_device or args.device
    args.phase_timeout = min(args.phase_timeout, PHASE_S)
    driver = Driver(args)
    late = f"hard deadline of {args.deadline:.0f} s hit"
    timer = threading.Timer(args.deadline, lambda: os._exit(driver.finish(late) or 3))
    timer.daemon = True
    timer.start()
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        driver.results.append({"phase": "setup", "ok": False, "error": "no CUDA device is visible"})
        return driver.finish("nothing was checked")
    print(f"device {args.device}: {torch.cuda.get_device_name(0) if args.device == 'cuda' else 'CPU (dry run)'}; "
          f"torch {torch.__version__}", flush=True)
    if args.quick:
        args.models, args.dtypes, args.engines = args.models[-1:], args.dtypes[:1], args.engines[:1]
    specs = []
    if not args.skip_fp8:           # the short kernel phases first: a deadline hit later cannot skip them
        specs.append(dict(kind="fp8_linear", device=args.device,
                          tokens=[1024, 4096] if args.device == "cuda" else [64]))
    if not args.skip_timer:
        specs.append(dict(kind="attention_timer", device=args.device))
    specs += [dict(kind="exact", model=m, dtype=d, engine=e, device=args.device)
             for m in args.models for d in args.dtypes for e in args.engines]
    if not args.skip_layer:
        tokens = args.tokens or ([1024, 4096] if args.device == "cuda" else [64])
        specs.append(dict(kind="layer", device=args.device, tokens=tokens))
    for spec in specs:
        _print(driver.run(spec))
    timer.cancel()
    return driver.finish()


if __name__ == "__main__":
    sys.exit(main())
