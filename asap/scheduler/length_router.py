"""A length-aware fleet's router: prompts of at least `min_tokens` go to the wide replicas (wide attention TP,
fast on long prompts), shorter ones to the narrow replicas (TP1-like: cheap per token, no all-reduce); inside
each group the group's own router picks, with the group's own cost function.

The split is by the prompt's length alone: a long prompt on a narrow replica holds its queue for a long
time (a 32K prompt alone takes ~17 s on one CloudMatrix384 die, SIMULATED), and a short one on a wide
replica pays the all-reduce on few tokens.
"""
from __future__ import annotations

from asap.scheduler.request import Request
from asap.scheduler.router import ReplicaLoad, Router


class LengthRouter:
    def __init__(self, narrow: Router, wide: Router, wide_ids: "set[int] | frozenset[int]", min_tokens: int):
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        if not wide_ids:
            raise ValueError("a length-aware fleet needs at least one wide replica")
        self.narrow, self.wide, self.wide_ids, self.min_tokens = narrow, wide, frozenset(wide_ids), min_tokens

    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int:
        wide = req.num_tokens >= self.min_tokens
        group = [l for l in loads if (l.index in self.wide_ids) == wide]
        if not group:           # every replica is of the other kind
            group = loads
        return (self.wide if wide else self.narrow).route(req, group, now)
