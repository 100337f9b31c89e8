"""Where an attention replica sends each (token, expert) pair: the expert worker holding that expert.

With plain EP each expert has one home and this is a table lookup. With
redundant copies (EPLB-style placement) the shared ReplicaChooser policy says
how many of each expert's pairs each copy serves (from per-expert counts), and
the pairs are handed out in flat order with tensor ops: no Python per pair,
one copy of the E counts to the host. Every table lives on the replica's
device, so the lookup runs where topk_ids already is.
"""
from __future__ import annotations

from itertools import accumulate

import torch

from asap.scheduler.placement import Placement, ReplicaChooser


class Destinations:
    def __init__(self, placement: Placement, first_rank: int, device="cpu"):
        self.first_rank, self.device = first_rank, torch.device(device)
        self.chooser = ReplicaChooser(placement)
        self.tables: dict[int, torch.Tensor] = {}    # plain-EP layers: [E] expert -> rank
        self.owners: dict[int, torch.Tensor] = {}    # replicated layers: [E, C] copy -> rank (padded)
        for layer, reps in enumerate(placement.replicas):
            if all(len(r) == 1 for r in reps):
                self.tables[layer] = torch.tensor([r[0] for r in reps], dtype=torch.long, device=self.device) \
                    + first_rank
            else:
                width = max(len(r) for r in reps)
                padded = [list(r) + [r[-1]] * (width - len(r)) for r in reps]
                self.owners[layer] = torch.tensor(padded, dtype=torch.long, device=self.device) + first_rank

    def __call__(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        """topk_ids [T,K] -> transport rank per pair [T,K], on topk_ids' device."""
        table = self.tables.get(layer)
        if table is not None:
            return table[topk_ids]
        return self._spread(layer, topk_ids)

    def _spread(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        owners = self.owners[layer]
        E, C = owners.shape
        flat = topk_ids.reshape(-1)                                           # [P]
        n = flat.numel()
        bad = (flat < 0) | (flat >= E)
        counts = torch.zeros(E + 1, dtype=torch.long, device=flat.device)
        counts.index_add_(0, torch.where(bad, E, flat), torch.ones_like(flat))
        host = counts.tolist()                                                # the one copy to the host
        if host[E]:
            raise ValueError(f"expert ids must be in [0, {E}), got {host[E]} outside")
        shares = self.chooser.shares(layer, host[:E])
        big = n + 1
        bounds = torch.tensor([list(accumulate(sh)) + [big] * (C - len(sh)) for sh in shares],
                              dtype=torch.long).to(flat.device, non_blocking=True)   # [E, C] cumulative shares
        # Each pair's occurrence number within its expert, in flat order (a stable sort keeps the order).
        order = torch.argsort(flat, stable=True)
        first = torch.cumsum(counts[:E], 0) - counts[:E]                      # [E] first sorted slot
        occ = torch.empty_like(flat)
        occ[order] = torch.arange(n, device=flat.device) - first[flat[order]]
        copy = (occ[:, None] >= bounds[flat]).sum(1)                          # [P] which copy serves it
        return owners[flat, copy].view_as(topk_ids)
