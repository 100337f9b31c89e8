"""SIMULATED: a hash of each of seven simulations' summaries, to check that a refactor keeps results bit for bit.

Run it on the code before a change and after, and compare the two files (the same hashes = the same
TTFTs, attainment and per-bucket figures). The layouts cover what the tuner searches: sync DP x TP, sync
instances, a sync length-aware fleet, async separate pools, co-located async with the fullest selector,
a co-located async fleet with an expert window, and async instances with adaptive depth. The first 300
requests of the shipped conversation sample, SLO 2 s + 1 ms/token, 32 cloudmatrix384 dies. ~35 s.

    python benchmarks/sim_golden.py before.json     # on the old checkout (PYTHONPATH=<its root>)
    python benchmarks/sim_golden.py after.json && diff before.json after.json
"""
from __future__ import annotations

import hashlib
import importlib
import json
import sys

from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

try:                        # asap/studies since 7920f19; asap/sim before
    tune = importlib.import_module("asap.studies.tune")
except ImportError:
    tune = importlib.import_module("asap.sim.tune")
try:                        # the tune's tasks in their own module since the tune's split
    from asap.studies.tune_tasks import simulate
except ImportError:
    simulate = tune._simulate

LAYOUTS = [
    (dict(engine="sync", attention_tp=4, token_budget=8192), 1.5),
    (dict(engine="sync", attention_tp=16, token_budget=16384, instances=2), 1.5),
    (dict(engine="sync", attention_tp=8, token_budget=32768, wide_replicas=1, wide_tp=16, router="round-robin"), 2.0),
    (dict(engine="async", attention_tp=1, token_budget=16384, attention_workers=20), 1.5),
    (dict(engine="async", attention_tp=4, token_budget=16384, colocated=True, microbatches=3, selector="fullest"), 2.0),
    (dict(engine="async", attention_tp=1, token_budget=8192, colocated=True, wide_replicas=4, wide_tp=4, microbatches=2,
          window_s=0.002, wide_token_budget=32768), 2.5),
    (dict(engine="async", attention_tp=4, token_budget=16384, attention_workers=1, instances=2,
          microbatches="adaptive"), 2.0),
]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    reqs = parse_slo("2s+1ms/tok").apply(workload_requests("conversation", 300))
    out = {}
    for kw, rate in LAYOUTS:
        c = tune.EngineConfig(**kw)
        summary = simulate((reqs, rate, c.engine, "deepseek-v3", "cloudmatrix384", 32, c, 0.0, None))
        digest = hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest()[:16]
        out[json.dumps(kw, sort_keys=True)] = digest
        print(f"[SIMULATED] {digest}  {summary['slo_attainment']:.3f} within SLO at {rate} req/s  {kw}", flush=True)
    with open(argv[0], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
