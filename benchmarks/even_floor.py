"""Where async's loss on even traffic comes from: alignment, per-batch load draws, or the link (SIMULATED).

On fixed-length prompts the tuned async engine trails the tuned sync one by 6-17% (docs/RESULTS.md). This
takes the three candidates apart, by running each engine's tuned configuration (32 dies, fixed 4K) with
the model's parts switched off one at a time, for BOTH engines alike:
- `expected`: expert loads at their expectation instead of drawn per batch (a small batch draws a
  busier worst expert than a large one; sync's batches are larger);
- `free links`: links 1000x faster with no latency, for both engines (the async link carries each
  message in turn; sync's all-to-all is one collective);
and two arrival patterns:
- a burst (every request at t = 0): every replica starts its first step at once and, the prompts being
  equal, stays in step; the makespan is the engines' throughput with alignment given for free;
- Poisson arrivals at --rate: replicas start when their requests arrive, so without a barrier they drift
  apart and an expert batch holds the micro-batches of fewer replicas.

    python benchmarks/even_floor.py                       # fixed 4K, 32 dies, burst of 1,280, Poisson at 32 req/s
    python benchmarks/even_floor.py --length 8192 --rate 13 --burst 640
"""
from __future__ import annotations

import argparse
import dataclasses

from asap.cost.hardware import get_hardware
from asap.measure.metrics import summarize
from asap.scheduler.request import Request
from asap.sim.run import run
from asap.studies.experiments import at_rate
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

LABEL = "SIMULATED"
ENGINES = {     # the 32-die fixed-4K winners of the full tune (docs/RESULTS.md), and the co-located layout
    "sync DP32 x TP1, 4K": dict(engine="sync", token_budget=4096),
    "async A=16 + E=16, 8K, k=2, fullest": dict(engine="async", attention_workers=16, token_budget=8192,
                                                selector="fullest"),
    "async co-located 32 x TP1, 16K, k=2, fullest": dict(engine="async", colocated=True, token_budget=16384,
                                                         selector="fullest"),
}


def free_links(hardware: str):
    hw = get_hardware(hardware)
    link = dataclasses.replace(hw.link, intra_bytes_per_s=hw.link.intra_bytes_per_s * 1e3,
                               inter_bytes_per_s=hw.link.inter_bytes_per_s * 1e3, latency_s=0.0)
    return dataclasses.replace(hw, link=link)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=4096, help="prompt tokens (every request)")
    p.add_argument("--burst", type=int, default=1280, help="requests of the burst")
    p.add_argument("--rate", type=float, default=32.0, help="Poisson rate (req/s), near sync's maximum")
    p.add_argument("--num-requests", type=int, default=3000, help="requests of the Poisson run")
    p.add_argument("--devices", type=int, default=32)
    p.add_argument("--hardware", default="cloudmatrix384")
    a = p.parse_args(argv)
    slo = parse_slo("2s+1ms/tok")
    burst = slo.apply([Request(i, a.length, 0.0) for i in range(a.burst)])
    poisson = at_rate(slo.apply([dataclasses.replace(r, num_tokens=a.length)
                                 for r in workload_requests("fixed-4k", a.num_requests)]), a.rate)
    variants = {"as modelled": dict(hardware=a.hardware),
                "expected loads": dict(hardware=a.hardware, expert_load="expected"),
                "expected loads, free links": dict(hardware=free_links(a.hardware), expert_load="expected")}
    print(f"[{LABEL}] deepseek-v3 on {a.devices} x {a.hardware} dies, {a.length}-token prompts, SLO 2 s + 1 ms/token")
    for vname, v in variants.items():
        print(f"[{LABEL}] {vname}:")
        base = None
        for name, cfg in ENGINES.items():
            b = run(burst, devices=a.devices, **cfg, **v)
            makespan = max(r.arrival + r.ttft for r in b.results)
            base = base or makespan
            q = run(poisson, devices=a.devices, **cfg, **v)
            s = summarize(q.results)
            batch = q.stats.get("mean_expert_batch_tokens")
            batches = f", mean expert batch {batch / 1e3:.1f}K tokens" if batch else ""
            print(f"[{LABEL}]   {name:<46} burst of {a.burst}: {makespan:7.2f} s ({base / makespan:.3f}x sync's "
                  f"throughput); Poisson {a.rate:g} req/s: {s['slo_attainment']:.1%} within SLO, P90 TTFT "
                  f"{s['ttft_p90_ms'] / 1e3:.2f} s{batches}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
