"""SIMULATED: where the time goes for both engines, across workloads and cluster sizes (issue 24, point 3).

Runs `asap sim explain` (asap.studies.explain.explain) for each engine's best-known configuration on fixed
2K / 4K / 8K, log-normal and Mooncake conversation traffic, at 32 and 384 dies, each pair at sync's
SLO-compliant maximum (from the fine searches in docs/RESULTS.md), and prints one table row per run:
within SLO, P90 TTFT, busy / stall / idle of the attention side (mean over its units) and of the expert
side, the link, and the expert batch size. At 384 dies a configuration is the 32-die one replicated
(12 instances, the headline's scaling rule), so its first instance is explained at 1/12 of the traffic.

    ASAP_TRACE_DIR=../shared/traces python benchmarks/explain_matrix.py --jobs 2 [--only fixed-4k] [--devices 32]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from asap.studies.explain import _fractions, explain
from asap.studies.config import EngineConfig
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

SLO = "2s+1ms/tok"
# Per workload: sync's 32-die maximum (req/s), the requests simulated at 32 dies, and each engine's
# best-known 32-die configuration: the fixed rows from the fine searches at 4393148, conversation from the
# 32-die headline (9a4f8d8), log-normal from the fine searches of `benchmarks/rate_search.py --workload
# lognormal` (docs/RESULTS.md gives each command). At 384 dies a configuration is the 32-die one
# replicated 12 times at 12x the rate and requests (the headline's scaling rule), except where AT_384
# gives the 384-die headline row's own (conversation: sync's 384-die maximum, async's 64-die instances).
_FULLEST = dict(engine="async", token_budget=16384, microbatches=3, selector="fullest")
_SYNC_FLEET = dict(engine="sync", attention_tp=8, token_budget=32768, router="round-robin", wide_replicas=1,
                   wide_tp=16, wide_token_budget=32768)
_ASYNC_FLEET = dict(engine="async", token_budget=8192, colocated=True, wide_tp=4, wide_token_budget=32768,
                    window_s=0.002)
CASES = {
    "fixed-2k": (76.48, 6000, dict(engine="sync", token_budget=4096), dict(_FULLEST, attention_workers=16)),
    "fixed-4k": (34.50, 2500, dict(engine="sync", token_budget=4096), dict(_FULLEST, attention_workers=17)),
    "fixed-8k": (13.59, 2500, dict(engine="sync", token_budget=8192), dict(_FULLEST, attention_workers=19)),
    "lognormal": (11.75, 2500, _SYNC_FLEET,
                  dict(engine="async", token_budget=8192, colocated=True, window_s=0.002)),
    "conversation": (2.383, 750, _SYNC_FLEET, dict(_ASYNC_FLEET, wide_replicas=4)),
}
AT_384 = {"conversation": (31.98, 6000, dict(_SYNC_FLEET, instances=12),
                           dict(_ASYNC_FLEET, wide_replicas=8, instances=6))}
SCALE = 12          # 384 dies = 12 x the 32-die configuration


def cell(args) -> dict:
    workload, devices, engine, rate, n, fields = args
    cfg = EngineConfig(**fields)
    reqs = parse_slo(SLO).apply(workload_requests(workload, n))
    t = time.time()
    x = explain(reqs, cfg, devices, rate)
    return {"workload": workload, "devices": devices, "engine": engine, "rate": rate, "seconds": time.time() - t,
            "explain": x}


def jobs_for(workload: str, devices: int) -> list[tuple]:
    """The (workload, devices, engine, rate, requests, config) of both engines' runs."""
    if devices == 384 and workload in AT_384:
        rate, n, s, x = AT_384[workload]
    else:
        rate, n, s, x = CASES[workload]
        if devices == 384:
            rate, n = rate * SCALE, n * SCALE
            s, x = (dict(c, instances=c.get("instances", 1) * SCALE) for c in (s, x))
    return [(workload, devices, "sync", rate, n, s), (workload, devices, "async", rate, n, x)]


def _roles(x: dict) -> dict:
    """Mean busy / stall / idle shares per role over one engine's units (a sync fleet: per deployment)."""
    out = {}
    for p in x.get("deployments", [x]):
        for u in p["units"]:
            role = f"{p['deployment']} {u['role']}" if "deployment" in p else u["role"]
            out.setdefault(role, []).append(u)
    return {role: {k: mean for k, (mean, _, _) in _fractions(us, x["wall_s"]).items()}
            | {"units": len(us), "dies": sum(u["dies"] for u in us)} for role, us in out.items()}


def row(c: dict) -> str:
    x = c["explain"]
    s = x["summary"]
    cols = [f"{role} ({f['dies']} dies): {f['busy']:.0%} / {f['stall']:.0%} / {f['idle']:.0%}"
            for role, f in _roles(x).items()]
    eb = [p["expert_batches"] for p in x.get("deployments", [x]) if p["expert_batches"].get("mean_tokens") is not None]
    batch = "; ".join(f"{b['mean_tokens'] / 1e3:.1f}K ({b['routed_tokens_per_die'] / 1e3:.1f}K/die)" for b in eb)
    return (f"| {c['workload']} | {c['devices']} | {c['engine']} | {c['rate']:.2f} | {s['slo_attainment']:.1%} | "
            f"{(s['ttft_p90_ms'] or 0) / 1e3:.2f} | {'<br>'.join(cols)} | {batch} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--devices", type=int, nargs="+", default=[32, 384], choices=[32, 384])
    p.add_argument("--only", nargs="+", default=None, choices=list(CASES), help="these workloads only")
    p.add_argument("--out", default=None, help="write every breakdown here as JSON")
    a = p.parse_args(argv)
    jobs = [j for w in CASES if not a.only or w in a.only for d in a.devices for j in jobs_for(w, d)]
    print("[SIMULATED] where the time goes, each pair at sync's maximum; busy / stall / idle as shares of the "
          "window, mean over a role's units", flush=True)
    print("| workload | dies | engine | req/s | within SLO | P90 TTFT (s) | busy / stall / idle per role | "
          "expert batch (routed per die) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    cells = []
    with ProcessPoolExecutor(a.jobs) as pool:
        for c in pool.map(cell, jobs):
            cells.append(c)
            print(row(c), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(cells, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
