"""What the cost model needs to know of an expert placement (asap.sim.experts builds it)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ExpertShares:
    num_workers: int
    max_share: tuple[float, ...]    # per MoE layer: max over workers of its fraction of top-k assignments
    slots: int                      # expert copies per worker per layer
    # per-batch drawn loads (asap.cost.loads.StepLoads), or None: every batch gets the expected max_share
    draws: object = field(default=None, compare=False, repr=False)
