"""The flags that widen both engines' search alike, shared by `asap sim headline` and `asap plan --tune`:
--fleet-fractions, --orders and --lanes (asap.studies.space)."""
from __future__ import annotations

import argparse

from asap.scheduler.replica import ORDERS
from asap.studies.space import FLEET_FRACTIONS, QUEUE_ORDERS


def lane(text: str) -> tuple[int, int]:
    """--lanes N:TOKENS -> (N, TOKENS)."""
    try:
        n, below = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a lane is N:TOKENS (e.g. 1:4096), got {text!r}") from None
    if n < 1 or below < 1:
        raise argparse.ArgumentTypeError(f"a lane needs N >= 1 and TOKENS >= 1, got {text!r}")
    return n, below


def add_search_flags(p: argparse.ArgumentParser, when: str = "") -> None:
    """Add --fleet-fractions, --orders and --lanes to `p`; `when` prefixes each help (e.g. "--tune: ")."""
    p.add_argument("--fleet-fractions", type=float, nargs="+", default=list(FLEET_FRACTIONS), metavar="F",
                   help=when + "the wide group's shares of an instance that both engines' length-aware fleets try "
                        "(default 0.5; e.g. 0.25 0.5 0.625 0.75: a sync deployment too small for the weights "
                        "is left out)")
    p.add_argument("--orders", nargs="+", default=list(QUEUE_ORDERS), choices=ORDERS, metavar="ORDER",
                   help=when + "the queue orders of a replica / DP group both engines' candidates try, a secondary "
                        f"knob (default fcfs; of {', '.join(ORDERS)}: sjf / edf are what vLLM's priority scheduling "
                        "gives with the prompt length / deadline as the priority; srpt / edf-preempt also pause a "
                        "started prompt at a chunk boundary)")
    p.add_argument("--lanes", nargs="+", default=[], type=lane, metavar="N:TOKENS",
                   help=when + "short-prompt lanes both engines' candidates try, a secondary knob: N replicas "
                        "(async) / DP groups (sync, a deployment of its own in a length-aware fleet) that take only "
                        "prompts under TOKENS (e.g. 1:4096 2:4096; default none)")

