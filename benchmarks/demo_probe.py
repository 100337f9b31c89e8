"""SIMULATED: rank the demo's stored configurations on a longer sample than the tuner's.

Where both engines' best candidates still pass at the highest rate the demo's tuning sample can certify
(asap/demo/tuned.json holds them as lower bounds: 384 dies), this searches each stored configuration
alone on more requests, the shipped sample's prompt lengths reused past its end (Workload.loop), with
the tuner's own search (asap.sim.tune.tune, one candidate). It ranks the two stored candidates only: it is
not a retune of the space.

    python benchmarks/demo_probe.py --devices 384 --num-requests 7200 [--engine sync|async]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from asap.demo.settings import FULL, demo_requests
from asap.demo.tuning import TUNED, key
from asap.sim.tune import EngineConfig, tune


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=FULL.sim_devices)
    p.add_argument("--num-requests", type=int, default=7200)
    p.add_argument("--engine", choices=("sync", "async"), nargs="+", default=["sync", "async"])
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    table = json.loads(TUNED.read_text())
    k = key(FULL, args.devices, emulatable_only=args.devices == FULL.devices)
    if k not in table:
        p.error(f"no stored demo tuning for {args.devices} devices ({k})")
    requests = demo_requests(FULL, args.devices, args.num_requests, rate=1.0, loop=True)
    out = {"label": "SIMULATED", "devices": args.devices, "num_requests": args.num_requests, "engines": {}}
    for engine in args.engine:
        cfg = EngineConfig(**table[k][engine]["config"])
        t0 = time.monotonic()
        t = tune(requests, engine, args.devices, FULL.model, FULL.hardware, candidates=[cfg], refine=1)
        rate = (f"{t.max_slo_rate:.2f} req/s (P90 TTFT {t.ttft_p90_s:.2f} s)" if t.best else
                f">= {t.lower_bound:.2f} req/s (still a lower bound)" if t.lower_bound else f"none ({t.reason})")
        print(f"[SIMULATED] {cfg.describe(args.devices)} on up to {len(requests)} requests: {rate} "
              f"({time.monotonic() - t0:.0f} s, {t.num_sims} simulations)", flush=True)
        out["engines"][engine] = {"describe": cfg.describe(args.devices), "max_slo_rate": t.max_slo_rate,
                                  "lower_bound": t.lower_bound, "num_requests": t.num_requests,
                                  "ttft_p90_s": t.ttft_p90_s, "reason": t.reason}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
