"""Highest request rate at which a target still meets its SLO target.

ASAP's headline metric (SLO-compliant prefill throughput) is the highest rate
at which at least `target` (default 90%) of requests meet their TTFT SLO.
`find_max_rate` first brackets it (doubles `hi` while the rate still passes,
halves `lo` while it fails), then bisects until the bracket is within the
relative tolerance: hi - lo <= tol * lo. The answer is `lo`, the highest rate
measured that passed, so it is below the true threshold by at most tol x it.
Deterministic for a deterministic `measure`.
"""
from __future__ import annotations

from typing import Callable


def find_max_rate(measure: Callable[[float], dict], target: float = 0.9, lo: float = 1.0,
                  hi: float | None = None, tol: float = 0.05, max_iters: int = 20,
                  key: str = "slo_attainment") -> dict:
    """Search rates with `measure(rate) -> summary` (summary[key] is the attainment).

    Returns {"max_slo_rate": float (0.0 if even the lowest rate tried failed),
    "points": [(rate, summary), ...] every measurement in the order taken,
    "tolerance": tol, "target": target, "converged": bool (False if
    `max_iters` measurements ran out first)}.
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
    points: list[tuple[float, dict]] = []

    def passes(rate: float) -> bool:
        summary = measure(rate)
        points.append((rate, summary))
        value = summary.get(key)
        if value is None:
            raise ValueError(f"measure({rate}) returned no {key!r}; is an SLO set?")
        return value >= target

    def result(best: float, converged: bool) -> dict:
        return {"max_slo_rate": best, "points": points, "tolerance": tol, "target": target,
                "converged": converged}

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
