"""Arrival processes: when requests arrive.

Each process is a frozen dataclass with `times(n, rng)` returning `n` arrival
times in seconds, sorted, starting at 0.0 (the first request arrives at once,
so a benchmark never opens with an idle wait). Gaps between arrivals are drawn
from the process's distribution with the given numpy Generator, so a seed fixes
the whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ArrivalProcess(Protocol):
    def times(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


def _check_rate(rate: float) -> None:
    if not (rate > 0 and np.isfinite(rate)):
        raise ValueError(f"arrival rate must be a positive finite number of requests/s, got {rate!r}")


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    # n arrivals need n-1 gaps; the first arrival is at t=0.
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if len(gaps) else np.zeros(0)


def _check_n(n: int) -> None:
    if n < 0:
        raise ValueError(f"number of arrivals must be >= 0, got {n}")


@dataclass(frozen=True)
class Poisson:
    """Exponential gaps with mean 1/rate."""
    rate: float

    def __post_init__(self):
        _check_rate(self.rate)

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return _from_gaps(rng.exponential(1.0 / self.rate, size=n))


@dataclass(frozen=True)
class Gamma:
    """Gamma gaps with mean 1/rate and coefficient of variation `cv`.

    cv=1 is Poisson; cv>1 is burstier, cv<1 smoother. Shape k = 1/cv^2.
    """
    rate: float
    cv: float

    def __post_init__(self):
        _check_rate(self.rate)
        if not (self.cv > 0 and np.isfinite(self.cv)):
            raise ValueError(f"gamma arrival cv must be > 0, got {self.cv!r}")

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        shape = 1.0 / self.cv ** 2
        return _from_gaps(rng.gamma(shape, 1.0 / (self.rate * shape), size=n))


@dataclass(frozen=True)
class Constant:
    """Evenly spaced arrivals, exactly 1/rate apart (rng unused)."""
    rate: float

    def __post_init__(self):
        _check_rate(self.rate)

    def times(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        _check_n(n)
        return np.arange(n, dtype=float) / self.rate
