"""SIMULATED: the wide group's share of a length-aware fleet, both engines, hand-picked (not a tune).

    ASAP_TRACE_DIR=../shared/traces python benchmarks/fleet_shares.py [--engine sync|async] [--jobs 2]
    ASAP_TRACE_DIR=../shared/traces python benchmarks/fleet_shares.py --buckets-at 4.81

The configurations of docs/RESULTS.md's 64-die table (the Mooncake conversation trace, 3,000 requests,
SLO 2 s + 1 ms/token): each gets a fine rate search (2% tolerance) under both criteria (>= 90% of
requests; >= 90% in every prompt-length bucket), through benchmarks/rate_search.py. With --buckets-at RATE,
instead: the attainment per prompt-length bucket of the headline's sync fleet and three async shares at
that rate.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

FLEET = dict(token_budget=32768, wide_token_budget=32768, router="round-robin")
SYNC = [dict(engine="sync", attention_tp=8, wide_replicas=1, wide_tp=16, instances=2, **FLEET),   # the headline's
        dict(engine="sync", attention_tp=8, wide_replicas=1, wide_tp=16, **FLEET),                # 1/4 wide
        dict(engine="sync", attention_tp=8, wide_replicas=3, wide_tp=16, **FLEET),                # 3/4 wide
        dict(engine="sync", attention_tp=8, wide_replicas=2, wide_tp=16, **FLEET),                # half, one instance
        dict(engine="sync", attention_tp=4, wide_replicas=2, wide_tp=16, **FLEET),
        dict(engine="sync", attention_tp=8, wide_replicas=1, wide_tp=16, instances=2, wide_from_tokens=16384, **FLEET)]
COLOC = dict(engine="async", colocated=True, token_budget=8192, microbatches=2, window_s=0.002, wide_token_budget=32768)
ASYNC = [dict(COLOC, wide_tp=4, wide_replicas=8),         # half wide: the headline's
         dict(COLOC, wide_tp=4, wide_replicas=4),         # 1/4
         dict(COLOC, wide_tp=4, wide_replicas=10),        # 5/8
         dict(COLOC, wide_tp=4, wide_replicas=12),        # 3/4
         dict(COLOC, wide_tp=8, wide_replicas=4),         # half, TP8
         dict(COLOC, wide_tp=4, wide_replicas=12, wide_from_tokens=16384),
         dict(COLOC, wide_tp=4, wide_replicas=8, wide_from_tokens=16384)]
DEVICES, NUM_REQUESTS = 64, 3000


def buckets_at(rate: float) -> None:
    from asap.measure.buckets import format_buckets
    from asap.studies.skeptic import buckets_at as at
    from asap.studies.config import EngineConfig
    from asap.workload.presets import workload_requests
    from asap.workload.slo import parse_slo
    reqs = parse_slo("2s+1ms/tok").apply(workload_requests("conversation", NUM_REQUESTS))
    for kw in [SYNC[0], ASYNC[0], ASYNC[1], ASYNC[3]]:
        c, t = EngineConfig(**kw), time.time()
        b = at(reqs, c, DEVICES, "deepseek-v3", "cloudmatrix384", rate)
        print(f"[SIMULATED] {rate} req/s, {c.describe(DEVICES)}: {b['overall']:.1%} within SLO; "
              f"{format_buckets(b['buckets'])} ({time.time() - t:.0f} s)", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["sync", "async", "both"], default="both")
    p.add_argument("--jobs", type=int, default=1, help="run the two engines' lists side by side (2)")
    p.add_argument("--buckets-at", type=float, default=None, metavar="RATE")
    a = p.parse_args(argv)
    if a.buckets_at is not None:
        buckets_at(a.buckets_at)
        return 0
    search = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rate_search.py"),
              "--workload", "conversation", "--devices", str(DEVICES), "--num-requests", str(NUM_REQUESTS),
              "--lo", "4", "--criterion", "both"]
    lists = {"sync": SYNC, "async": ASYNC}
    engines = ["sync", "async"] if a.engine == "both" else [a.engine]
    cmds = [search + [x for kw in lists[e] for x in ("--config", json.dumps(kw))] for e in engines]
    if a.jobs > 1:
        procs = [subprocess.Popen(c) for c in cmds]
        return max(p.wait() for p in procs)
    return max(subprocess.run(c).returncode for c in cmds)


if __name__ == "__main__":
    sys.exit(main())
