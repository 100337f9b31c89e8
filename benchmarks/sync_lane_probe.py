"""Would sync gain from a short-prompt lane inside a deployment? (SIMULATED)

    ASAP_TRACE_DIR=../shared/traces python benchmarks/sync_lane_probe.py --rates 2.49 2.2 --below 4096 2048

Sync's short-prompt lane in the search is a deployment of its own (asap.sim.run.sync_fleet_parts), which at
32 dies no fleet has room for (it must hold the weights). An SGLang operator has one more way: a proxy that
sends prompts under a threshold to one DP rank of a deployment (a per-request DP rank). This runs the
conversation trace's first 3,000 requests through the sync fleets of the 32-die row (narrow DP x TP + one
DP1 x TP16 deployment for prompts >= 32K, srpt queues), with and without one of the narrow deployment's DP
groups reserved for short prompts (the async lane's router, asap.scheduler.length_router.LengthRouter with
one_way, over its DP groups), and prints attainment overall and per prompt-length bucket. The engine builds
such a lane (asap.sim.run.build_engine); EngineSpec refuses it for sync outside a fleet's lane deployment,
so this sets it on the narrow deployment's spec after validation: a probe, not a configuration the tuner
or the runtime offers.
"""
from __future__ import annotations

import argparse

from asap.measure.metrics import summarize
from asap.sim.run import run, sync_fleet_parts
from asap.studies.config import EngineConfig
from asap.studies.experiments import at_rate
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

BUCKETS = ((0, 4096), (4096, 16384), (16384, 65536), (65536, None))


def attainment(results, lo=0, hi=None) -> float:
    rs = [r for r in results if r.num_tokens >= lo and (hi is None or r.num_tokens < hi)]
    return sum(r.ttft is not None and r.ttft <= r.deadline_s for r in rs) / max(1, len(rs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[2.49])
    ap.add_argument("--below", type=int, nargs="+", default=[4096], help="the lane's threshold(s), tokens")
    ap.add_argument("--num-requests", type=int, default=3000)
    a = ap.parse_args()
    reqs = parse_slo("2s+1ms/tok").apply(workload_requests("conversation", a.num_requests))
    print("SIMULATED, DeepSeek-V3 on 32 cloudmatrix384 dies, SLO 2 s + 1 ms/token; buckets <4K / 4-16K / 16-64K / >64K")
    for tp, chunk in ((8, 16384), (4, 8192)):
        c = EngineConfig("sync", tp, chunk, wide_replicas=1, wide_tp=16, order="srpt")
        for rate in a.rates:
            own = at_rate(reqs, rate)
            for below in [None, *a.below]:
                results = []
                for name, mine, s in sync_fleet_parts(own, c.spec("deepseek-v3", "cloudmatrix384", 32)):
                    if name == "narrow" and below:      # one DP group of the narrow deployment for prompts < below
                        object.__setattr__(s, "short_replicas", 1)
                        object.__setattr__(s, "short_below_tokens", below)
                    results += run(mine, s).results if mine else []
                lane = f"1 of its DP{(32 - 16) // tp} groups for < {below // 1024}K" if below else "no lane"
                buckets = " / ".join(f"{attainment(results, lo, hi):.1%}" for lo, hi in BUCKETS)
                print(f"{c.describe(32)}, {lane} @ {rate} req/s: {summarize(results)['slo_attainment']:.1%} "
                      f"within SLO ({buckets})", flush=True)


if __name__ == "__main__":
    main()
