"""`asap demo`: the sync DP+EP baseline and the async engine side by side, on this CPU, real compute.

Both engines get 2 devices (worker processes of one thread each): sync = 2
ranks, async = 1 attention replica + 1 expert worker. They run the same
requests: the first requests of the Mooncake conversation trace, prompts
scaled down, arrivals rescaled to a rate this CPU can serve (see DEMO).
Prints the comparison table, writes JSON and plots into --out.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from asap.bench.cli import describe_slo, measure, record_of, summary_text, write_plots
from asap.bench.report import write_json
from asap.bench.targets import EngineTarget, default_trace
from asap.config import ModelConfig, RuntimeConfig
from asap.workload import LogNormal, Poisson, Workload


@dataclass(frozen=True)
class DemoSettings:
    model: str
    length_scale: float     # Mooncake prompts (mean ~12k tokens) shrunk to CPU size ...
    max_tokens: int         # ... and clipped to [16, max_tokens]
    duration_s: float       # the arrivals span about this long
    load: float             # offered prompt tokens/s, as a fraction of the lone-prompt rate measured here
    slo_scale: float        # SLO = slo_scale x TTFT of a lone max_tokens prompt on the idle sync engine
    max_requests: int
    token_budget: int


# The rate and the SLO are calibrated on this machine (one lone prompt on the sync engine), so the CPU
# is loaded but not swamped however fast or busy it is, and the runs stay near `duration_s` each.
DEMO = DemoSettings("small-deepseek-v3", length_scale=1 / 64, max_tokens=512, duration_s=40.0, load=1.2,
                    slo_scale=5.0, max_requests=64, token_budget=1024)
QUICK = DemoSettings("tiny-deepseek-v3", length_scale=1 / 64, max_tokens=256, duration_s=2.0, load=0.8,
                     slo_scale=5.0, max_requests=16, token_budget=512)
MIN_REQUESTS = 12       # the trace's first 10 requests share one timestamp


def register(sub):
    p = sub.add_parser("demo", help="sync vs async side by side on this CPU (real compute, ~3 minutes)",
                       description=__doc__)
    p.add_argument("--out", default="asap-demo-out", help="directory for demo.json and the plots")
    p.add_argument("--quick", action="store_true", help="tiny model, few requests (seconds; for tests)")
    p.add_argument("--num-requests", type=int, help="override the calibrated number of requests")
    p.add_argument("--rate", type=float, help="override the calibrated request rate (req/s)")
    p.add_argument("--slo-ttft-s", type=float, help="override the calibrated TTFT SLO (s)")
    p.add_argument("--trace", help="Mooncake trace (default: $ASAP_TRACES or ../shared/traces)")
    p.add_argument("--progress", action="store_true", help="show a progress bar per run")
    p.set_defaults(func=run)


def demo_workload(s: DemoSettings, trace: str | None, vocab_size: int) -> tuple[Workload, str]:
    """The Mooncake-shaped workload (no rate, no SLO yet); without the trace file, a synthetic look-alike."""
    common = dict(num_requests=s.max_requests, length_scale=s.length_scale, max_tokens=s.max_tokens,
                  min_tokens=16, vocab_size=vocab_size)
    path = Path(trace) if trace else default_trace()
    if path.is_file():
        return Workload(trace=path, **common), f"Mooncake trace {path.name}"
    print(f"[demo] {path} not found: Poisson arrivals and log-normal lengths (mean 12k tokens, like Mooncake) "
          f"instead", file=sys.stderr)
    return Workload(arrivals=Poisson(1.0), lengths=LogNormal(12035, 1.0), **common), "synthetic Mooncake look-alike"


def count_for(lengths: list[int], tokens: float, lo: int, hi: int) -> int:
    """How many of the first requests fit in `tokens` prompt tokens, within [lo, hi]."""
    n = int(np.searchsorted(np.cumsum(lengths), tokens, side="right"))
    return max(lo, min(hi, n))


def log(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def calibrate(sync: EngineTarget, s: DemoSettings, base: Workload, args) -> tuple[Workload, dict]:
    """Time a lone max_tokens prompt on the idle sync engine (the baseline); size the rate and the SLO by it."""
    lengths = [r.num_tokens for r in base.build()]
    t_ref = sync.prefill_seconds(s.max_tokens)
    lone = s.max_tokens / t_ref
    n = args.num_requests or count_for(lengths, s.load * lone * s.duration_s, MIN_REQUESTS, s.max_requests)
    # offered load = s.load x the lone rate, also when n hit a bound (the span then moves off duration_s)
    rate = args.rate or (n - 1) * s.load * lone / sum(lengths[:n])
    workload = replace(base, num_requests=n, rate=rate, slo_ttft_s=args.slo_ttft_s or s.slo_scale * t_ref)
    return workload, dict(lone_prompt_s=t_ref, lone_tokens_per_s=lone, rate=rate, slo_s=workload.slo_ttft_s)


def report(s: DemoSettings, workload: Workload, source: str, calib: dict, records: list[dict]) -> None:
    tokens = [r.num_tokens for r in workload.build()]
    print(f"asap demo: {s.model}, REAL compute on this CPU; sync = 2 ranks (DP attention + EP experts), "
          f"async = 1 attention replica + 1 expert worker")
    print(f"workload: {len(tokens)} requests, the first of the {source}; arrivals rescaled to "
          f"{workload.rate:.2f} req/s, prompts x{s.length_scale:g} clipped to [16, {s.max_tokens}] tokens "
          f"(mean {np.mean(tokens):.0f}, max {max(tokens)})")
    print(f"calibration: a lone {s.max_tokens}-token prompt takes {calib['lone_prompt_s']:.2f} s on the idle sync "
          f"engine ({calib['lone_tokens_per_s']:.0f} tokens/s); the offered load is {s.load:g} x that rate")
    print(f"SLO: {describe_slo(workload)} for every request (our choice: {s.slo_scale:g} x that lone prompt's "
          f"TTFT, the simulator's rule)\n")
    print(summary_text(records))
    cores = os.cpu_count()
    busy = max(r["load_avg_1min"] for r in records) > 2 * cores
    print(f"\nCPU load average (1 min) at the end of each run: "
          + ", ".join(f"{r['target']} {r['load_avg_1min']:.1f}" for r in records) + f" on {cores} cores"
          + (" -- other processes competed for the CPU: compare with care" if busy else ""))


def run(args) -> int:
    t_start = time.monotonic()
    s = QUICK if args.quick else DEMO
    from asap.model.materialize import resolve_model
    log(f"model {s.model} (materialised on first use)")
    model_dir = str(resolve_model(s.model))
    t_model = time.monotonic() - t_start
    base, source = demo_workload(s, args.trace, ModelConfig.from_dir(model_dir).vocab_size)
    runtime = RuntimeConfig(attention_workers=1, expert_workers=1, devices=2, token_budget=s.token_budget)

    records, runs, workload, calib = [], [], None, {}
    for engine in ("sync", "async"):
        log(f"{engine}: starting workers")
        target = EngineTarget(engine, model_dir, runtime, progress=args.progress)
        try:
            if workload is None:
                workload, calib = calibrate(target, s, base, args)
            log(f"{engine}: {workload.num_requests} requests over {(workload.num_requests - 1) / workload.rate:.0f} s")
            r = measure(target, workload)
        finally:
            target.close()
        records.append(record_of(r, workload, target=engine, startup_s=target.startup_s,
                                 load_avg_1min=os.getloadavg()[0]))
        runs.append(r)

    report(s, workload, source, calib, records)
    out = Path(args.out)
    paths = write_plots(out, runs, {}, workload.slo_ttft_s)
    wall = time.monotonic() - t_start
    for rec in records:
        rec.update(model=s.model, workload=source, calibration=calib, model_ready_s=t_model, demo_wall_s=wall)
    write_json(out / "demo.json", records)
    print(f"\nwrote {out / 'demo.json'} and {len(paths)} plot/trace files to {out}/")
    print(f"wall time {wall:.0f} s (model ready {t_model:.0f} s; "
          + "; ".join(f"{r['target']}: start-up {r['startup_s']:.1f} s + run {r['wall_s']:.1f} s" for r in records)
          + ")")
    return 0
