"""The `asap` command. Each sub-command lives beside the code it drives and registers itself here."""
from __future__ import annotations

import argparse
import importlib
import sys

# The flag helpers live with the configs (below every package that builds a parser); re-exported.
from asap.config import add_config_flags, config_from_args  # noqa: F401

# module -> it defines `register(subparsers)`; each parser sets `func(args) -> int`.
COMMANDS = [
    "asap.model.cli",        # make-model
    "asap.bench.cli",        # bench
    "asap.demo.cli",         # demo
    "asap.workers.remote",   # expert-worker (remote experts under torchrun)
    "asap.bench.plan_cli",   # plan, ablation
    "asap.sim.cli",          # sim, profile
    "asap.server.cli",       # serve
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="asap", description="Disaggregated, asynchronous MoE prefill serving")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        try:
            importlib.import_module(mod).register(sub)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"asap {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
