"""GPU check for one H200 (or any one CUDA device), in at most ~7 minutes, always ending in a VERDICT line
and a JSON file. Runs uninstalled, on the machine's own torch:

    PYTHONPATH=. python benchmarks/gpu_check.py [--json gpu_check.json]
    PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --quick     # dry run of this script's logic

Every check runs as its own phase in a child process (a fresh process group) under a per-phase timeout
(<= 60 s), inside a hard overall deadline (420 s): a hung phase is killed and recorded as failed, and
the deadline writes the JSON and the verdict whatever is still running.

Phases:
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


def run_phase(spec: dict) -> dict:
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
    elif "rows" in res:
        print(f"{ok} {res['phase']}: {res['preset']} layer, bf16 matmul peak {res['matmul_peak_tflops']} TFLOP/s; "
              f"{res['seconds']} s", flush=True)
        for r in res["rows"]:
            print("      " + ", ".join(f"{k} {v}" for k, v in r.items()), flush=True)
    else:
        print(f"{ok} {res['phase']}: {res.get('error')}; {res.get('device_check', '')} {res.get('seconds', 0)} s",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of this script's logic on a machine without a GPU")
    ap.add_argument("--expect-device", default=None, help="where every worker must have run (default: --device)")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--tokens", nargs="+", type=int, default=None, help="layer phase T (default 1024 4096; CPU 64)")
    ap.add_argument("--skip-layer", action="store_true")
    ap.add_argument("--quick", action="store_true", help="one model, dtype and engine (CI's dry run)")
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
    specs = [dict(kind="exact", model=m, dtype=d, engine=e, device=args.device)
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
