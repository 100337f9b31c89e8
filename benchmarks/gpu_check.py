"""GPU check: the async and sync engines on CUDA against the reference, a dispatch/combine
microbenchmark with CUDA tensors, and a one-line verdict. Meant to run in a few minutes on one
GPU machine:

    python benchmarks/gpu_check.py [--model tiny-deepseek-v3] [--tokens 1 128 1024 4096]

Exactness: every engine's first token equal to the CUDA reference's and its logits within 1e-4,
through the shm transport (with one GPU several workers share cuda:0) and, with >= 2 GPUs, through
NCCL (NCCL cannot send between two ranks on one GPU, so with one GPU it is skipped, and the verdict
says so). The reference on CUDA is also compared with the reference on the CPU (reported, with a
looser bound: other kernels, other rounding). Microbenchmark: benchmarks/comm_speed.py's
one-way dispatch/combine timing with the activations on the GPU: shm (device -> host ring -> device)
and NCCL (cuda:0 -> cuda:1) where there are two GPUs. Exit code 0 when every check passed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # comm_speed sits beside this file

TOL, CPU_TOL = 1e-4, 1e-3


def _prompts(n_max: int = 600):
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 17, n_max, 250, 3)]


def _compare(name: str, got, want, tol: float) -> tuple[str, bool, str]:
    worst, same = 0.0, True
    for o, r in zip(got, want):
        same &= o.first_token == r.first_token
        worst = max(worst, (o.logits.float().cpu() - r.logits.float().cpu()).abs().max().item())
    ok = same and worst < tol and len(got) == len(want)
    return name, ok, f"max |dlogits| {worst:.2e} (bound {tol:g}), first tokens {'equal' if same else 'DIFFER'}"


def exactness(model: str, gpus: int, device: str = "cuda") -> list[tuple[str, bool, str]]:
    import asap
    prompts, out = _prompts(), []
    with asap.LLM(model, engine="reference", device=device) as ref:
        want = ref.prefill(prompts)
    if device != "cpu":
        with asap.LLM(model, engine="reference") as ref_cpu:
            out.append(_compare(f"reference {device} vs cpu", want, ref_cpu.prefill(prompts), CPU_TOL))
    cases = [("async", "shm", dict(attention_workers=1, expert_workers=1)),
             ("async", "shm", dict(attention_workers=2, expert_workers=2, microbatches=3)),
             ("sync", "shm", dict(devices=2)),
             ("sync", "shm", dict(devices=2, microbatches=1))]
    if gpus >= 2:
        cases += [("async", "nccl", dict(attention_workers=1, expert_workers=1)), ("sync", "nccl", dict(devices=2))]
    if gpus >= 4:
        cases += [("async", "nccl", dict(attention_workers=2, expert_workers=2))]
    for engine, transport, kw in cases:
        name = f"{engine} {transport} " + " ".join(f"{k}={v}" for k, v in kw.items())
        t0 = time.monotonic()
        try:
            with asap.LLM(model, engine=engine, device=device, transport=transport, token_budget=256, **kw) as llm:
                futures = [llm.submit(p) for p in prompts]
                got = [f.result(timeout=120) for f in futures]
            res = _compare(name, got, want, TOL)
        except Exception as e:  # noqa: BLE001 - a failed case is a finding, the others still run
            res = (name, False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        out.append((res[0], res[1], f"{res[2]}; {time.monotonic() - t0:.1f} s"))
    return out


def microbenchmark(tokens: list[int], hidden: int, gpus: int, device: str = "cuda") -> list[str]:
    import comm_speed
    lines = []
    first = "cpu" if device == "cpu" else "cuda:0"
    for transport, devices in [("shm", (first, first))] + ([("nccl", ("cuda:0", "cuda:1"))] if gpus >= 2 else []):
        rows = comm_speed.run(transport, tokens, hidden, devices)
        lines.append(f"{transport} ({devices[0]} -> {devices[1]}), one way, median:")
        for r in rows:
            d, c = r["dispatch_s"], r["combine_s"]
            lines.append(f"  T={r['T']:>5}  dispatch {d * 1e6:9.0f} us ({r['dispatch_bytes'] / d / 1e9:6.1f} GB/s)"
                         f"  combine {c * 1e6:9.0f} us ({r['combine_bytes'] / c / 1e9:6.1f} GB/s)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-deepseek-v3", help="preset or model directory")
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 128, 1024, 4096])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--skip-bench", action="store_true", help="exactness only")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of this script's own logic on a machine without a GPU")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("VERDICT: NOT RUN - no CUDA device is visible; nothing was checked")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    print(f"{gpus} GPU(s): {torch.cuda.get_device_name(0) if gpus else 'none (dry run on the CPU)'}; "
          f"torch {torch.__version__}")
    results = exactness(args.model, gpus, args.device)
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not args.skip_bench:
        for line in microbenchmark(args.tokens, args.hidden, gpus, args.device):
            print(line)
    failed = [name for name, ok, _ in results if not ok]
    nccl = "NCCL checked" if gpus >= 2 else "NCCL not checked (needs >= 2 GPUs: one GPU per rank)"
    if args.device == "cpu":
        nccl += "; DRY RUN ON THE CPU, not a GPU result"
    if failed:
        print(f"VERDICT: FAIL - {len(failed)}/{len(results)} checks failed ({', '.join(failed)}); {nccl}")
        return 1
    print(f"VERDICT: PASS - {len(results)}/{len(results)} exactness checks on {args.device} within {TOL:g}; {nccl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
