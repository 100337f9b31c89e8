"""EMULATED against SIMULATED: does the runtime put each engine's SLO-compliant maximum where the simulator does?

    python benchmarks/emulated_vs_sim.py [--engines sync async] [--band 0.1] [--dilation 8] [--lone]

The demo's 24-device workload (asap/demo/settings.py: DeepSeek-V3 on CloudMatrix384-like dies, Mooncake
prompt lengths x1/8, Poisson arrivals, SLO 5x a prompt's idle sync TTFT) and each engine's best-tuned
emulatable configuration (asap/demo/tuned.json, with the simulator's SLO-compliant rate R). The emulated
runtime (real worker processes and messages, compute timed from the same cost model) runs each engine at
(1 - band) R and (1 + band) R on requests whose arrivals span >= 10x the mean SLO budget (the burst rule),
and the simulator replays the same requests. The emulated maximum lies within +-band of the simulator's when
the emulated run passes (>= 90% within SLO) at (1 - band) R and fails at (1 + band) R.
--lone instead times lone prompts (500, 2,000 and 8,000 tokens, one at a time on the idle engine) both ways:
the runtime's own overhead per request, with no queueing to amplify it.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

from asap.bench.targets import EngineTarget
from asap.demo.emulated import runtime_for
from asap.demo.settings import FULL, demo_requests
from asap.demo.simulated import simulate
from asap.demo.tuning import tuned_configs
from asap.measure.metrics import summarize
from asap.measure.rate_search import BURST_SPAN_FACTOR

TARGET = 0.9


def requests_at(s, devices: int, rate: float):
    """Enough requests at `rate` that their arrivals span BURST_SPAN_FACTOR x the mean SLO budget."""
    probe = demo_requests(s, devices, 200, rate)
    budget = sum(r.deadline - r.arrival for r in probe) / len(probe)
    n = max(60, math.ceil(BURST_SPAN_FACTOR * budget * rate) + 1)
    return demo_requests(s, devices, n, rate)


def lone(engine: str, s, runtime) -> None:
    import asap
    from asap.scheduler.request import Request
    from asap.sim.from_runtime import engine_spec
    from asap.sim.run import run
    with asap.LLM(s.model, engine=engine, runtime=runtime) as llm:
        llm.submit(num_tokens=2000).result(timeout=600)          # warm-up
        for n in (500, 2000, 8000):
            sim = run([Request(0, n)], engine_spec(runtime, engine, s.model)).results[0].ttft
            t0 = time.monotonic()
            llm.submit(num_tokens=n).result(timeout=600)
            emu = (time.monotonic() - t0) / s.dilation
            print(f"  lone prompt of {n} tokens: EMULATED {emu * 1e3:.1f} ms, SIMULATED {sim * 1e3:.1f} ms "
                  f"(EMULATED / SIMULATED {emu / sim:.3f})", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    p.add_argument("--band", type=float, default=0.1, help="relative half-width of the bracket")
    p.add_argument("--only", choices=["low", "high"], default=None,
                   help="run one end of the bracket only (low = (1 - band) R, high = (1 + band) R)")
    p.add_argument("--dilation", type=float, default=FULL.dilation,
                   help="emulated time runs this many times slower than the wall clock")
    p.add_argument("--lone", action="store_true", help="time lone prompts instead of bracketing the maxima")
    args = p.parse_args(argv)
    s = dataclasses.replace(FULL, dilation=args.dilation)
    devices = s.devices
    tuned = tuned_configs(s, devices, emulatable_only=True)
    print(f"[EMULATED vs SIMULATED] {s.model} on {devices} {s.hardware}-like dies, dilation {s.dilation:g}, "
          f"configurations {tuned['source']}")
    verdicts = {}
    for engine in args.engines:
        c, r_sim = tuned[engine], tuned["tuning"][engine]["max_slo_rate"]
        print(f"{engine}: {c.describe(devices)}; SIMULATED SLO-compliant rate {r_sim:.3g} req/s")
        if args.lone:
            lone(engine, s, runtime_for(c, s, devices))
            continue
        target = EngineTarget(engine, s.model, runtime_for(c, s, devices), progress=False)
        passed = {}
        try:
            ends = {"low": (1 - args.band,), "high": (1 + args.band,)}.get(args.only, (1 - args.band, 1 + args.band))
            for f in ends:
                rate = f * r_sim
                reqs = requests_at(s, devices, rate)
                t0 = time.monotonic()
                emu = summarize(target.run(reqs))
                wall = time.monotonic() - t0
                sim = simulate(reqs, c, s, devices)
                passed[f] = emu["slo_attainment"] >= TARGET
                print(f"  at {rate:6.3g} req/s ({f:.2f} R), {len(reqs)} requests: EMULATED attainment "
                      f"{emu['slo_attainment']:.3f}, TTFT p90 {emu['ttft_p90_ms'] / 1e3:.2f} s | SIMULATED attainment "
                      f"{sim['slo_attainment']:.3f}, TTFT p90 {sim['ttft_p90_ms'] / 1e3:.2f} s "
                      f"({wall:.0f} s wall, load average {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            target.close()
        if args.only:
            print(f"  -> one end only: the EMULATED maximum is {'above' if all(passed.values()) else 'below'} "
                  f"{next(iter(passed)):.2f} R")
            continue
        lo, hi = passed[1 - args.band], passed[1 + args.band]
        verdicts[engine] = lo and not hi
        where = ("within" if lo and not hi else "above" if lo and hi else "below" if not lo and not hi
                 else "not bracketed (passes above, fails below)")
        print(f"  -> the EMULATED maximum is {where} +-{args.band:.0%} of the SIMULATED {r_sim:.3g} req/s")
    if verdicts:
        print("verdict: " + ", ".join(f"{e} {'agrees' if v else 'DISAGREES'}" for e, v in verdicts.items())
              + f" (within +-{args.band:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
