"""Prefill tokens/s of asap against transformers, same weights, same prompt, one run.

    python benchmarks/model_speed.py [--preset small-deepseek-v3] [--tokens 2048] [--repeats 3]

The two are timed alternately (asap, hf, asap, hf, ...) and the median of each
is reported, so load from other processes hits both alike. Also prints the
achieved GFLOP/s next to this machine's measured fp32 matmul peak.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t) / 1e9


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small-deepseek-v3")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    import transformers

    import asap
    from asap.cost.flops import prefill_flops
    from asap.model.materialize import resolve_model

    path = resolve_model(args.preset)
    prompt = torch.randint(0, 1000, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    llm = asap.LLM(str(path), engine="reference")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm.prefill([prompt[:32]])
    times = {"asap": [], "transformers": []}
    with torch.inference_mode():
        hf(torch.tensor([prompt[:32]]))
        for _ in range(args.repeats):
            t = time.perf_counter()
            out = llm.prefill([prompt])[0]
            times["asap"].append(time.perf_counter() - t)
            t = time.perf_counter()
            ref = hf(torch.tensor([prompt])).logits[0, -1].float()
            times["transformers"].append(time.perf_counter() - t)
    llm.close()
    flops = prefill_flops(llm.cfg, args.tokens)
    peak = matmul_peak()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"preset {args.preset}, {args.tokens}-token prompt, fp32, {args.threads} threads, median of {args.repeats}")
    print(f"{'engine':<14}{'tokens/s':>10}{'GFLOP/s':>10}{'s':>8}")
    for k, v in med.items():
        print(f"{k:<14}{args.tokens / v:>10.1f}{flops / v / 1e9:>10.1f}{v:>8.2f}")
    print(f"speed-up asap/transformers: {med['transformers'] / med['asap']:.2f}x")
    print(f"measured fp32 matmul peak: {peak:.1f} GFLOP/s (2048^3 GEMM)")
    print(f"max |logits diff|: {(out.logits - ref).abs().max().item():.2e}, same argmax: "
          f"{out.first_token == int(ref.argmax())}")


if __name__ == "__main__":
    main()
