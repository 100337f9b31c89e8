"""`asap sim {headline,explain,bound,calibrate,speed,trace,validate}` and `asap profile`.

The sim sub-commands are asap/studies/__main__.py's (`python -m asap.studies`); validate comes from the bench layer
above, passed in by asap/cli.py."""
from __future__ import annotations

import argparse


def register(sub, extra=()):
    from asap.studies.__main__ import add_commands, run_command
    p = sub.add_parser("sim", help="the discrete-event simulator: headline, explain, bound, calibrate, speed, trace, validate",
                       description="The discrete-event simulator (every figure it prints is SIMULATED; validate "
                                   "also runs EMULATED and REAL). `asap sim COMMAND --help` gives each command's "
                                   "run time.")
    add_commands(p.add_subparsers(dest="cmd", required=True), extra)
    p.set_defaults(func=run_command)

    q = sub.add_parser("profile", help="measure this CPU's kernels and shm link; write the calibrated cpu profile",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Time the model's real kernels per cost-model op, fit each op's rates, measure "
                                   "the shared-memory link, and write a hardware profile that get_hardware('cpu') "
                                   "prefers (the emulated runtime's and the simulator's default). About 30 s on "
                                   "two cores.")
    q.add_argument("--model", default="small-deepseek-v3", help="preset name or HF model directory")
    q.add_argument("--out", default=None, help="profile JSON (default: $ASAP_CACHE/profiles/cpu.json, "
                                               "ASAP_CACHE defaulting to ~/.cache/asap)")
    q.add_argument("--threads", type=int, default=1,
                   help="torch threads, as RuntimeConfig.threads_per_worker (default: %(default)s)")
    q.add_argument("--repeats", type=int, default=None, help="timed rounds over every kernel (default: 4)")
    q.add_argument("--statistic", choices=["min", "median"], default="min",
                   help="per kernel: the fastest call (the machine unloaded) or the median (as loaded as now) "
                        "(default: %(default)s)")
    q.set_defaults(func=run_profile)


def run_profile(args) -> int:
    import dataclasses

    from asap.studies.profile import Sizes, profile
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    sizes = Sizes() if args.repeats is None else dataclasses.replace(Sizes(), repeats=args.repeats)
    hw, report, path = profile(args.model, args.out, args.threads, sizes, args.statistic)
    print(format_report(hw, report))
    print(f"wrote {path} in {report['seconds']:.0f} s"
          + ("" if args.out else '; get_hardware("cpu") now loads it (calibrated)'))
    return 0


def format_report(hw, report: dict) -> str:
    """Measured vs fitted per sample and per op, the whole-stage check, and the link."""
    lines = [f"\n{'op':<14}{'sample':<40}{'measured ms':>12}{'fitted ms':>11}{'error':>8}",
             "(elementwise: what a whole stage leaves over after its other ops; error as a share of that stage)"]
    for op, r in report["ops"].items():
        for s in r["samples"]:
            err = f"{(s['fitted_s'] - s['measured_s']) / s['reference_s']:>+8.0%}"
            lines.append(f"{op:<14}{s['label'][:39]:<40}{s['measured_s'] * 1e3:>12.3f}"
                         f"{s['fitted_s'] * 1e3:>11.3f}{err}")
    lines.append(f"\n{'op':<14}{'GFLOP/s':>10}{'GB/s':>10}{'overhead us':>13}{'form':>6}{'error':>8}"
                 "   (error: sum |fitted - measured| / sum measured;")
    lines.append(f"{'':<61}elementwise: / sum of its whole stages)")
    for op, rate in hw.ops.items():
        e = report["ops"][op]["error"]
        lines.append(f"{op:<14}{_giga(rate.flops_per_s):>10}{_giga(rate.bytes_per_s):>10}{rate.overhead_s * 1e6:>13.1f}"
                     f"{'max' if rate.overlap else 'sum':>6}{'-' if e is None else f'{e:.1%}':>8}")
    lines.append(f"\n{'whole attention stage (one layer)':<54}{'measured ms':>12}{'model ms':>11}{'error':>8}")
    for s in report["stages"]:
        lines.append(f"{s['label'][:53]:<54}{s['measured_s'] * 1e3:>12.3f}{s['predicted_s'] * 1e3:>11.3f}"
                     f"{s['predicted_s'] / s['measured_s'] - 1:>+8.0%}")
    ln = hw.link
    lines.append(f"\nshm link: {ln.latency_s * 1e6:.1f} us one way, {ln.intra_bytes_per_s / 1e9:.2f} GB/s")
    return "\n".join(lines)


def _giga(x: float) -> str:
    return "unused" if x > 1e20 else f"{x / 1e9:.1f}"
