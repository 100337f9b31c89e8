"""TTFT SLOs as peers define them: one budget per request, the same for every engine.

- fixed:             vLLM's `--goodput ttft:MS`: every request has MS milliseconds;
- fixed + per token: budget = fixed_s + per_token_s x prompt tokens (long prompts get the time their
                     prefill needs, short ones still have a fixed part to queue in).
Spec strings: "5s", "5000ms", "ttft:5000" (vLLM's form, ms), "2s+0.2ms/tok", "0.5ms/tok";
SLO.scaled(k) multiplies both parts (the headline's SLO scales).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from asap.scheduler.request import Request

_NUM = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
_TIME = re.compile(_NUM + r"(ms|s)$")


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


def _seconds(text: str, spec: str) -> float:
    m = _TIME.match(text)
    if not m:
        raise ValueError(f"SLO {spec!r}: {text!r} is not a time such as 5s or 500ms")
    return float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1.0)


def parse_slo(spec: "str | SLO") -> SLO:
    """"5s", "5000ms", "ttft:5000" (ms, vLLM), or "FIXED+PERms/tok" such as "2s+0.2ms/tok"."""
    if isinstance(spec, SLO):
        return spec
    text = str(spec).strip().lower().replace(" ", "")
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
