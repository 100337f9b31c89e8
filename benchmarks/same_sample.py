"""One headline row's configuration at one rate on a chosen sample, judged as the tuner's sustain rule judges it
(SIMULATED). Settles whether two maxima confirmed on different samples hold on the same one. Unlike
`asap sim explain --config`, which breaks down one instance, it runs every instance of the row.

    ASAP_TRACE_DIR=../shared/traces python benchmarks/same_sample.py out/s15/conv384/headline.json \\
        --devices 384 --engine sync --rate 31.98 --num-requests 24000

Prints attainment, the worst length bucket, each arrival third, the drain after the last arrival against the
longest TTFT budget, and whether the run passes the "-sustained" criteria at the 90% target.
"""
import argparse
import json
import sys
import time
from pathlib import Path

from asap.measure.buckets import by_length, format_buckets
from asap.measure.metrics import summarize
from asap.measure.sustain import by_arrival_third, drain
from asap.sim.run import run
from asap.studies.experiments import at_rate
from asap.studies.config import EngineConfig
from asap.studies.tune import TARGET
from asap.studies.tune_tasks import pass_values
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("headline", help="a headline JSON (asap sim headline --out DIR writes DIR/headline.json)")
    p.add_argument("--devices", type=int, required=True, help="the row's device count")
    p.add_argument("--workload", default=None, help="the row's workload (default: the headline's first)")
    p.add_argument("--engine", choices=("sync", "async"), required=True)
    p.add_argument("--rate", type=float, required=True, help="req/s")
    p.add_argument("--num-requests", type=int, required=True, help="the sample: the workload's first N requests")
    args = p.parse_args(argv)
    h = json.loads(Path(args.headline).read_text())
    wl = args.workload or h["workloads"][0]
    rows = [r for r in h["rows"] if r["devices"] == args.devices and r["workload"] == wl]
    if not rows or not rows[0][args.engine]["config"]:
        print(f"no {args.engine} configuration for {wl} at {args.devices} devices in {args.headline}", file=sys.stderr)
        return 2
    row = rows[0][args.engine]
    pool = parse_slo(h["slo"]).apply(workload_requests(wl, args.num_requests))
    t = time.time()
    res = run(at_rate(pool, args.rate), EngineConfig(**row["config"]).spec(h["model"], h["hardware"], args.devices))
    s = summarize(res.results)
    v = pass_values(res.results, s["slo_attainment"])
    d = drain(res.results)
    print(f"[SIMULATED] {args.engine} {row['describe']}\n  at {args.rate:.3f} req/s on the first {len(pool)} "
          f"{wl} requests ({time.time() - t:.0f} s)")
    print(f"  within SLO {s['slo_attainment']:.4f}, worst length bucket {v['min_bucket_attainment']:.4f}")
    print(f"  by length: {format_buckets(by_length(res.results))}")
    print("  by arrival third: " + " / ".join("-" if a is None else f"{a:.4f}" for a in by_arrival_third(res.results)))
    if d["drain_s"] is not None:
        print(f"  drain after the last arrival {d['drain_s']:.1f} s (longest budget {d['max_budget_s']:.1f} s)")
    print(f"  sustained, {TARGET:.0%} of requests: {'holds' if v['sustained_attainment'] >= TARGET else 'fails'}; "
          f"every bucket: {'holds' if v['sustained_min_bucket_attainment'] >= TARGET else 'fails'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
