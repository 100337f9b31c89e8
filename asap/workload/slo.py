"""TTFT SLOs: the one SLO type and the one `--slo` syntax of every command (bench, plan, ablation,
sim headline, sim explain).

One budget per request, the same for every engine, as peers define it:
- fixed:             vLLM's `--goodput ttft:MS`: every request has MS milliseconds;
- fixed + per token: budget = fixed_s + per_token_s x prompt tokens, the SUM of the two parts (a base
                     plus a per-token term: long prompts get the time their prefill needs, short ones
                     still have a fixed part to queue in).
Spec strings (SLO_SYNTAX): "5s", "5000ms", "ttft:5000" (vLLM's form, ms), "2s+0.2ms/tok", "0.5ms/tok",
and, only where a command knows the model and cluster (asap plan, asap ablation), "5x": 5 x the idle
TTFT (IdleMultiple). SLO.scaled(k) multiplies both parts (the headline's SLO scales).
The removed flags --slo-ttft-s / --slo-per-token-ms (which took the larger of the two parts) are refused
with the equivalent --slo (add_slo_flag).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass

from asap.scheduler.request import Request

_NUM = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
_TIME = re.compile(_NUM + r"(ms|s)$")
SLO_SYNTAX = "5s, 5000ms, ttft:5000 (vLLM, ms), 2s+1ms/tok (budget = 2 s + 1 ms x prompt tokens) or 1ms/tok"


@dataclass(frozen=True)
class SLO:
    fixed_s: float                  # seconds every request gets
    per_token_s: float = 0.0        # plus seconds per prompt token

    def __post_init__(self):
        if not (self.fixed_s >= 0 and self.per_token_s >= 0 and self.fixed_s + self.per_token_s > 0):
            raise ValueError(f"an SLO needs a positive fixed or per-token budget, got {self}")

    def budget(self, num_tokens: int) -> float:
        return self.fixed_s + self.per_token_s * num_tokens

    def scaled(self, factor: float) -> "SLO":
        if not factor > 0:
            raise ValueError(f"SLO scale must be > 0, got {factor}")
        return SLO(self.fixed_s * factor, self.per_token_s * factor)

    def apply(self, requests: list[Request]) -> list[Request]:
        """Copies of `requests` with deadline = arrival + budget(prompt tokens)."""
        return [dataclasses.replace(r, deadline=r.arrival + self.budget(r.num_tokens), meta=dict(r.meta))
                for r in requests]

    def mean_budget(self, requests: list[Request]) -> float:
        return sum(self.budget(r.num_tokens) for r in requests) / len(requests)

    def __str__(self) -> str:
        fixed = f"{self.fixed_s:g}s"
        return fixed if not self.per_token_s else f"{fixed}+{self.per_token_s * 1e3:g}ms/tok"


@dataclass(frozen=True)
class IdleMultiple:
    """"5x": every request's budget is `factor` x the idle sync TTFT of max(its length, the token budget)
    (asap.studies.experiments.with_slo); only commands that know the model and cluster resolve it."""
    factor: float

    def __post_init__(self):
        if not self.factor > 0:
            raise ValueError(f"an SLO multiple must be > 0, got {self.factor}")

    def __str__(self) -> str:
        return f"{self.factor:g}x"


def _seconds(text: str, spec: str) -> float:
    m = _TIME.match(text)
    if not m:
        raise ValueError(f"SLO {spec!r}: {text!r} is not a time such as 5s or 500ms")
    return float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1.0)


def parse_slo(spec: "str | SLO | IdleMultiple", relative: bool = False) -> "SLO | IdleMultiple":
    """"5s", "5000ms", "ttft:5000" (ms, vLLM), or "FIXED+PERms/tok" such as "2s+0.2ms/tok" -> SLO;
    with `relative`, also "5x" -> IdleMultiple (else refused: the caller cannot resolve it)."""
    if isinstance(spec, SLO) or (relative and isinstance(spec, IdleMultiple)):
        return spec
    text = str(spec).strip().lower().replace(" ", "")
    if text.endswith("x"):
        if not relative:
            raise ValueError(f"SLO {spec!r}: a multiple of the idle TTFT works only in asap plan / ablation; "
                             f"give a time budget: {SLO_SYNTAX}")
        try:
            return IdleMultiple(float(text[:-1]))
        except ValueError:
            raise ValueError(f"SLO {spec!r}: expected a positive multiple such as 5x") from None
    if text.startswith("ttft:"):
        try:
            return SLO(float(text[5:]) * 1e-3)
        except ValueError:
            raise ValueError(f"SLO {spec!r}: expected ttft:MILLISECONDS") from None
    fixed, _, per = text.partition("+")
    if not per:
        if fixed.endswith("/tok"):
            return SLO(0.0, _seconds(fixed[:-4], spec))
        return SLO(_seconds(fixed, spec))
    if not per.endswith("/tok"):
        raise ValueError(f"SLO {spec!r}: the part after + must be per token, e.g. 0.2ms/tok")
    return SLO(_seconds(fixed, spec), _seconds(per[:-4], spec))


class _Removed(argparse.Action):
    """An old SLO flag: refused with the --slo that replaces it (hidden from --help)."""

    def __call__(self, parser, namespace, values, option_string=None):
        new = f"{values}s" if option_string == "--slo-ttft-s" else f"{values}ms/tok"
        parser.error(f"{option_string} was removed: use --slo {new} (both parts: --slo FIXEDs+PERms/tok, "
                     f"a budget of their sum, where the old flags took the larger)")


def add_slo_flag(parser, default: "str | None", relative: bool = False, what: str = "") -> None:
    """The one --slo flag (validated at parse time, kept as its spec string) and the removed spellings,
    hidden, refused with a hint."""
    def check(spec: str) -> str:
        try:
            parse_slo(spec, relative)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return spec
    syntax = SLO_SYNTAX + (", or 5x (5 x the idle sync TTFT of max(prompt, token budget))" if relative else "")
    shown = "" if default is None else f" (default {default})"
    parser.add_argument("--slo", type=check, default=default,
                        help=f"TTFT budget per request{what}: {syntax}{shown}")
    for old in ("--slo-ttft-s", "--slo-per-token-ms"):
        parser.add_argument(old, action=_Removed, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
