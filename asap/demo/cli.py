"""`asap demo`: REAL exactness, an EMULATED 24-device DeepSeek-V3 cluster, the SIMULATED headline case.

About 3 minutes on two quiet cores, 4-5 loaded (the emulated part's dilation rises with the load);
`--quick`, for tests, 1-3 minutes. Progress goes to stderr.
Prints three labelled parts and a summary whose verdict is computed from this run's numbers, and
writes demo.json (everything), demo.png (TTFT CDFs and worker timelines of the emulated runs) and
per-engine timelines/Chrome traces into --out. On a loaded machine the EMULATED part raises its
dilation (up to 2x, so it takes longer) and flags its figures when that does not cover the load
(asap/demo/load.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

from asap.measure.report import write_chrome_trace
from asap.demo.emulated import format_emulated, run_emulated
from asap.demo.real import format_real, run_real
from asap.demo.report import summary_lines
from asap.demo.settings import FULL, QUICK
from asap.demo.simulated import format_simulated, run_simulated

RULE = "=" * 100


def register(sub):
    p = sub.add_parser("demo", help="exact on this CPU, then async vs sync on an emulated and a simulated "
                                    "DeepSeek-V3 cluster (~3 minutes; 4-5 on a loaded machine)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="asap-demo-out", help="directory for demo.json and the plots")
    p.add_argument("--quick", action="store_true", help="fewer devices and requests (for tests; 2-4 minutes)")
    p.add_argument("--retune", action="store_true",
                   help="rerun the emulated cluster's configuration search (asap/demo/tuning.py, ~10 minutes with --jobs 2) "
                        "instead of reading asap/demo/tuned.json (the headline case's: python -m asap.demo.tuning)")
    p.set_defaults(func=run)


def log(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def section(title: str, lines: list[str]) -> None:
    print(f"\n{RULE}\n{title}\n{RULE}")
    print("\n".join(lines), flush=True)


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _plain(x):
    import numpy as np
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def run(args) -> int:
    # A warning is a figure or a note of the run, never a raw line with a file path: the EMULATED part turns the
    # replay's lag into a figure (emulated.py); any other warning is printed once, as a note, at the end.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        code = _run(args)
    for w in caught:
        print(f"note: {w.category.__name__}: {w.message}")
    return code


def _run(args) -> int:
    t0 = time.monotonic()
    s = QUICK if args.quick else FULL
    out = Path(args.out)
    print(f"asap demo{' --quick' if args.quick else ''}: three parts, each labelled with how its figures were "
          f"obtained (REAL = measured on this CPU; EMULATED = measured with real processes and messages, compute "
          f"timed by the cost model; SIMULATED = the discrete-event simulator)", flush=True)

    real = run_real(s, log)
    section("1. REAL: exactness on this CPU (real weights, real compute)", format_real(real))

    emulated, runs = run_emulated(s, log, args.retune)
    section(f"2. EMULATED: DeepSeek-V3 on {s.devices} CloudMatrix384-like dies, async vs sync", format_emulated(emulated))

    simulated = run_simulated(s, emulated, log)
    section(f"3. SIMULATED: the emulated run replayed, and the headline case on {s.sim_devices} dies",
            format_simulated(simulated, emulated))

    section("SUMMARY", summary_lines(real, emulated, simulated))

    from asap.bench.plots import plot_demo, plot_timeline
    out.mkdir(parents=True, exist_ok=True)
    d = emulated["dilation"]
    plot_demo({r.label: (r.results, r.spans) for r in runs}, out / "demo.png",
              f"EMULATED: DeepSeek-V3 on {s.devices} CloudMatrix384-like dies, {emulated['num_requests']} Mooncake-"
              f"length requests at {s.rate:g} req/s (TTFT in emulated-hardware time)"
              + (" - FLAGGED: CPU contended" if emulated.get("flag") else ""),
              time_label=f"wall time (s) of the run; emulated-hardware time = wall time / {d:g}")
    for r in runs:
        name = r.label.split()[0]
        if r.spans:
            plot_timeline(r.spans, out / f"timeline_{name}.png")
            write_chrome_trace(r.spans, out / f"trace_{name}.json")
    wall = time.monotonic() - t0
    doc = {"commit": commit(), "quick": args.quick, "wall_s": wall, "real": real, "emulated": emulated,
           "simulated": simulated, "summary": summary_lines(real, emulated, simulated),
           "emulated_results": {r.label: [vars(x) for x in r.results] for r in runs}}
    (out / "demo.json").write_text(json.dumps(doc, indent=1, default=_plain) + "\n")
    print(f"\nwrote {out / 'demo.json'}, {out / 'demo.png'} and the timelines/traces to {out}/; "
          f"wall time {wall:.0f} s (REAL {real['wall_s']:.0f} s, EMULATED {emulated['wall_s']:.0f} s, "
          f"SIMULATED {simulated['wall_s']:.0f} s)")
    return 0
