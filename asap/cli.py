"""The `asap` command. Each sub-command lives beside the code it drives and registers itself here."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys

# module -> it defines `register(subparsers)`; each parser sets `func(args) -> int`.
COMMANDS = [
    "asap.model.cli",        # make-model
    "asap.bench.cli",        # bench
    "asap.demo.cli",         # demo
    "asap.workers.remote",   # expert-worker (remote experts under torchrun)
    "asap.scheduler.cli",    # plan, ablation
    "asap.sim.cli",          # sim, profile
    "asap.server.cli",       # serve
]


def add_config_flags(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """One flag per field of a config dataclass, with the field's help: the CLI cannot drift from the config."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = (f.metadata.get("help") or "").replace("%", "%%")   # argparse formats help with %
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
        else:
            typ = {"int": int, "float": float, "str": str}.get(str(f.type), str)
            parser.add_argument(flag, type=typ, default=f.default, help=help_text + " (default: %(default)s)")


def config_from_args(cls, args, **extra):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names}, **extra)


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
