"""`asap demo`: the sync DP+EP baseline and the async engine side by side, on this CPU, real compute.

Both engines get 2 devices (worker processes of one thread each): sync = 2
ranks, async = 1 attention replica + 1 expert worker. They run the same
requests: the first requests of the Mooncake conversation trace, arrivals
rescaled to a rate this CPU can serve and prompts scaled down (see DEMO).
Prints the comparison table, writes JSON and plots into --out.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from asap.bench.cli import describe_slo, measure, record_of, summary_text, write_plots
from asap.bench.report import write_json
from asap.bench.targets import EngineTarget, default_trace
from asap.config import RuntimeConfig
from asap.workload import LogNormal, Poisson, Workload


@dataclass(frozen=True)
class DemoSettings:
    model: str
    num_requests: int
    rate: float             # req/s: the trace's arrivals rescaled to this mean rate
    length_scale: float     # Mooncake prompts (mean ~12k tokens) shrunk to CPU size ...
    max_tokens: int         # ... and clipped
    slo_ttft_s: float
    token_budget: int = 1024


# Chosen so a 2-core CPU is loaded but not swamped, and the whole demo fits in about 3 minutes.
DEMO = DemoSettings("small-deepseek-v3", num_requests=24, rate=0.4, length_scale=1 / 32, max_tokens=1024,
                    slo_ttft_s=8.0)
QUICK = DemoSettings("tiny-deepseek-v3", num_requests=8, rate=8.0, length_scale=1 / 32, max_tokens=512,
                     slo_ttft_s=2.0, token_budget=512)


def register(sub):
    p = sub.add_parser("demo", help="sync vs async side by side on this CPU (real compute, ~3 minutes)",
                       description=__doc__)
    p.add_argument("--out", default="asap-demo-out", help="directory for demo.json and the plots")
    p.add_argument("--quick", action="store_true", help="tiny model, few requests (seconds; for tests)")
    p.add_argument("--num-requests", type=int, help="override the number of requests")
    p.add_argument("--rate", type=float, help="override the request rate (req/s)")
    p.add_argument("--slo-ttft-s", type=float, help="override the TTFT SLO (s)")
    p.add_argument("--trace", help="Mooncake trace (default: $ASAP_TRACES or ../shared/traces)")
    p.add_argument("--progress", action="store_true", help="show a progress bar per run")
    p.set_defaults(func=run)


def demo_workload(s: DemoSettings, trace: str | None, vocab_size: int) -> tuple[Workload, str]:
    """The Mooncake-shaped workload; without the trace file, Poisson arrivals and log-normal lengths alike."""
    common = dict(num_requests=s.num_requests, rate=s.rate, length_scale=s.length_scale, max_tokens=s.max_tokens,
                  min_tokens=16, slo_ttft_s=s.slo_ttft_s, vocab_size=vocab_size)
    path = Path(trace) if trace else default_trace()
    if path.is_file():
        return Workload(trace=path, **common), f"Mooncake trace {path.name}"
    print(f"[demo] {path} not found: using Poisson arrivals and log-normal lengths (mean 12k tokens, "
          f"Mooncake-like) instead", file=sys.stderr)
    return Workload(arrivals=Poisson(s.rate), lengths=LogNormal(12035, 1.0), **common), "synthetic, Mooncake-like"


def run(args) -> int:
    t_start = time.monotonic()
    s = QUICK if args.quick else DEMO
    s = replace(s, num_requests=args.num_requests or s.num_requests, rate=args.rate or s.rate,
                slo_ttft_s=args.slo_ttft_s or s.slo_ttft_s)
    from asap.model.materialize import resolve_model
    print(f"[demo] model {s.model} (materialised on first use)", file=sys.stderr, flush=True)
    model_dir = str(resolve_model(s.model))
    t_model = time.monotonic() - t_start
    from asap.config import ModelConfig
    workload, source = demo_workload(s, args.trace, ModelConfig.from_dir(model_dir).vocab_size)
    requests = workload.build()
    runtime = RuntimeConfig(attention_workers=1, expert_workers=1, devices=2, token_budget=s.token_budget)

    records, runs = [], []
    for engine in ("sync", "async"):
        print(f"[demo] {engine}: starting workers", file=sys.stderr, flush=True)
        target = EngineTarget(engine, model_dir, runtime, progress=args.progress)
        try:
            print(f"[demo] {engine}: {len(requests)} requests over ~{requests[-1].arrival:.0f} s",
                  file=sys.stderr, flush=True)
            r = measure(target, workload)
        finally:
            target.close()
        records.append(record_of(r, workload, target=engine, startup_s=target.startup_s))
        runs.append(r)

    tokens = [q.num_tokens for q in requests]
    print(f"asap demo: {s.model}, real compute on this CPU; sync 2 ranks vs async 1 attention + 1 expert worker")
    print(f"workload: {len(requests)} requests from the {source}, arrivals rescaled to {s.rate:g} req/s, prompts "
          f"x{s.length_scale:g} clipped to [16, {s.max_tokens}] (mean {sum(tokens) / len(tokens):.0f}, "
          f"max {max(tokens)} tokens)")
    print(f"SLO: {describe_slo(workload)} for every request (our choice: a few times the time a lone "
          f"{s.max_tokens}-token prompt takes here)\n")
    print(summary_text(records))
    out = Path(args.out)
    paths = write_plots(out, runs, {}, s.slo_ttft_s)
    wall = time.monotonic() - t_start
    for rec in records:
        rec.update(model=s.model, workload=source, demo_wall_s=wall, model_ready_s=t_model)
    write_json(out / "demo.json", records)
    print(f"\nwrote {out / 'demo.json'} and {len(paths)} plot/trace files to {out}/")
    print(f"wall time {wall:.0f} s (model ready {t_model:.0f} s, "
          + ", ".join(f"{r['target']}: start-up {r['startup_s']:.0f} s + run {r['wall_s']:.0f} s" for r in records)
          + ")")
    return 0
