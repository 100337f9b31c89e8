"""Write a short-prompt trace in the Azure LLM-inference CSV format, for `asap sim headline --workloads PATH`.

A stand-in for the held-out short-prompt traces ASAP is checked on (Azure's code and conversation traces
have mean prompts of about 2K and 1K tokens; they are not shipped and cannot be fetched here). Prompt
lengths are log-normal (default mean 2,048, sigma 1.0, cut at 32K), arrivals at 1 req/s (the headline
rescales arrivals to each rate it tries): Poisson, or burstier with --cv > 1 (gamma inter-arrival times with
that coefficient of variation; production traces such as Azure's are bursty). Seeded. It is GENERATED
data: say so where it is used.

    python benchmarks/short_trace.py out/short2k.csv --mean 2048 --num-requests 4000 [--cv 3]
"""
from __future__ import annotations

import argparse
import math
import random
from datetime import datetime, timedelta
from pathlib import Path


def write(path: Path, num_requests: int, mean: float, sigma: float, cap: int, seed: int, cv: float = 1.0) -> None:
    rng = random.Random(seed)
    mu = math.log(mean) - sigma * sigma / 2           # a log-normal with this mean
    t = datetime(2026, 1, 1)                          # naive: the Azure reader takes it as UTC
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for _ in range(num_requests):
        t += timedelta(seconds=rng.gammavariate(1 / cv ** 2, cv ** 2))    # mean 1 s; cv 1: exponential
        tokens = min(cap, max(16, round(rng.lognormvariate(mu, sigma))))
        rows.append(f"{t.isoformat(timespec='microseconds')},{tokens},{rng.randint(16, 512)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--num-requests", type=int, default=4000)
    p.add_argument("--mean", type=float, default=2048.0, help="mean prompt tokens")
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    p.add_argument("--cap", type=int, default=32768, help="longest prompt")
    p.add_argument("--cv", type=float, default=1.0, help="inter-arrival coefficient of variation (1: Poisson)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.num_requests < 2 or a.mean < 16 or a.sigma < 0 or a.cap < 16 or not 0.1 <= a.cv <= 10:
        p.error("need --num-requests >= 2, --mean >= 16, --sigma >= 0, --cap >= 16, 0.1 <= --cv <= 10")
    write(a.out, a.num_requests, a.mean, a.sigma, a.cap, a.seed, a.cv)
    print(f"wrote {a.out}: {a.num_requests} requests, GENERATED log-normal prompts (mean {a.mean:g}, sigma {a.sigma:g}), "
          f"{'Poisson arrivals' if a.cv == 1 else f'gamma arrivals (cv {a.cv:g})'}")


if __name__ == "__main__":
    main()
