"""Expert-side work selection: which ready work items an expert worker runs next.

A work item is one (attention replica, layer, micro-batch) dispatch. A selector
picks a primary item by its rule, then merges other ready items of the SAME
layer (any replica) into one batch, in the same rule order, while the batch
stays within `max_batch_tokens` (the primary always runs, even if larger).
Cost per call is O(n log n) in the number of ready items.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

_INF = float("inf")


@dataclass(frozen=True)
class WorkInfo:
    key: Any                # the caller's handle for the item
    replica: int
    layer: int
    num_tokens: int
    sent_at: float
    deadline: float = _INF  # earliest TTFT deadline of its tokens; +inf when none


class Selector(Protocol):
    def select(self, ready: list[WorkInfo], now: float) -> list[int]:
        """Indices into `ready` to run now as ONE batch (all one layer); [] = wait."""
        ...


class _RuleSelector:
    """Primary = min of `rank`; merge same-layer items in `rank` order up to max_batch_tokens."""

    rank: Callable[[WorkInfo], tuple]

    def __init__(self, max_batch_tokens: int = 8192):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.max_batch_tokens = max_batch_tokens

    def select(self, ready: list[WorkInfo], now: float) -> list[int]:
        if not ready:
            return []
        rank = self.rank
        primary = min(range(len(ready)), key=lambda i: (*rank(ready[i]), i))
        layer = ready[primary].layer
        batch = [primary]
        total = ready[primary].num_tokens
        others = sorted((i for i, w in enumerate(ready) if w.layer == layer and i != primary),
                        key=lambda i: (*rank(ready[i]), i))
        for i in others:
            if total >= self.max_batch_tokens:
                break
            n = ready[i].num_tokens
            if total + n <= self.max_batch_tokens:
                batch.append(i)
                total += n
        return batch


class OldestFirst(_RuleSelector):
    """Earliest sent first: bounds how long any micro-batch waits on the experts."""

    @staticmethod
    def rank(w: WorkInfo) -> tuple:
        return (w.sent_at,)


class LargestFirst(_RuleSelector):
    """Most tokens first (better expert GEMM efficiency); ties by age."""

    @staticmethod
    def rank(w: WorkInfo) -> tuple:
        return (-w.num_tokens, w.sent_at)


class DeadlineFirst(_RuleSelector):
    """Earliest TTFT deadline first; ties by age."""

    @staticmethod
    def rank(w: WorkInfo) -> tuple:
        return (w.deadline, w.sent_at)


class AggregationWindow:
    """Holds the inner selector's batch until its primary has waited `window_s`
    or the batch already reaches the inner selector's max_batch_tokens.

    After a call that returned [], `wait_until` is the time at which the held
    batch will be released (so an event loop knows when to ask again); None otherwise.
    """

    def __init__(self, inner: Selector, window_s: float):
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s}")
        self.inner = inner
        self.window_s = window_s
        self.max_batch_tokens = getattr(inner, "max_batch_tokens", _INF)
        self.wait_until: float | None = None

    def select(self, ready: list[WorkInfo], now: float) -> list[int]:
        self.wait_until = None
        batch = self.inner.select(ready, now)
        if not batch:
            return []
        release_at = ready[batch[0]].sent_at + self.window_s
        if now >= release_at or sum(ready[i].num_tokens for i in batch) >= self.max_batch_tokens:
            return batch
        self.wait_until = release_at
        return []


SELECTORS = {"oldest": OldestFirst, "largest": LargestFirst, "deadline": DeadlineFirst}


def make_selector(name: str = "oldest", window_s: float = 0.0, **kw) -> Selector:
    """`kw` goes to the selector (max_batch_tokens); window_s > 0 wraps it in an AggregationWindow."""
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; choose one of {', '.join(SELECTORS)}")
    selector = SELECTORS[name](**kw)
    return AggregationWindow(selector, window_s) if window_s > 0 else selector
