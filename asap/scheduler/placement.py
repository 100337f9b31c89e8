"""Expert placement: which expert workers hold a copy of which experts, per layer.

`contiguous_placement` is plain EP (one copy, experts split in ranges).
`balanced_placement` is EPLB-style: hot experts get extra copies, then copies
are packed so that every worker carries about the same load (load/copies each).
`ReplicaChooser` then spreads each batch's tokens over the copies.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence


class RoutingStats:
    """Accumulates per-layer, per-expert routed token counts (the loads for balanced_placement)."""

    def __init__(self, num_layers: int, num_experts: int):
        if num_layers < 1 or num_experts < 1:
            raise ValueError(f"need num_layers >= 1 and num_experts >= 1, got {num_layers}, {num_experts}")
        self.num_layers, self.num_experts = num_layers, num_experts
        self._counts = [[0.0] * num_experts for _ in range(num_layers)]

    def record(self, layer: int, expert_counts: Sequence[int]) -> None:
        if len(expert_counts) != self.num_experts:
            raise ValueError(f"expected {self.num_experts} expert counts, got {len(expert_counts)}")
        row = self._counts[layer]
        for e, n in enumerate(expert_counts):
            row[e] += n

    def loads(self) -> list[list[float]]:
        return [list(row) for row in self._counts]

    def reset(self) -> None:
        self._counts = [[0.0] * self.num_experts for _ in range(self.num_layers)]


@dataclass(frozen=True)
class Placement:
    num_workers: int
    replicas: tuple[tuple[tuple[int, ...], ...], ...]   # [layer][expert] -> workers holding a copy

    def __post_init__(self):
        for layer, experts in enumerate(self.replicas):
            for e, workers in enumerate(experts):
                if not workers:
                    raise ValueError(f"layer {layer} expert {e} has no copy")
                if len(set(workers)) != len(workers) or not all(0 <= w < self.num_workers for w in workers):
                    raise ValueError(f"layer {layer} expert {e}: bad workers {workers}")

    @property
    def num_layers(self) -> int:
        return len(self.replicas)

    @property
    def num_experts(self) -> int:
        return len(self.replicas[0]) if self.replicas else 0

    def experts_on(self, worker: int, layer: int) -> list[int]:
        return [e for e, workers in enumerate(self.replicas[layer]) if worker in workers]

    def owner_table(self, layer: int) -> list[list[int]]:
        return [list(workers) for workers in self.replicas[layer]]


def contiguous_placement(num_layers: int, num_experts: int, num_workers: int) -> Placement:
    """One copy per expert; expert e on worker e*W//E (equal counts when W divides E)."""
    if not 1 <= num_workers <= num_experts:
        raise ValueError(f"need 1 <= num_workers <= num_experts, got {num_workers}, {num_experts}")
    layer = tuple((e * num_workers // num_experts,) for e in range(num_experts))
    return Placement(num_workers, (layer,) * num_layers)


def balanced_placement(loads: list[list[float]], num_workers: int, num_redundant: int) -> Placement:
    """loads[layer][expert] -> placement with num_redundant extra copies per layer.

    Every worker gets (E + num_redundant) / num_workers slots per layer (must divide).
    """
    if not loads or not loads[0]:
        raise ValueError("loads must be a non-empty [layer][expert] table")
    num_experts = len(loads[0])
    slots = num_experts + num_redundant
    if num_redundant < 0 or num_workers < 1 or slots % num_workers:
        raise ValueError(f"need num_redundant >= 0 and (num_experts + num_redundant) % num_workers == 0; "
                         f"got E={num_experts}, R={num_redundant}, W={num_workers}")
    if num_redundant > num_experts * (num_workers - 1):
        raise ValueError(f"{num_redundant} redundant copies cannot fit on distinct workers "
                         f"(at most {num_experts * (num_workers - 1)})")
    layers = []
    for layer, row in enumerate(loads):
        if len(row) != num_experts or min(row) < 0:
            raise ValueError(f"layer {layer}: need {num_experts} loads >= 0")
        copies = _count_copies(row, num_redundant, num_workers)
        layers.append(_pack(row, copies, num_workers, slots // num_workers))
    return Placement(num_workers, tuple(layers))


def _count_copies(row: list[float], num_redundant: int, num_workers: int) -> list[int]:
    """Give each extra copy to the expert with the highest load per copy (max num_workers copies)."""
    copies = [1] * len(row)
    heap = [(-load, e) for e, load in enumerate(row)]
    heapq.heapify(heap)
    for _ in range(num_redundant):       # the caller checked num_redundant <= E * (W - 1)
        _, e = heapq.heappop(heap)
        copies[e] += 1
        if copies[e] < num_workers:
            heapq.heappush(heap, (-row[e] / copies[e], e))
    return copies


def _pack(row: list[float], copies: list[int], num_workers: int, slots: int) -> tuple[tuple[int, ...], ...]:
    """Heaviest copy first onto the least-loaded worker with a free slot not holding that expert."""
    held: list[set[int]] = [set() for _ in range(num_workers)]
    load = [0.0] * num_workers
    items = sorted(((row[e] / copies[e], e) for e in range(len(row)) for _ in range(copies[e])),
                   key=lambda t: (-t[0], t[1]))
    for w_load, e in items:
        free = [w for w in range(num_workers) if len(held[w]) < slots and e not in held[w]]
        if free:
            w = min(free, key=lambda w: (load[w], w))
        else:
            w = _make_room(row, copies, held, load, e, slots)
        held[w].add(e)
        load[w] += w_load
    owners: list[list[int]] = [[] for _ in row]
    for w in range(num_workers):
        for e in held[w]:
            owners[e].append(w)
    return tuple(tuple(sorted(ws)) for ws in owners)


def _make_room(row, copies, held, load, e, slots) -> int:
    """Every worker with a free slot already holds e: move some expert f off a full worker v
    (that lacks e) onto a free worker u (that lacks f), and return v for e. Such v and f always
    exist: u holds e and fewer than `slots` experts, v holds `slots` experts and not e."""
    u = min((w for w in range(len(held)) if len(held[w]) < slots), key=lambda w: (load[w], w))
    v = min((w for w in range(len(held)) if e not in held[w]), key=lambda w: (load[w], w))
    target = row[e] / copies[e]
    f = min((f for f in held[v] if f not in held[u]), key=lambda f: (abs(row[f] / copies[f] - target), f))
    moved = row[f] / copies[f]
    held[v].remove(f)
    load[v] -= moved
    held[u].add(f)
    load[u] += moved
    return v


class ReplicaChooser:
    """Picks, for each (token, k) routed to an expert, which worker's copy serves it.

    Counts are decided per expert, then tokens are handed out in flat order: experts
    with one copy are counted first, then each replicated expert, fewest tokens first
    so the hottest levels last, water-fills its copies: its tokens go to the copies
    whose workers hold the fewest tokens so far in this call (ties to the lower
    worker). Deterministic: the same input gives the same output.

    The policy itself is `shares` (per expert, from per-expert counts: O(E), no tokens);
    `choose` hands the pairs out in plain Python, and asap.workers.destinations does the
    same hand-out with tensor ops on the pairs' device.
    """

    def __init__(self, placement: Placement):
        self.placement = placement
        self._tables = [placement.owner_table(layer) for layer in range(placement.num_layers)]

    def owners(self, layer: int) -> list[list[int]]:
        """[expert] -> the workers holding a copy, ascending (copy c of expert e is owners[e][c])."""
        return self._tables[layer]

    def shares(self, layer: int, counts: Sequence[int]) -> list[list[int]]:
        """counts[e] pairs routed to expert e -> shares[e][c]: how many of them copy c serves."""
        owners = self._tables[layer]
        if len(counts) != len(owners):
            raise ValueError(f"expected {len(owners)} expert counts, got {len(counts)}")
        total = [0] * self.placement.num_workers
        out: list[list[int]] = [[n] if len(owners[e]) == 1 else [] for e, n in enumerate(counts)]
        for e, n in enumerate(counts):
            if n and len(owners[e]) == 1:
                total[owners[e][0]] += n
        for n, e in sorted((n, e) for e, n in enumerate(counts) if n and len(owners[e]) > 1):
            out[e] = _water_fill([total[w] for w in owners[e]], n)
            for w, share in zip(owners[e], out[e]):
                total[w] += share
        return [sh or [0] * len(owners[e]) for e, sh in enumerate(out)]

    def choose(self, layer: int, expert_ids: Sequence[int]) -> list[int]:
        owners = self._tables[layer]
        counts = [0] * len(owners)
        for e in expert_ids:
            if e < 0:
                raise ValueError(f"negative expert id {e}")
            counts[e] += 1
        shares = self.shares(layer, counts)
        cursor = {e: iter([w for w, n in zip(owners[e], shares[e]) for _ in range(n)])
                  for e in range(len(owners)) if counts[e]}
        return [next(cursor[e]) for e in expert_ids]


def _water_fill(levels: list[int], n: int) -> list[int]:
    """Split n units over bins with current `levels` so the lowest bins are raised evenly."""
    order = sorted(range(len(levels)), key=lambda i: (levels[i], i))
    shares = [0] * len(levels)
    # raise the first j bins to the level of bin j while units last
    j, left = 1, n
    while j < len(order):
        step = (levels[order[j]] - levels[order[j - 1]]) * j
        if step > left:
            break
        left -= step
        j += 1
    top = levels[order[j - 1]]
    for i in order[:j]:
        shares[i] = top - levels[i]
    q, r = divmod(left, j)
    for rank, i in enumerate(order[:j]):
        shares[i] += q + (1 if rank < r else 0)
    return shares
