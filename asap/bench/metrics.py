"""Per-request results and the summary every benchmark reports.

A request meets its SLO when it succeeded and its TTFT is within its budget.
The budget is the request's own `deadline_s` (TTFT budget in seconds from its
arrival, i.e. Request.deadline - Request.arrival) or else the `slo` passed to
`summarize`. Failed requests count as misses and stay in every denominator.

`summarize` returns a dict with these keys (None where undefined, e.g. no
successful requests, or no SLO at all):

- num_requests            all results, failed included
- num_failed              results with an error (or no TTFT)
- duration_s              the `duration` given, else first arrival to last completion
- ttft_mean_ms, ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, ttft_max_ms
                          over successful requests (numpy linear percentiles)
- slo_s                   the default TTFT SLO used (seconds), or None
- num_slo_met             successful requests within their budget
- slo_attainment          num_slo_met / num_requests
- goodput                 num_slo_met / duration_s   (requests/s meeting SLO)
- request_throughput      successful requests / duration_s
- input_token_throughput  prompt tokens of successful requests / duration_s
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asap.scheduler.request import Request

SUMMARY_KEYS = ("num_requests", "num_failed", "duration_s",
                "ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_max_ms",
                "slo_s", "num_slo_met", "slo_attainment", "goodput",
                "request_throughput", "input_token_throughput")


@dataclass(frozen=True)
class RequestResult:
    request_id: int
    arrival: float                   # seconds, the clock of the run
    num_tokens: int
    ttft: float | None               # seconds from arrival to first token; None if failed
    error: str | None = None
    deadline_s: float | None = None  # this request's TTFT budget in seconds (relative to arrival)

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None

    @classmethod
    def of(cls, req: Request, ttft: float | None, error: str | None = None) -> "RequestResult":
        """A result for `req`, carrying its SLO budget from Request.deadline."""
        budget = None if req.deadline is None else req.deadline - req.arrival
        return cls(req.id, req.arrival, req.num_tokens, ttft, error, budget)


def _budgets(results: list[RequestResult], slo: float | None) -> list[float] | None:
    budgets = [r.deadline_s if r.deadline_s is not None else slo for r in results]
    if all(b is None for b in budgets):
        return None
    if any(b is None for b in budgets):
        raise ValueError("some requests have no TTFT SLO (deadline_s) and no default slo was given")
    return budgets


def summarize(results: list[RequestResult], slo: float | None = None,
              duration: float | None = None) -> dict:
    """Summary of one run; `slo` (seconds) is the default TTFT budget. Keys: see module docstring."""
    if slo is not None and not slo > 0:
        raise ValueError(f"slo must be > 0 seconds, got {slo}")
    if duration is not None and not duration > 0:
        raise ValueError(f"duration must be > 0 seconds, got {duration}")
    ok = [r for r in results if r.ok]
    ttft_ms = np.array([r.ttft for r in ok], dtype=float) * 1000.0
    if duration is None and results:
        end = max([r.arrival + r.ttft for r in ok] + [r.arrival for r in results])
        duration = end - min(r.arrival for r in results)
    rate = (lambda x: x / duration) if duration else (lambda x: None)

    budgets = _budgets(results, slo)
    num_met = None if budgets is None else sum(
        r.ok and r.ttft <= b for r, b in zip(results, budgets))

    def stat(f):
        return float(f(ttft_ms)) if len(ttft_ms) else None

    return {
        "num_requests": len(results),
        "num_failed": len(results) - len(ok),
        "duration_s": duration,
        "ttft_mean_ms": stat(np.mean),
        "ttft_p50_ms": stat(lambda x: np.percentile(x, 50)),
        "ttft_p90_ms": stat(lambda x: np.percentile(x, 90)),
        "ttft_p99_ms": stat(lambda x: np.percentile(x, 99)),
        "ttft_max_ms": stat(np.max),
        "slo_s": slo,
        "num_slo_met": num_met,
        "slo_attainment": None if num_met is None or not results else num_met / len(results),
        "goodput": None if num_met is None else rate(num_met),
        "request_throughput": rate(len(ok)),
        "input_token_throughput": rate(sum(r.num_tokens for r in ok)),
    }
