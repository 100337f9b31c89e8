"""Expert-side work selection: which ready work items an expert worker runs next.

A work item is one (attention replica, layer, micro-batch) dispatch. A selector
picks a primary item by its rule, then merges other ready items of the SAME
layer (any replica) into one batch, in the same rule order, while the batch
stays within `max_batch_tokens` (the primary always runs, even if larger).
`FullestLayer` picks the layer first (the most ready tokens, unless one has waited
past its age bound), then merges that layer's items oldest first.
`select` over a list costs O(n log n) in the number of ready items; the simulator
keeps its ready items in a `ReadyQueue` instead (`ready_queue`), which makes the
same choices in O(log n) per item taken (plus O(layers) per batch for FullestLayer).
"""
from __future__ import annotations

import heapq
from typing import Any, Callable, NamedTuple, Protocol

_INF = float("inf")


class WorkInfo(NamedTuple):     # immutable like a frozen dataclass, and made 3x faster (one per simulated dispatch)
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

    @staticmethod
    def _key(w: WorkInfo, seq: int) -> tuple:      # rank + the tie-break, flat: what ReadyQueue's heaps order by
        return (w.sent_at, seq, w)


class LargestFirst(_RuleSelector):
    """Most tokens first (better expert GEMM efficiency); ties by age."""

    @staticmethod
    def rank(w: WorkInfo) -> tuple:
        return (-w.num_tokens, w.sent_at)

    @staticmethod
    def _key(w: WorkInfo, seq: int) -> tuple:
        return (-w.num_tokens, w.sent_at, seq, w)


class DeadlineFirst(_RuleSelector):
    """Earliest TTFT deadline first; ties by age."""

    @staticmethod
    def rank(w: WorkInfo) -> tuple:
        return (w.deadline, w.sent_at)

    @staticmethod
    def _key(w: WorkInfo, seq: int) -> tuple:
        return (w.deadline, w.sent_at, seq, w)


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


class FullestLayer(_RuleSelector):
    """The layer with the most ready tokens first (any replicas), its items oldest first; but a layer whose
    oldest item has waited `max_wait_s` goes before any other (the oldest such first), so none starves.

    Without a barrier the expert side sees the replicas at scattered layers, and every batch reloads the
    experts' weights: an oldest-first pool runs a few thousand tokens per batch, a fraction of the GEMMs'
    large-batch rate. When work queues up, serving the fullest layer merges the most items per weight read,
    and the replicas it serves leave together, so they tend to reach the next layer together (the batching
    sync's barrier gives for free, without the barrier). When nothing queues it is oldest-first.
    """

    def __init__(self, max_batch_tokens: int = 8192, max_wait_s: float = 0.02):
        super().__init__(max_batch_tokens)
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.max_wait_s = max_wait_s

    @staticmethod
    def rank(w: WorkInfo) -> tuple:
        return (w.sent_at,)

    @staticmethod
    def _key(w: WorkInfo, seq: int) -> tuple:
        return (w.sent_at, seq, w)

    def select(self, ready: list[WorkInfo], now: float) -> list[int]:
        if not ready:
            return []
        layers: dict[int, list[int]] = {}
        for i, w in enumerate(ready):
            layers.setdefault(w.layer, []).append(i)
        due = now - self.max_wait_s
        best = None
        for idx in layers.values():
            i = min(idx, key=lambda i: (ready[i].sent_at, i))       # the layer's oldest (ties: first to arrive)
            sent, tokens = ready[i].sent_at, sum(ready[j].num_tokens for j in idx)
            key = (0, sent, i) if sent <= due else (1, -tokens, sent, i)
            if best is None or key < best[0]:
                best = (key, idx)
        idx = best[1]
        return [idx[j] for j in super().select([ready[i] for i in idx], now)]


class ListQueue:
    """Ready items in arrival order, handed to any Selector as a list (the runtime's way, and the
    simulator's for a selector it does not know)."""

    def __init__(self, selector: Selector):
        self.selector = selector
        self.items: list[WorkInfo] = []
        self.wait_until: float | None = None

    def __len__(self) -> int:
        return len(self.items)

    def push(self, work: WorkInfo) -> None:
        self.items.append(work)

    def take(self, now: float) -> list[WorkInfo]:
        """The selector's batch, removed from the queue ([] = wait; then `wait_until` may say until when)."""
        items = self.items
        picked = self.selector.select(items, now)
        self.wait_until = getattr(self.selector, "wait_until", None) if not picked else None
        if not picked:
            return []
        batch = [items[i] for i in picked]
        if any(w.layer != batch[0].layer for w in batch):
            raise ValueError(f"selector {type(self.selector).__name__} mixed layers in one batch")
        if len(picked) == 1:
            del items[picked[0]]
        else:
            chosen = set(picked)
            self.items = [w for i, w in enumerate(items) if i not in chosen]
        return batch


class ReadyQueue:
    """The same batches as `_RuleSelector.select` (wrapped or not in an AggregationWindow) over a list of
    the same items in arrival order, in O(log n) per item taken instead of O(n log n) per call.

    Each item gets a sequence number as it arrives; an item's list index orders like its sequence number
    (a list keeps arrival order as items leave), so the heap key (rank, seq) is select's (rank, index) and
    every choice, ties included, is the same. One heap per layer holds that layer's items; a heap of all
    keys finds the primary, skipping the entries of items that left as merged ones when they surface.
    For a FullestLayer the primary is found instead by a scan of the layers' heap tops and their queued
    token counts.
    """

    def __init__(self, selector: "_RuleSelector", window_s: float | None = None):
        self.key = selector._key
        self.max_batch_tokens = selector.max_batch_tokens
        self.window_s = window_s                # None: no aggregation window
        self.fullest = getattr(selector, "max_wait_s", None)   # FullestLayer's age bound; None: a rank rule
        self._tokens: dict[int, int] = {}       # layer -> its queued tokens (FullestLayer only)
        self.wait_until: float | None = None
        self._layers: dict[int, list] = {}     # layer -> heap of keys
        self._all: list = []                    # heap of keys, all layers; stale once taken
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, work: WorkInfo) -> None:
        k = self.key(work, self._seq)
        self._seq += 1
        self._len += 1
        layer = self._layers.get(work.layer)
        if layer is None:
            layer = self._layers[work.layer] = []
        heapq.heappush(layer, k)
        if self.fullest is not None:
            self._tokens[work.layer] = self._tokens.get(work.layer, 0) + work.num_tokens
        else:
            heapq.heappush(self._all, k)

    def take(self, now: float) -> list[WorkInfo]:
        self.wait_until = None
        if not self._len:
            return []
        everyone, pop = self._all, heapq.heappop
        if self.fullest is not None:    # FullestLayer: an overdue layer's oldest first, else the fullest layer
            due, k, best = now - self.fullest, None, None
            for layer, heap in self._layers.items():
                top = heap[0]
                sent = top[-1].sent_at
                key = (0, sent, top[1]) if sent <= due else (1, -self._tokens[layer], sent, top[1])
                if best is None or key < best:
                    k, best = top, key
            heap = self._layers[k[-1].layer]
        else:
            while True:                 # the primary: the least key whose item is still queued
                k = everyone[0]
                heap = self._layers.get(k[-1].layer)
                if heap and heap[0] is k:
                    break
                pop(everyone)           # its item left in an earlier batch (a layer heap's top is its least)
        pop(heap)
        total, cap = k[-1].num_tokens, self.max_batch_tokens
        keys, skipped = [k], []
        while heap and total < cap:     # same-layer items in key order, greedily, as select merges them
            other = pop(heap)
            n = other[-1].num_tokens
            if total + n <= cap:
                keys.append(other)
                total += n
            else:
                skipped.append(other)
        for other in skipped:
            heapq.heappush(heap, other)
        if self.window_s is not None:   # AggregationWindow: hold the batch until its primary has waited
            release_at = k[-1].sent_at + self.window_s
            if not (now >= release_at or total >= cap):
                for other in keys:
                    heapq.heappush(heap, other)
                self.wait_until = release_at
                return []
        layer = k[-1].layer
        if self.fullest is not None:
            self._tokens[layer] -= total
            if not heap:
                del self._tokens[layer]
        else:
            pop(everyone)               # the primary's own entry (the others are skipped when they surface)
        if not heap:
            del self._layers[layer]
        self._len -= len(keys)
        return [x[-1] for x in keys]


def ready_queue(selector: Selector) -> "ReadyQueue | ListQueue":
    """The fastest queue that makes exactly `selector`'s choices: a ReadyQueue for the rule selectors of this
    file (bare or in an AggregationWindow), a ListQueue for any other selector (a subclass included)."""
    if type(selector) in SELECTORS.values():
        return ReadyQueue(selector)
    if type(selector) is AggregationWindow and type(selector.inner) in SELECTORS.values():
        return ReadyQueue(selector.inner, selector.window_s)
    return ListQueue(selector)


SELECTORS = {"oldest": OldestFirst, "largest": LargestFirst, "deadline": DeadlineFirst, "fullest": FullestLayer}


def make_selector(name: str = "oldest", window_s: float = 0.0, max_wait_s: float | None = None, **kw) -> Selector:
    """`kw` goes to the selector (max_batch_tokens); window_s > 0 wraps it in an AggregationWindow;
    max_wait_s is the fullest rule's age bound (default FullestLayer's)."""
    if name not in SELECTORS:
        raise ValueError(f"unknown selector {name!r}; choose one of {', '.join(SELECTORS)}")
    if max_wait_s is not None:
        if name != "fullest":
            raise ValueError(f"max_wait_s is the fullest selector's age bound; selector {name!r} has none")
        kw["max_wait_s"] = max_wait_s
    selector = SELECTORS[name](**kw)
    return AggregationWindow(selector, window_s) if window_s > 0 else selector
