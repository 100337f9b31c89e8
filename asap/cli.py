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
# Sub-commands of a lower package's command that live in a package above it (importing them from there would
# point the tree upward): module -> [modules whose add_parser(subparsers) joins its command].
EXTRA = {"asap.sim.cli": ["asap.bench.validate"]}       # `asap sim validate` drives bench targets


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asap", description="Disaggregated, asynchronous MoE prefill serving")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        extra = [importlib.import_module(m).add_parser for m in EXTRA.get(mod, ())]
        if extra:
            module.register(sub, extra)
        else:
            module.register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"asap {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
