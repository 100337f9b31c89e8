"""SIMULATED: one engine's tune of one headline row, with where every candidate ranked.

    ASAP_TRACE_DIR=../shared/traces python benchmarks/tune_table.py --engine async --devices 32 \
        --workload conversation --num-requests 1500 --fleet-fractions 0.25 0.5 0.625 0.75 --out tune.json

`asap sim headline --sustained` tunes each engine through asap.studies.tune.tune on the row's first
--num-requests requests, confirming each refined maximum on twice as many; this runs the same call for one
engine (one core, a line per simulation) and writes its whole table to --out: every screened candidate with
the rate it passed in the screen, its attainment at the last rate it was screened at, and for the finalists
the coarse, fine and confirmed rates. It answers "why did the tuner not pick X": find X's row.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from asap.studies.parallel import Progress
from asap.studies.space import FLEET_FRACTIONS
from asap.studies.tune import CONFIRM, tune
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["sync", "async"], required=True)
    p.add_argument("--devices", type=int, default=32)
    p.add_argument("--workload", default="conversation",
                   help="a name of asap.workload.presets, or a Mooncake .jsonl / Azure .csv trace")
    p.add_argument("--num-requests", type=int, default=1500)
    p.add_argument("--slo", default="2s+1ms/tok")
    p.add_argument("--fleet-fractions", type=float, nargs="+", default=list(FLEET_FRACTIONS))
    p.add_argument("--criterion", default="requests-sustained",
                   choices=["requests", "every-bucket", "requests-sustained", "every-bucket-sustained"])
    p.add_argument("--vet", action="store_true",
                   help="with a -sustained criterion: re-rank the screen's leaders on the confirmation sample "
                        "(asap sim headline --vet)")
    p.add_argument("--out", required=True, help="a JSON file for the table")
    a = p.parse_args(argv)
    if a.num_requests < 2:
        p.error(f"--num-requests must be >= 2, got {a.num_requests}")
    sustained = a.criterion.endswith("-sustained")
    if a.vet and not sustained:
        p.error("--vet re-ranks on the sample a -sustained criterion confirms on: pick one")
    pool = parse_slo(a.slo).apply(workload_requests(a.workload, a.num_requests * (CONFIRM if sustained else 1)))
    t0 = time.time()
    t = tune(pool[:a.num_requests], a.engine, a.devices, criterion=a.criterion,
             fleet_fractions=tuple(a.fleet_fractions), longer=pool if sustained else None,
             progress=Progress(f"tune {a.engine} x{a.devices}", t0), vet=a.vet)
    print(f"[SIMULATED] {a.engine} x{a.devices} on {a.workload}: "
          + (f"{t.best.describe(a.devices)}: {t.max_slo_rate:.4g} req/s on {t.num_requests} requests"
             + (f" (search {t.search_rate:.4g})" if t.search_rate else "") if t.best else f"no result: {t.reason}")
          + f" ({time.time() - t0:.0f} s, {t.num_sims} simulations)", flush=True)
    with open(a.out, "w") as f:
        json.dump({"label": "SIMULATED", "args": vars(a), "best": dataclasses.asdict(t.best) if t.best else None,
                   "max_slo_rate": t.max_slo_rate, "search_rate": t.search_rate, "reason": t.reason,
                   "table": t.candidates}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
