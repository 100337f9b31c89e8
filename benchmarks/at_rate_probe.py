"""A headline row's best configuration, and its variants in one knob, simulated at given rates on the row's
confirmation sample (SIMULATED): what each criterion's value is there (all requests, sustained, every bucket).

Where the tune's vet ranks leaders that tie at the top of its grid by their value at the rate above it, this
shows what that value is: under the sustained criteria a run that does not drain in time scores 0, so two
leaders that both fail there tie again.

    ASAP_TRACE_DIR=../shared/traces python benchmarks/at_rate_probe.py out/s31/conv32/headline.json \
        --engine async --set order=fcfs order=srpt --rates 2.9 3.48
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from asap.studies.config import EngineConfig
from asap.studies.tune_tasks import simulate as simulate_task
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


def variant(c: EngineConfig, setting: str) -> EngineConfig:
    name, _, text = setting.partition("=")
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    if name not in fields or not text:
        raise SystemExit(f"--set takes FIELD=VALUE with FIELD one of {', '.join(fields)}, got {setting!r}")
    old = getattr(c, name)
    try:
        if isinstance(old, bool):
            value = text.lower() in ("1", "true", "on", "yes")
        elif isinstance(old, (int, float)) or old is None:
            value = float(text) if isinstance(old, float) or "." in text else int(text)
        else:
            value = text
    except ValueError:
        raise SystemExit(f"--set {setting}: {text!r} is not a number") from None
    return dataclasses.replace(c, **{name: value})


def simulate(doc: dict, row: dict, engine: str, c: EngineConfig, rate: float, n: int, devices: int) -> dict:
    """`c` on `devices` devices at `rate` on the first n requests of the row's workload, with the headline's
    SLO: the summary the tune ranks by (asap.studies.tune_tasks.simulate). Shared with scaling_probe.py."""
    reqs = parse_slo(doc["slo"]).apply(workload_requests(row["workload"], n))
    return simulate_task((reqs, rate, engine, doc["model"], doc["hardware"], devices, c, 0.0, None))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("headline", help="headline.json; its last row is used")
    p.add_argument("--engine", choices=("sync", "async"), required=True)
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="variants of the row's best, one knob each (default: the best only)")
    p.add_argument("--rates", type=float, nargs="+", required=True)
    a = p.parse_args(argv)
    with open(a.headline) as f:
        doc = json.load(f)
    row = doc["rows"][-1]
    best = EngineConfig(**row[a.engine]["config"])
    n = row[a.engine]["num_requests"]
    print(f"[SIMULATED] {row['workload']}, {row['devices']} dies, {n} requests, {a.engine} best: "
          f"{best.describe(row['devices'])}")
    for c in [best] + [variant(best, s) for s in a.set]:
        for rate in a.rates:
            o = simulate(doc, row, a.engine, c, rate, n, row["devices"])
            print(f"[SIMULATED]   {c.describe(row['devices'])[-60:]:>60} at {rate:.4g} req/s: all requests "
                  f"{o['slo_attainment']:.1%}, sustained {o['sustained_attainment']:.1%}, every bucket "
                  f"{o['min_bucket_attainment']:.1%}, sustained every bucket {o['sustained_min_bucket_attainment']:.1%}")


if __name__ == "__main__":
    main()
