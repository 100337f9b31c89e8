"""`python -m asap.studies {headline,calibrate,speed,trace} ...`, also `asap sim ...`.

Every figure printed is SIMULATED. `asap sim validate` (EMULATED and REAL runs beside the simulator) drives
bench targets, so it lives in asap/bench/validate.py and the `asap` command adds it here (asap/cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asap.studies import parallel
from asap.studies.calibrate import calibrate
from asap.studies.experiments import TRACE, at_rate, trace_requests
from asap.studies.headline import DEFAULT_SLO, NUM_REQUESTS, WORKLOADS, run_headline
from asap.studies.search_flags import add_search_flags
from asap.sim.run import run
from asap.sim.trace_export import write_trace
from asap.workload.slo import add_slo_flag


def speed(num_requests: int = 10000, devices: int = 384, engine: str = "async", model="deepseek-v3",
          hardware="cloudmatrix384", tokens_per_device_s: float = 4000.0, trace=TRACE) -> dict:
    """Wall time of one run: the trace's first requests, offered at `tokens_per_device_s` per device.
    cpu_s (this process's CPU time) is the figure to compare on a shared machine; ttft_sha256 is a hash of
    every TTFT's bits, so two versions' runs can be checked for the same results."""
    import hashlib
    import struct
    import time
    base = trace_requests(trace, num_requests)
    rate = devices * tokens_per_device_s / (sum(r.num_tokens for r in base) / len(base))
    t, cpu = time.perf_counter(), time.process_time()
    res = run(at_rate(base, rate), engine, model, hardware, devices)
    total, cpu = time.perf_counter() - t, time.process_time() - cpu
    ttfts = [float("nan") if r.ttft is None else r.ttft for r in res.results]
    digest = hashlib.sha256(struct.pack(f"<{len(ttfts)}d", *ttfts)).hexdigest()[:16]
    out = {"engine": engine, "devices": devices, "num_requests": len(base), "rate": rate, "num_events": res.num_events,
           "loop_s": res.wall_s, "total_s": total, "cpu_s": cpu, "events_per_s": res.events_per_s,
           "attention_workers": res.attention_workers, "ttft_sha256": digest}
    print(f"[SIMULATED] {engine} {model} x{devices} {hardware}: {len(base)} requests, {res.num_events} events in "
          f"{res.wall_s:.1f} s loop / {total:.1f} s total ({cpu:.1f} s CPU) -> {res.events_per_s:.0f} events/s; "
          f"TTFTs sha256 {digest}")
    return out


def trace(out: str, engine: str, devices: int, rate: float, start: float, length: float, num_requests: int,
          model="deepseek-v3", hardware="cloudmatrix384") -> Path:
    reqs = at_rate(trace_requests(TRACE, num_requests), rate)
    res = run(reqs, engine, model, hardware, devices, trace_window=(start, start + length))
    path = write_trace(res.spans, out)
    print(f"[SIMULATED] wrote {len(res.spans)} spans of {engine} x{devices} [{start}, {start + length}] s to {path}")
    return path


def add_commands(sub, extra=()) -> None:
    """headline, calibrate, speed and trace, for `python -m asap.studies` and `asap sim`; `extra`: more
    add_parser(sub) functions from the layers above, whose parsers set `run` (asap/cli.py)."""
    h = sub.add_parser("headline", help="best-tuned sync vs best-tuned async SLO-compliant throughput "
                                        "(SIMULATED; tens of minutes per row)",
                       description="SIMULATED. For each workload and device count, tune both engines (every "
                                   "candidate configuration gets a rate search) and report each one's highest "
                                   "SLO-compliant rate and their ratio; writes headline.json and headline.png "
                                   "into --out, and headline.partial.json after each row (see --resume). Run "
                                   "time on two cores with --jobs 2: the conversation row at 32 dies took 20 "
                                   "minutes, the 64- and 128-die rows resumed from it (--resume) 18 minutes "
                                   "together, so the default grid of 12 rows takes hours. Start with one row: "
                                   "--workloads conversation --devices 32.")
    h.add_argument("--devices", type=int, nargs="+", default=[32, 64, 128, 384],
                   help="device counts, one row each (later rows start their search from the row before)")
    h.add_argument("--workloads", nargs="+", default=list(WORKLOADS),
                   help="names of asap.workload.presets or Mooncake .jsonl / Azure .csv paths")
    h.add_argument("--num-requests", type=int, default=None,
                   help="requests each row samples (each search uses as few as the burst rule allows); default: "
                        f"per row, enough for a steady state at its devices' work ceiling, at least {NUM_REQUESTS} "
                        "(fixed 4K prompts: 3,000 at 32 dies, 11,500 at 128; conversation: 1,500 at 32, 9,500 at 384)")
    h.add_argument("--model", default="deepseek-v3", help="model preset (its published config)")
    h.add_argument("--hardware", default="cloudmatrix384", help="hardware profile (asap/sim/profiles)")
    add_slo_flag(h, DEFAULT_SLO)
    h.add_argument("--slo-scales", type=float, nargs="+", default=[0.5, 1.0, 2.0],
                   help="at the first device count, also rerun the best configurations with the SLO scaled by "
                        "these factors")
    h.add_argument("--out", default="out/sim_headline", help="directory for headline.json and headline.png")
    h.add_argument("--resume", default=None, metavar="JSON",
                   help="continue an earlier headline(.partial).json from its last row per workload to --devices")
    h.add_argument("--prefix-cache", action="store_true",
                   help="both engines get a prefix cache per replica / DP group (LRU over the traces' 512-token "
                        "block hashes, capacity from the memory left after weights); off by default")
    add_search_flags(h)
    h.add_argument("--sustained", action="store_true",
                   help="a rate passes only if the run also drains within its longest TTFT budget after its last "
                        "arrival and meets the target in each third of the run by arrival, so no rate passes on a "
                        "queue that grows until the run ends; each engine's maxima are then confirmed on twice "
                        "the row's requests, the same requests for both (off by default, which keeps the stored "
                        "results' rule)")
    h.add_argument("--vet", action=argparse.BooleanOptionalAction, default=None,
                   help="with --sustained (on by default there; --no-vet: the older rule, of the rows stored without "
                        "it): re-rank the screen's leading candidates (and the secondary variants of the "
                        "best four of them) on the longer sample each maximum is confirmed on, raising the rate for "
                        "those that tie at its top, before choosing the finalists; search each finalist on that "
                        "sample and confirm it as --sustained does (the short screen can rank a fleet whose "
                        "long-prompt queue grows slowly first); the same for both engines")
    h.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="instead: merge the headline.json of runs over other workloads into --out")
    parallel.add_arguments(h)
    c = sub.add_parser("calibrate", help="sync DeepSeek-V3 vs every published prefill figure, and the TBO gain",
                       description="SIMULATED. The cost model's sync DeepSeek-V3 against each published prefill "
                                   "throughput figure it is calibrated on, with the error of each, and the "
                                   "two-batch-overlap gain. A few seconds on two cores.")
    c.add_argument("--hardware", default="h800", help="hardware profile of the published figures")
    c.add_argument("--json", default=None, help="also write the comparison as JSON to this file")
    s = sub.add_parser("speed", help="events/s for 10k trace requests at 384 devices",
                       description="The simulator's own speed: one run of the trace's first requests, offered at "
                                   "4,000 tokens/s per device; prints events, wall and CPU time, events/s and a "
                                   "hash of every TTFT (to check two versions give the same results). About "
                                   "20 s on two cores with the defaults.")
    s.add_argument("--num-requests", type=int, default=10000, help="requests from the Mooncake sample")
    s.add_argument("--devices", type=int, default=384, help="devices of the simulated cluster")
    s.add_argument("--engine", default="async", choices=["async", "sync"], help="engine to simulate")
    t = sub.add_parser("trace", help="Chrome/Perfetto trace of a time window",
                       description="SIMULATED. Run the Mooncake sample's first requests at --rate and write every "
                                   "worker span inside [--start, --start + --length] s as a Chrome trace (open it "
                                   "in ui.perfetto.dev). A few seconds with the defaults.")
    t.add_argument("--engine", default="async", choices=["async", "sync"], help="engine to simulate")
    t.add_argument("--devices", type=int, default=32, help="devices of the simulated cluster")
    t.add_argument("--rate", type=float, default=2.0, help="requests/s")
    t.add_argument("--start", type=float, default=20.0, help="start of the window (simulated s)")
    t.add_argument("--length", type=float, default=1.0, help="length of the window (simulated s)")
    t.add_argument("--num-requests", type=int, default=200, help="requests from the Mooncake sample")
    t.add_argument("--out", default="out/sim_trace.json", help="the trace file to write")
    from asap.studies.explain import add_parser as add_explain     # sets its own run
    add_explain(sub)
    from asap.studies.bound import add_parser as add_bound         # sets its own run
    add_bound(sub)
    for add in extra:
        add(sub)


def run_command(a) -> int:
    if getattr(a, "run", None) is not None:      # a command added by a layer above
        return a.run(a)
    if a.cmd == "headline":
        if a.merge:
            from asap.studies.headline_output import format_row, merge_headlines
            merged = merge_headlines(a.merge, a.out)
            for row in merged["rows"]:
                print(format_row(row))
        else:
            _check_devices(a.devices)
            _check_out_dir(a.out)
            if a.vet and not a.sustained:
                raise ValueError("--vet re-ranks on the sample --sustained confirms on: give --sustained too")
            vet = a.sustained if a.vet is None else a.vet
            if a.num_requests is not None and a.num_requests < 2:
                raise ValueError(f"--num-requests must be >= 2 (or left out: sized per row), got {a.num_requests}")
            resume = json.loads(Path(a.resume).read_text()) if a.resume else None
            with parallel.from_args(a) as executor:
                run_headline(a.devices, a.workloads, a.slo, a.slo_scales, a.model, a.hardware, a.num_requests,
                             a.out, resume=resume, prefix_cache=a.prefix_cache, executor=executor,
                             fleet_fractions=tuple(a.fleet_fractions), sustained=a.sustained, vet=vet,
                             orders=tuple(a.orders), lanes=tuple(a.lanes))
        print(f"[SIMULATED] wrote {Path(a.out) / 'headline.json'} and headline.png")
    elif a.cmd == "calibrate":
        out = calibrate(hardware=a.hardware)
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    elif a.cmd == "speed":
        speed(a.num_requests, a.devices, a.engine)
    elif a.cmd == "trace":
        if not (a.rate > 0 and a.length > 0 and a.start >= 0):
            raise ValueError(f"trace needs --rate > 0, --length > 0 and --start >= 0, got --rate {a.rate:g} "
                             f"--length {a.length:g} --start {a.start:g}")
        trace(a.out, a.engine, a.devices, a.rate, a.start, a.length, a.num_requests)
    return 0


def _check_devices(counts: list[int]) -> None:
    """headline's device counts: each a cluster of >= 2 devices, each once."""
    if any(n < 2 for n in counts) or len(set(counts)) != len(counts):
        raise ValueError("--devices takes distinct device counts >= 2 (one row each), got "
                         + " ".join(map(str, counts)))


def _check_out_dir(out: str) -> None:
    """Fail before hours of tuning, not after: --out must be a directory this process can write."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".asap-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write there ({e.strerror or e})") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asap.studies", description=__doc__)
    add_commands(p.add_subparsers(dest="cmd", required=True))
    return run_command(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
