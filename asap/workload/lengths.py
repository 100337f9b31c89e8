"""Prompt-length distributions: how many input tokens each request has.

Each distribution is a frozen dataclass with `sample(n, rng)` returning an
int64 array of `n` lengths, every one >= 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np


class LengthDistribution(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


def _check_n(n: int) -> None:
    if n < 0:
        raise ValueError(f"number of lengths must be >= 0, got {n}")


@dataclass(frozen=True)
class Fixed:
    num_tokens: int

    def __post_init__(self):
        if self.num_tokens < 1:
            raise ValueError(f"Fixed length must be >= 1 token, got {self.num_tokens}")

    def sample(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        _check_n(n)
        return np.full(n, self.num_tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [lo, hi], both ends included."""
    lo: int
    hi: int

    def __post_init__(self):
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"Uniform lengths need 1 <= lo <= hi, got lo={self.lo} hi={self.hi}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return rng.integers(self.lo, self.hi, size=n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths with the given mean (in tokens) and log-space sigma.

    `mean` is the mean of the lengths themselves, not of their logs:
    mu = ln(mean) - sigma^2 / 2. Samples are rounded and floored at 1.
    """
    mean: float
    sigma: float

    def __post_init__(self):
        if not self.mean >= 1:
            raise ValueError(f"LogNormal mean must be >= 1 token, got {self.mean}")
        if not self.sigma >= 0:
            raise ValueError(f"LogNormal sigma must be >= 0, got {self.sigma}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        mu = np.log(self.mean) - self.sigma ** 2 / 2
        return np.maximum(1, np.rint(rng.lognormal(mu, self.sigma, size=n))).astype(np.int64)


@dataclass(frozen=True)
class FromTrace:
    """Lengths resampled (with replacement) from an observed set, e.g. a trace."""
    lengths: tuple[int, ...]

    def __post_init__(self):
        if not self.lengths:
            raise ValueError("FromTrace needs at least one length")
        if min(self.lengths) < 1:
            raise ValueError(f"FromTrace lengths must be >= 1, got min {min(self.lengths)}")

    @classmethod
    def of_file(cls, path: str | Path) -> "FromTrace":
        from asap.workload.traces import read_trace
        return cls(tuple(int(x) for x in read_trace(path).input_lengths))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return rng.choice(np.asarray(self.lengths, dtype=np.int64), size=n, replace=True)
