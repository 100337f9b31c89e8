"""SIMULATED: the prefix cache on and off, both engines, one fixed rate of the Mooncake conversation trace.

    python benchmarks/prefix_cache.py [--requests 1000] [--rate 1.5] [--devices 32]

DeepSeek-V3 on cloudmatrix384 dies. Each async attention replica and each sync DP group gets its own LRU
cache over the trace's 512-token block hashes, its capacity from the memory left after weights
(asap.sim.memory.prefix_cache_capacity); "unbounded" lifts the capacity to show what memory costs. The router is
the same as without a cache (not cache-aware). Uses the shipped sample unless $ASAP_TRACE_DIR names the full
traces. Prints the token hit rate and mean / P90 TTFT of each case, and async/sync mean TTFT with the cache
off and on.
"""
from __future__ import annotations

import argparse
import time

from asap.studies.experiments import at_rate, trace_requests
from asap.sim.run import run
from asap.workload.presets import trace_path

MODEL, HARDWARE = "deepseek-v3", "cloudmatrix384"
CASES = (("sync", dict(attention_tp=8, token_budget=4096), "sync DP x TP8, 4K chunk/group"),
         ("sync", dict(attention_tp=1, token_budget=16384), "sync DP x TP1, 16K chunk/group"),
         ("async", dict(attention_tp=1, token_budget=16384), "async TP1, 16K chunk, balanced A:E"))


def one(reqs, engine, kw, devices, cache):
    extra = dict(prefix_cache_blocks=10**9) if cache == "unbounded" else {}
    res = run(reqs, engine, MODEL, HARDWARE, devices, prefix_cache=bool(cache), **extra, **kw)
    ttft = sorted(r.ttft for r in res.results)
    return res, sum(ttft) / len(ttft), ttft[int(0.9 * (len(ttft) - 1))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--rate", type=float, default=1.5, help="req/s (the trace's arrivals rescaled to it)")
    p.add_argument("--devices", type=int, default=32)
    args = p.parse_args(argv)
    reqs = at_rate(trace_requests(trace_path("conversation"), args.requests), args.rate)
    print(f"[SIMULATED] {MODEL}, {args.devices} x {HARDWARE}, {len(reqs)} conversation requests at {args.rate} req/s")
    mean = {}
    for engine, kw, label in CASES:
        for cache in (False, True, "unbounded"):
            t0 = time.perf_counter()
            res, m, p90 = one(reqs, engine, kw, args.devices, cache)
            mean[label, cache] = m
            stats = res.stats.get("prefix_cache")
            what = "prefix cache: off" if not stats else (
                f"prefix cache: {'on' if cache is True else 'unbounded'}, hit rate {stats['token_hit_rate']:.1%} "
                f"of prompt tokens" + (f", {stats['capacity_blocks']} blocks/cache" if cache is True else ""))
            print(f"[SIMULATED] {label:<36} {what:<62} mean TTFT {m:8.2f} s, P90 {p90:8.2f} s "
                  f"({time.perf_counter() - t0:.0f} s wall)", flush=True)
    a_label = CASES[-1][2]
    for cache in (False, True, "unbounded"):
        for _, _, s_label in CASES[:-1]:
            name = {False: "off", True: "on", "unbounded": "unbounded"}[cache]
            print(f"[SIMULATED] cache {name:<9}: mean TTFT async / {s_label}: "
                  f"{mean[a_label, cache] / mean[s_label, cache]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
