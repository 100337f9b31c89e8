"""SLO attainment per prompt-length bucket: what a request-count SLO can hide.

A 90% request-count target can be met while every long prompt misses (long prompts are few but hold
many of the tokens). `by_length` splits results into prompt-length buckets and gives each its
attainment; `min_bucket_attainment` is the pass value of the stricter criterion "at least the target in
every length bucket". Buckets with no requests are reported with attainment None and do not count
in the minimum. Failed requests count as misses, as in asap.measure.metrics.summarize.
"""
from __future__ import annotations

from asap.measure.metrics import RequestResult

# (label, lowest prompt tokens, highest + 1): <4K, 4-16K, 16-64K, >64K
BUCKETS = (("<4K", 0, 4096), ("4-16K", 4096, 16384), ("16-64K", 16384, 65536), (">64K", 65536, None))


def bucket_of(num_tokens: int, buckets=BUCKETS) -> str:
    for label, lo, hi in buckets:
        if num_tokens >= lo and (hi is None or num_tokens < hi):
            return label
    raise ValueError(f"no bucket holds a prompt of {num_tokens} tokens")


def by_length(results: list[RequestResult], slo: float | None = None, buckets=BUCKETS) -> dict:
    """{label: {"num_requests", "num_slo_met", "slo_attainment" (None if empty), "share_of_tokens"}} in
    bucket order. `slo`: the default TTFT budget for results without their own deadline_s."""
    total_tokens = sum(r.num_tokens for r in results) or 1
    out = {label: {"num_requests": 0, "num_slo_met": 0, "tokens": 0} for label, _, _ in buckets}
    for r in results:
        budget = r.deadline_s if r.deadline_s is not None else slo
        if budget is None:
            raise ValueError("by_length needs a TTFT budget: results with deadline_s, or slo")
        b = out[bucket_of(r.num_tokens, buckets)]
        b["num_requests"] += 1
        b["tokens"] += r.num_tokens
        b["num_slo_met"] += int(r.ok and r.ttft <= budget)
    for b in out.values():
        b["slo_attainment"] = b["num_slo_met"] / b["num_requests"] if b["num_requests"] else None
        b["share_of_tokens"] = b.pop("tokens") / total_tokens
    return out


def min_bucket_attainment(results: list[RequestResult], slo: float | None = None, buckets=BUCKETS) -> float | None:
    """The lowest attainment over the non-empty length buckets (None if there are no results)."""
    values = [b["slo_attainment"] for b in by_length(results, slo, buckets).values() if b["num_requests"]]
    return min(values) if values else None


def format_buckets(buckets: dict) -> str:
    """One line: '<4K 71% (n=120) | 4-16K 98% (n=40) | ...'; empty buckets as '-'."""
    return " | ".join(f"{label} {'-' if b['slo_attainment'] is None else format(b['slo_attainment'], '.0%')}"
                      f" (n={b['num_requests']})" for label, b in buckets.items())
