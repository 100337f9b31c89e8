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

`vllm_metrics` gives the same run under `vllm bench serve`'s result keys
(completed, failed, duration, total_input_tokens, request_throughput,
request_goodput, mean/median/std/pNN_{ttft,e2el}_ms, ...), so its scripts read
ASAP's results. Its goodput is ASAP's: requests within their TTFT budget (and
the --goodput e2el bound, when given) per second of the run.
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
    e2el: float | None = None        # seconds from arrival to the end of the response (default: = ttft)
    output_tokens: int = 1           # tokens the response carried (usage.completion_tokens over HTTP)

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft is not None

    @property
    def latency(self) -> float | None:
        """End-to-end latency (vLLM's e2el): the response's end, else the first token."""
        return self.e2el if self.e2el is not None else self.ttft

    @classmethod
    def of(cls, req: Request, ttft: float | None, error: str | None = None, e2el: float | None = None,
           output_tokens: int | None = None) -> "RequestResult":
        """A result for `req`, carrying its SLO budget from Request.deadline."""
        budget = None if req.deadline is None else req.deadline - req.arrival
        return cls(req.id, req.arrival, req.num_tokens, ttft, error, budget, e2el,
                   (0 if ttft is None else 1) if output_tokens is None else output_tokens)


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


VLLM_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_KEYS = ("ttft", "tpot", "e2el")


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    """vLLM's --goodput KEY:MS ... -> {key: seconds}; keys ttft, tpot, e2el."""
    out = {}
    for spec in specs or []:
        key, _, value = spec.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key not in GOODPUT_KEYS or not ms > 0:
            raise ValueError(f"--goodput {spec!r}: expected KEY:MS with KEY in {', '.join(GOODPUT_KEYS)} "
                             f"and MS > 0, e.g. ttft:500")
        out[key] = ms / 1000.0
    return out


def parse_percentiles(text: str) -> list[float]:
    """--metric-percentiles "50,90,99" -> [50.0, 90.0, 99.0], each in (0, 100]."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < v <= 100 for v in values):
        raise ValueError(f"--metric-percentiles {text!r}: expected comma-separated percentiles in (0, 100]")
    return values


def parse_metrics(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in VLLM_METRICS]
    if not names or bad:
        raise ValueError(f"--percentile-metrics {text!r}: choose from {', '.join(VLLM_METRICS)}")
    return names


def _pword(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)     # vLLM's key spelling: p99, p99.9


def vllm_metrics(results: list[RequestResult], summary: dict, metrics=("ttft", "e2el"),
                 percentiles=(99.0,), goodput: dict[str, float] | None = None) -> dict:
    """`vllm bench serve`'s result keys for one run (`summary` = summarize(results)).

    tpot and itl need decoded tokens; a prefill returns one, so they are 0.0, as vLLM reports them
    when no request decodes more than one token.
    request_goodput counts requests within their TTFT budget and, with goodput["e2el"], within it too;
    None when there is no SLO at all."""
    ok = [r for r in results if r.ok]
    duration = summary["duration_s"]
    values = {"ttft": [r.ttft for r in ok], "e2el": [r.latency for r in ok], "tpot": [], "itl": []}
    out = {"duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
           "total_input_tokens": sum(r.num_tokens for r in ok),
           "total_output_tokens": sum(r.output_tokens for r in ok)}
    rate = (lambda x: x / duration) if duration else (lambda x: None)
    met = summary["num_slo_met"]
    if goodput and "e2el" in goodput:
        def good(r: RequestResult) -> bool:
            budget = r.deadline_s if r.deadline_s is not None else summary["slo_s"]
            return (budget is None or r.ttft <= budget) and r.latency <= goodput["e2el"]
        met = sum(good(r) for r in ok)
    out.update(request_throughput=rate(len(ok)), request_goodput=None if met is None else rate(met),
               output_throughput=rate(out["total_output_tokens"]),
               total_token_throughput=rate(out["total_input_tokens"] + out["total_output_tokens"]))
    for m in metrics:
        xs = np.asarray(values[m] or [0.0], dtype=float) * 1000.0     # vLLM: np.mean(xs or 0)
        out[f"mean_{m}_ms"], out[f"median_{m}_ms"], out[f"std_{m}_ms"] = \
            float(np.mean(xs)), float(np.median(xs)), float(np.std(xs))
        for p in percentiles:
            out[f"p{_pword(p)}_{m}_ms"] = float(np.percentile(xs, p))
    out.update(input_lens=[r.num_tokens for r in results], ttfts=[r.ttft for r in results],
               errors=[r.error or "" for r in results])
    return out
