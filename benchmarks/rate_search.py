"""SIMULATED: fine rate searches of hand-picked configurations, side by side on one workload.

Where the tuner's screening sample cannot rank candidates (on fixed-length Poisson traffic both engines
pass at its burst limit), or to compare a few configurations more finely than its search does, this runs
each configuration alone: the first `--num-requests` requests of the workload with the SLO (default
2 s + 1 ms/token), a valid-or-not rate search (asap.studies.skeptic.rate_at) with a 2% tolerance. The
default configurations are the ones an operator would try on even traffic: sync DP x TP1 with 4K / 8K
chunks, and async separate pools around the balance point with 16K chunks, k=3 and the fullest-layer
expert selector, plus the old default (A=19, k=2, oldest). Hand-picked, not a full tune of either space:
read a ratio as indicative.

    python benchmarks/rate_search.py --workload fixed-4k --devices 32 --lo 25 [--config '{"engine": ...}' ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from asap.cost.model import CostModel
from asap.measure.metrics import summarize
from asap.sim.run import get_hardware, get_model, run
from asap.studies.bound import work_bound
from asap.studies.skeptic import rate_at
from asap.studies.experiments import at_rate
from asap.studies.config import EngineConfig
from asap.studies.tune import TARGET
from asap.studies.tune_tasks import CRITERIA, pass_values
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

DEFAULTS = [dict(engine="sync", token_budget=4096), dict(engine="sync", token_budget=8192)] + [
    dict(engine="async", token_budget=16384, attention_workers=a, selector="fullest", microbatches=3)
    for a in (17, 18, 19)] + [dict(engine="async", token_budget=16384, attention_workers=19)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="fixed-4k",
                   help="a name of asap.workload.presets, or a Mooncake .jsonl / Azure .csv trace (default fixed-4k)")
    p.add_argument("--devices", type=int, default=32)
    p.add_argument("--hardware", default="cloudmatrix384",
                   help="a built-in hardware profile or a profile JSON (asap.cost.hardware), e.g. a scaled copy "
                        "for a sensitivity check (default cloudmatrix384)")
    p.add_argument("--num-requests", type=int, default=2500)
    p.add_argument("--lo", type=float, default=10.0, help="the rate search's first rate (req/s)")
    p.add_argument("--slo", default="2s+1ms/tok")
    p.add_argument("--tol", type=float, default=0.02, help="the rate search's relative tolerance")
    p.add_argument("--criterion", default="requests", choices=[*CRITERIA, "both", "both-sustained"],
                   help=">= 90%% of all requests within SLO, or >= 90%% in every prompt-length bucket, or both "
                        "(sharing the simulations; default requests)")
    p.add_argument("--sustain", type=int, default=0, metavar="K",
                   help="re-run each maximum found on K x the requests (the same workload continued) and print "
                        "its attainment and whether it holds there by the criterion's rule (with -sustained: "
                        "drained in time, the target in each arrival third), as the tuner confirms a maximum: a "
                        "rate that passes only because the run ends before the queue grows past the deadlines "
                        "fails there (default 0: no check)")
    p.add_argument("--config", action="append", default=None,
                   help="an asap.studies.config.EngineConfig as JSON (repeatable; default: the hand-picked set)")
    args = p.parse_args(argv)
    if args.sustain < 0 or args.sustain == 1:
        p.error(f"--sustain must be 0 (no check) or >= 2, got {args.sustain}")
    configs = [json.loads(c) for c in args.config] if args.config else DEFAULTS
    slo = parse_slo(args.slo)
    reqs = slo.apply(workload_requests(args.workload, args.num_requests))
    longer = slo.apply(workload_requests(args.workload, args.num_requests * args.sustain)) if args.sustain else None
    criteria = {"both": ["requests", "every-bucket"], "both-sustained": ["requests-sustained", "every-bucket-sustained"]
                }.get(args.criterion, [args.criterion])
    ceiling = work_bound(reqs, args.devices, CostModel(get_model("deepseek-v3"),
                                                       get_hardware(args.hardware)))["ceiling"][args.devices]
    print(f"[SIMULATED] hardware {args.hardware}; work ceiling of these requests on {args.devices} dies "
          f"(`asap sim bound`): {ceiling:.4g} req/s")
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for kw in configs:
        c, cache = EngineConfig(**kw), {}
        for crit in criteria:
            t = time.time()
            try:
                r = rate_at(reqs, c, args.devices, "deepseek-v3", args.hardware, lo=args.lo, tol=args.tol,
                            criterion=crit, cache=cache)
            except ValueError as e:     # a layout these dies cannot hold (memory, divisibility): say so, go on
                print(f"[SIMULATED] {args.workload}, {args.devices} dies: {c.describe(args.devices)}: "
                      f"not a valid layout: {e}", flush=True)
                break
            rate = r.get("max_slo_rate") if r.get("valid") else None
            shown = f"{rate:.2f} req/s ({rate / ceiling:.0%} of the ceiling" \
                    f"{'; ABOVE it: not sustainable' if rate > ceiling else ''})" if rate is not None \
                else f"no valid search ({r.get('reason')})"
            print(f"[SIMULATED] {args.workload}, {args.devices} dies, {crit}: {c.describe(args.devices)}: {shown} "
                  f"({time.time() - t:.0f} s)", flush=True)
            if rate is not None and longer is not None:
                res = run(at_rate(longer, rate), c.spec("deepseek-v3", args.hardware, args.devices)).results
                s = summarize(res)
                s |= pass_values(res, s["slo_attainment"])      # what the tuner compares, as it confirms
                value = s[CRITERIA[crit]]
                print(f"[SIMULATED]   sustained? at {rate:.2f} req/s on {len(longer)} requests: "
                      f"{s['slo_attainment']:.1%} within SLO, worst length bucket {s['min_bucket_attainment']:.1%}; "
                      f"by this criterion's rule {value:.1%}: {'holds' if value >= TARGET else 'FAILS'}", flush=True)
                if value < TARGET:      # not sustained: no maximum of this configuration counts below
                    rate = None
            if rate is not None and rate > best.get((c.engine, crit), (0.0, ""))[0]:
                best[(c.engine, crit)] = (rate, c.describe(args.devices))
    for crit in criteria:
        if ("sync", crit) in best and ("async", crit) in best:
            a, s_ = best[("async", crit)], best[("sync", crit)]
            print(f"[SIMULATED] {crit}: best async / best sync of these{' (maxima that hold)' if longer else ''}: "
                  f"{a[0] / s_[0]:.3f}x ({a[0]:.2f} req/s, {a[1]} against {s_[0]:.2f}, {s_[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
