"""Highest request rate at which a target still meets its SLO target.

ASAP's headline metric (SLO-compliant prefill throughput) is the highest rate
at which at least `target` (default 90%) of requests meet their TTFT SLO.
`find_max_rate` first brackets it (doubles `hi` while the rate still passes,
halves `lo` while it fails), then bisects until the bracket is within the
relative tolerance: hi - lo <= tol * lo. The answer is `lo`, the highest rate
measured that passed, so it is below the true threshold by at most tol x it.
Deterministic for a deterministic `measure`.

A search that cannot lie: "valid" is True only when the search converged AND its answer is a
steady state, not a burst. `burst_above` (req/s) is the rate above which the requests' arrivals
would span less than 10x the SLO (`burst_limit`): there every request may pass just by draining
after the burst, so rates above it are never measured; a search that still passes there returns
valid=False with a reason (use more requests). Report `max_slo_rate` as a maximum only when
`valid`; otherwise it is just the highest rate that passed (a lower bound).
"""
from __future__ import annotations

from typing import Callable


BURST_SPAN_FACTOR = 10.0     # a steady state needs arrivals spanning >= 10x the SLO


def burst_limit(num_requests: int, slo_s: float, factor: float = BURST_SPAN_FACTOR) -> float:
    """The highest rate (req/s) at which `num_requests` arrivals, (N - 1) / rate seconds long, still span
    `factor` x the SLO budget `slo_s`."""
    if num_requests < 2 or not slo_s > 0:
        raise ValueError(f"need >= 2 requests and a positive SLO, got {num_requests}, {slo_s}")
    return (num_requests - 1) / (factor * slo_s)


def find_max_rate(measure: Callable[[float], dict], target: float = 0.9, lo: float = 1.0,
                  hi: float | None = None, tol: float = 0.05, max_iters: int = 20,
                  key: str = "slo_attainment", burst_above: float | None = None) -> dict:
    """Search rates with `measure(rate) -> summary` (summary[key] is the attainment).

    Returns {"max_slo_rate": float (0.0 if even the lowest rate tried failed),
    "points": [(rate, summary), ...] every measurement in the order taken,
    "tolerance": tol, "target": target, "converged": bool (False if
    `max_iters` measurements ran out first), "valid": bool, "reason": str | None}.
    """
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must be in (0, 1], got {target}")
    if not lo > 0:
        raise ValueError(f"lo must be a positive rate, got {lo}")
    if hi is not None and not hi > lo:
        raise ValueError(f"hi={hi} must be above lo={lo}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if max_iters < 2:
        raise ValueError(f"max_iters must be >= 2, got {max_iters}")
    if burst_above is not None:
        if not burst_above > 0:
            raise ValueError(f"burst_above must be a positive rate, got {burst_above}")
        lo = min(lo, burst_above)
        if hi is not None:
            hi = min(hi, burst_above)
            if not hi > lo:
                hi = None
    points: list[tuple[float, dict]] = []

    def passes(rate: float) -> bool:
        summary = measure(rate)
        points.append((rate, summary))
        value = summary.get(key)
        if value is None:
            raise ValueError(f"measure({rate}) returned no {key!r}; is an SLO set?")
        return value >= target

    def result(best: float, converged: bool, reason: str | None = None) -> dict:
        if reason is None and not converged:
            reason = f"did not converge within {max_iters} measurements"
        if reason is None and best <= 0:
            reason = "no rate passed"
        return {"max_slo_rate": best, "points": points, "tolerance": tol, "target": target,
                "converged": converged, "valid": converged and best > 0, "reason": reason}

    # Bracket: a passing lo and a failing hi.
    hi_failed = False
    while not passes(lo):
        if len(points) >= max_iters:
            return result(0.0, False)
        hi, lo, hi_failed = lo, lo / 2, True
    if not hi_failed:
        hi = lo * 2 if hi is None else hi
        while True:
            if len(points) >= max_iters:
                return result(lo, False)
            if burst_above is not None and hi >= burst_above:
                if lo >= burst_above or passes(burst_above):
                    return result(burst_above, False,
                                  f"still passes at {burst_above:.4g} req/s, where the arrivals span only "
                                  f"{BURST_SPAN_FACTOR:g}x the SLO (a burst, not a steady state): use more requests")
                hi = burst_above
                break
            if not passes(hi):
                break
            lo, hi = hi, hi * 2
    # Bisect.
    while hi - lo > tol * lo:
        if len(points) >= max_iters:
            return result(lo, False)
        mid = (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return result(lo, True)
