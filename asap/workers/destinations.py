"""Where an attention replica sends each (token, expert) pair: the expert worker holding that expert.

With plain EP each expert has one home and this is a table lookup. With
redundant copies (EPLB-style placement) each pair goes to the least-loaded
copy, as chosen by the shared ReplicaChooser policy.
"""
from __future__ import annotations

import torch

from asap.scheduler.placement import Placement, ReplicaChooser


class Destinations:
    def __init__(self, placement: Placement, first_rank: int):
        self.first_rank = first_rank
        self.chooser = ReplicaChooser(placement)
        self.tables = {layer: torch.tensor([r[0] for r in reps], dtype=torch.long) + first_rank
                       for layer, reps in enumerate(placement.replicas) if all(len(r) == 1 for r in reps)}

    def __call__(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        """topk_ids [T,K] -> transport rank per pair [T,K]."""
        table = self.tables.get(layer)
        if table is not None:
            return table[topk_ids]
        ranks = self.chooser.choose(layer, topk_ids.reshape(-1).tolist())
        return (torch.tensor(ranks, dtype=torch.long) + self.first_rank).view_as(topk_ids)
