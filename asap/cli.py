"""The `asap` command. Each sub-command lives beside the code it drives and registers itself here."""
from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

# The flag helpers live with the configs (below every package that builds a parser); re-exported.
from asap.config import add_config_flags, config_from_args  # noqa: F401

# module -> it defines `register(subparsers)`; each parser sets `func(args) -> int`.
COMMANDS = [
    "asap.model.cli",        # make-model
    "asap.bench.cli",        # bench
    "asap.demo.cli",         # demo
    "asap.workers.remote",   # expert-worker (remote experts under torchrun)
    "asap.bench.plan_cli",   # plan, ablation
    "asap.studies.cli",          # sim, profile
    "asap.server.cli",       # serve
]
# Sub-commands of a lower package's command that live in a package above it (importing them from there would
# point the tree upward): module -> [modules whose add_parser(subparsers) joins its command].
EXTRA = {"asap.studies.cli": ["asap.bench.validate"]}       # `asap sim validate` drives bench targets


DESCRIPTION = """ASAP: disaggregated, asynchronous prefill serving for Mixture-of-Experts LLMs.

Attention and experts run on separate workers, and dispatch/combine are asynchronous, so no MoE layer
waits on a cluster-wide barrier. Start with `asap demo` (about 3 minutes on 2 cores). `asap COMMAND --help`
describes each command, its flags and their defaults, and how long it typically takes."""


def package_version() -> str:
    try:
        return version("asap-prefill")
    except PackageNotFoundError:        # run from a source tree that was never installed
        from asap import __version__
        return __version__ + " (not installed)"


class _ShowDefaults(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help unless the help already speaks of its default, or there is
    none to show (None, False, a suppressed one), so no default prints twice."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default is None or action.default is argparse.SUPPRESS \
                or not action.option_strings or isinstance(action, (argparse._StoreTrueAction,
                                                                    argparse._VersionAction)):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every command's help shows its defaults, keeping the formatter its description was written for."""
    cls = parser.formatter_class
    if not issubclass(cls, _ShowDefaults):
        parser.formatter_class = type(f"Defaults{cls.__name__}", (_ShowDefaults, cls), {})
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in set(action.choices.values()):
                show_defaults(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asap", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()} (asap-prefill)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
    show_defaults(parser)
    return parser


def commands(p: argparse.ArgumentParser, name: str = "asap"):
    """(name, parser) of a parser and every sub-command under it, depth first: 'asap', 'asap sim', ..."""
    yield name, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub_name, sub in a.choices.items():
                yield from commands(sub, f"{name} {sub_name}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"asap {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
