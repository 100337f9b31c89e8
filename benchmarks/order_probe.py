"""SIMULATED: does the queue order inside a replica / DP group change a headline row's ratio?

    ASAP_TRACE_DIR=../shared/traces python benchmarks/order_probe.py out/headline/headline.json \
        --workload conversation --devices 32 [--top 2] [--orders fcfs sjf edf srpt edf-preempt] [--jobs 2] \
        [--lanes 0 1:4096 2:4096]

The tuner searches every engine with first-come-first-served queues. An operator can order them otherwise:
vLLM's `--scheduling-policy priority` (and SGLang's priority scheduling) serve waiting requests by a
per-request priority, which a proxy can set to the prompt length (sjf) or the deadline (edf); ASAP's
scheduler also has the preemptive srpt and edf-preempt (a started prompt yields to a shorter / earlier-deadline
one at each chunk; asap.scheduler.replica). This takes one row of an `asap sim headline` JSON, each engine's
`--top` best candidates (by the rate the row certified them at), and searches each under every order (the
row's criterion, a 2% tolerance, on the row's requests): the same orders and the same search for both engines.
It prints every rate, each engine's best, the ratio, and both bests' attainment per prompt-length bucket at
the sync best's rate. Not a full tune: the candidates are the fcfs tune's, read the ratio as indicative.

--lanes also varies a short-prompt lane (EngineConfig.short_replicas: N narrow replicas / DP groups that take
only prompts under TOKENS; `0` none), for both engines alike; a layout the engine cannot build (a sync lane
is a deployment of its own and needs the weights' memory) is reported and skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from asap.measure.buckets import format_buckets
from asap.scheduler.replica import ORDERS
from asap.studies.config import EngineConfig
from asap.studies.skeptic import buckets_at, rate_at
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

LABEL = "SIMULATED"


def _rate(cand: dict) -> float:
    return max(cand.get(k) or 0.0 for k in ("sustained_rate", "fine_rate", "vet_rate"))


def top_configs(engine_row: dict, k: int, every_bucket: bool = False) -> list[EngineConfig]:
    """The engine's best `k` distinct candidates of the row, the row's best first (every_bucket: its
    every-bucket best, then its best)."""
    eb = (engine_row.get("every_bucket") or {}).get("config")
    out = [EngineConfig(**eb)] if every_bucket and eb else []
    out += [c for c in [EngineConfig(**engine_row["config"])] if c not in out]
    for cand in sorted(engine_row.get("candidates", []), key=_rate, reverse=True):
        c = EngineConfig(**cand["config"])
        if _rate(cand) > 0 and c not in out:
            out.append(c)
    return out[:k]


def _search(job: tuple) -> tuple:
    key, reqs, c, devices, model, hardware, lo, criterion = job
    t = time.perf_counter()
    try:
        r = rate_at(reqs, c, devices, model, hardware, lo=lo, tol=0.02, criterion=criterion)
    except ValueError as e:             # a layout this engine cannot build
        return key, None, f"not a valid layout: {e}", time.perf_counter() - t
    return key, r["max_slo_rate"] if r["valid"] else None, r["reason"], time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("headline", help="an `asap sim headline` JSON (headline.json)")
    p.add_argument("--workload", required=True)
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--top", type=int, default=2, help="candidates per engine (default 2)")
    p.add_argument("--orders", nargs="+", default=list(ORDERS), choices=ORDERS)
    p.add_argument("--every-bucket", action="store_true",
                   help="search under the row's every-bucket criterion (>= 90%% in each prompt-length bucket) and "
                        "start from its every-bucket maxima")
    p.add_argument("--lanes", nargs="+", default=["0"], metavar="N[:TOKENS]",
                   help="short-prompt lanes to try: N replicas / DP groups for prompts under TOKENS (default 4096); "
                        "0: none (default: 0 only)")
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args(argv)
    try:
        lanes = [(int(x.split(":")[0]), int(x.split(":")[1]) if ":" in x else 4096) for x in a.lanes]
    except ValueError:
        p.error(f"--lanes takes N or N:TOKENS, got {' '.join(a.lanes)}")
    if a.top < 1 or a.jobs < 1:
        p.error("--top and --jobs must be >= 1")
    d = json.load(open(a.headline))
    rows = [r for r in d["rows"] if r["workload"] == a.workload and r["devices"] == a.devices]
    if not rows:
        p.error(f"{a.headline} has no row for {a.workload} x{a.devices}")
    row = rows[0]
    criterion = ("every-bucket" if a.every_bucket else "requests") + ("-sustained" if d.get("sustained") else "")
    slo = parse_slo(d["slo"])
    jobs, reqs_of = [], {}
    for engine in ("sync", "async"):
        n = row[engine]["num_requests"]
        reqs = reqs_of.setdefault(n, slo.apply(workload_requests(a.workload, n)))
        lo = 0.8 * ((row[engine].get("every_bucket") or {}).get("max_slo_rate") if a.every_bucket
                    else row[engine]["max_slo_rate"])
        for i, c in enumerate(top_configs(row[engine], a.top, a.every_bucket)):
            for o in a.orders:
                for n, below in lanes:
                    v = dataclasses.replace(c, order=o, short_replicas=n, short_below_tokens=below)
                    jobs.append(((engine, i, o, n, below), reqs, v, a.devices, d["model"], d["hardware"], lo,
                                 criterion))
    print(f"[{LABEL}] {a.workload} x{a.devices}, {criterion}, {len(jobs)} rate searches "
          f"(top {a.top} per engine x orders {' '.join(a.orders)} x lanes {' '.join(a.lanes)})", flush=True)
    found = {}
    with ProcessPoolExecutor(a.jobs) as ex:
        for key, rate, reason, secs in ex.map(_search, jobs):
            engine, i, o = key[:3]
            c = next(j[2] for j in jobs if j[0] == key)
            found[key] = (rate, c)
            print(f"[{LABEL}]   {engine} #{i + 1} {o:>11}: " + (f"{rate:.3f} req/s" if rate else f"- ({reason})")
                  + f"  {c.describe(a.devices)}  ({secs:.0f} s)", flush=True)
    best = {}
    for engine in ("sync", "async"):
        got = [(r, c) for k, (r, c) in found.items() if k[0] == engine and r]
        fcfs = [(r, c) for k, (r, c) in found.items() if k[0] == engine and k[2] == "fcfs" and not k[3] and r]
        best[engine] = max(got, key=lambda x: x[0]) if got else None
        if best[engine]:
            print(f"[{LABEL}] {engine} best: {best[engine][0]:.3f} req/s, {best[engine][1].describe(a.devices)}"
                  + (f" (fcfs best {max(fcfs, key=lambda x: x[0])[0]:.3f})" if fcfs else ""), flush=True)
    if best["sync"] and best["async"]:
        rate = best["sync"][0]
        print(f"[{LABEL}] async / sync, each its best variant: {best['async'][0] / rate:.2f}x", flush=True)
        for engine in ("sync", "async"):
            b = buckets_at(reqs_of[row[engine]["num_requests"]], best[engine][1], a.devices, d["model"],
                           d["hardware"], rate)
            print(f"[{LABEL}]   {engine} at {rate:.3f} req/s: {b['overall']:.1%} within SLO; "
                  f"{format_buckets(b['buckets'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
