"""SIMULATED: rerun the sync rate search of headline rows on their recorded best configuration.

    ASAP_TRACE_DIR=../shared/traces python benchmarks/resync_instances.py --headline out/sim_headline/headline.json \
        --workload conversation --rows 64:6000 128:6000 384:6000

For a row (devices:requests in the pool) of a headline JSON (`asap sim headline`), the sync engine's recorded
best configuration gets the same rate search again (asap.sim.tune.tune with that one candidate), on the same
workload, SLO and request pool: what a change to the simulator under a fixed configuration does to the
baseline's SLO-compliant rate (5320423: the router across independent sync instances). It is not a new
search over the configuration space. Prints old and new rate and the async/sync ratio against the row's async.
"""
from __future__ import annotations

import argparse
import json
import time

from asap.sim.tune import EngineConfig, tune
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--headline", required=True, help="a headline.json holding the rows")
    p.add_argument("--workload", required=True)
    p.add_argument("--rows", nargs="+", required=True, metavar="DEVICES:REQUESTS")
    args = p.parse_args(argv)
    head = json.loads(open(args.headline).read())
    slo = parse_slo(head["slo"])
    for spec in args.rows:
        devices, n = (int(x) for x in spec.split(":"))
        row = next(r for r in head["rows"] if r["workload"] == args.workload and r["devices"] == devices)
        c = EngineConfig(**row["sync"]["config"])
        t0 = time.monotonic()
        t = tune(slo.apply(workload_requests(args.workload, n)), "sync", devices, head["model"], head["hardware"],
                 candidates=[c], start_rate=row["sync"]["max_slo_rate"], refine=1)
        a, old, new = row["async"]["max_slo_rate"], row["sync"]["max_slo_rate"], t.max_slo_rate
        ratio = f"{a / new:.2f}x" if a and new else "-"
        print(f"[SIMULATED] {args.workload} at {devices} devices, {c.describe(devices)}: sync {old:.3g} -> "
              f"{new if new is None else round(new, 3)} req/s (P90 TTFT {t.ttft_p90_s}, {t.num_requests} requests"
              f"{', ' + t.reason if t.reason else ''}); async {a}; async/sync {ratio} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
