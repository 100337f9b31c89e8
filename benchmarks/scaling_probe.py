"""Is a row's scaling the design's or its sample's? (SIMULATED)

A larger headline row confirms its maxima on more requests than the row below it (the 128-die conversation
row on the trace's first 6,000, the 64-die row on its first 3,000), and a trace's later part need not look
like its start. So a ratio of two rows' maxima mixes the engine's scaling with the change of sample. This
probe runs each engine's best configuration of the smaller row on the larger row's sample, at half (or
devices_small / devices_large of) the larger row's maximum, under the headline's sustained criterion: where
it passes there, the larger row's "better than linear" scaling is the sample's; where it fails, it is the
layout's.

    ASAP_TRACE_DIR=../shared/traces python benchmarks/scaling_probe.py \
        --small out/s31/conv64/headline.json --large out/s31/conv128/headline.json
"""
from __future__ import annotations

import argparse
import json

from asap.studies.config import EngineConfig
from asap.workload.presets import workload_requests
from at_rate_probe import simulate      # benchmarks/, beside this script


def last_row(path: str) -> tuple[dict, dict]:
    with open(path) as f:
        doc = json.load(f)
    return doc, doc["rows"][-1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", required=True, help="headline.json whose last row is the smaller device count")
    p.add_argument("--large", required=True, help="headline.json whose last row is the larger device count")
    a = p.parse_args(argv)
    doc, large = last_row(a.large)
    _, small = last_row(a.small)
    if small["workload"] != large["workload"] or small["devices"] >= large["devices"]:
        raise SystemExit("--small and --large must be rows of one workload, --small on fewer devices")
    share = small["devices"] / large["devices"]
    print(f"[SIMULATED] {large['workload']}: the {small['devices']}-die best configurations on the "
          f"{large['devices']}-die row's sample, at {share:g} x its maxima")
    for engine in ("sync", "async"):
        lg, sm = large[engine], small[engine]
        n = lg["num_requests"]
        c = EngineConfig(**sm["config"])
        rate = share * lg["max_slo_rate"]
        out = simulate(doc, large, engine, c, rate, n, small["devices"])
        tokens = [r.num_tokens for r in workload_requests(large["workload"], n)]
        print(f"[SIMULATED] {engine:5} {c.describe(small['devices'])}")
        print(f"            its row: {sm['max_slo_rate']:.3f} req/s on {sm['num_requests']} requests; here "
              f"{rate:.3f} req/s on {n} (mean prompt {sum(tokens) / n:,.0f} tokens): "
              f"{out['sustained_attainment']:.1%} sustained within SLO "
              f"({'passes' if out['sustained_attainment'] >= doc['target_attainment'] else 'fails'} "
              f"{doc['target_attainment']:.0%}), {out['slo_attainment']:.1%} of all requests")


if __name__ == "__main__":
    main()
