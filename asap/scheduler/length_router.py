"""A length-aware fleet's router: prompts of at least `min_tokens` go to the wide replicas (wide attention TP,
fast on long prompts), shorter ones to the narrow replicas (TP1-like: cheap per token, no all-reduce); inside
each group the group's own router picks, with the group's own cost function.

The group is chosen by the prompt's length: a long prompt on a narrow replica holds its queue for a long
time (a 32K prompt alone takes ~17 s on one CloudMatrix384 die, SIMULATED), and a short one on a wide
replica pays the all-reduce on few tokens. By length alone, though, the group that saturates first makes
its prompts miss while the other has room. So where both groups' routers predict finish times
(QueueAwareRouter.predict) and the request has a deadline, a request whose own group's best replica is
predicted to miss it overflows to the other group's best, if that one is predicted to meet it
(`overflow=False`: by length alone; `one_way=True`: only the short prompts overflow, a long one never enters
the narrow group).

The same router makes a short-prompt lane (`one_way=True`, narrow = the lane): a few replicas that take only
prompts under a few thousand tokens, so that no short prompt waits behind a long prompt's step there (a TP1
replica's 8K-token step takes seconds, a short prompt's budget is ~3 s). It nests: a LengthRouter predicts
(`predict`) with the router of the group a replica belongs to, so one can be another's narrow group.
"""
from __future__ import annotations

from asap.scheduler.request import Request
from asap.scheduler.router import ReplicaLoad, Router


class LengthRouter:
    def __init__(self, narrow: Router, wide: Router, wide_ids: "set[int] | frozenset[int]", min_tokens: int,
                 overflow: bool = True, one_way: bool = False):
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        if not wide_ids:
            raise ValueError("a length-aware fleet needs at least one wide replica")
        self.narrow, self.wide, self.wide_ids, self.min_tokens = narrow, wide, frozenset(wide_ids), min_tokens
        self.can_predict = all(getattr(r, "can_predict", hasattr(r, "predict")) for r in (narrow, wide))
        self.overflow = overflow and self.can_predict
        self.one_way = one_way
        self.num_overflowed = 0

    def route(self, req: Request, loads: list[ReplicaLoad], now: float) -> int:
        wide = req.num_tokens >= self.min_tokens
        own = [l for l in loads if (l.index in self.wide_ids) == wide]
        other = [l for l in loads if (l.index in self.wide_ids) != wide]
        if not own:             # every replica is of the other kind
            own, other = loads, []
        mine, theirs = (self.wide, self.narrow) if wide else (self.narrow, self.wide)
        pick = mine.route(req, own, now)
        if not self.overflow or req.deadline is None or not other or (wide and self.one_way):
            return pick
        if mine.predict(req, next(l for l in own if l.index == pick), now) <= req.deadline:
            return pick
        alt = theirs.route(req, other, now)
        if theirs.predict(req, next(l for l in other if l.index == alt), now) <= req.deadline:
            self.num_overflowed += 1
            return alt
        return pick

    def predict(self, req: Request, load: ReplicaLoad, now: float) -> float:
        """Predicted finish of `req` on `load`'s replica, by the router of the replica's group."""
        return (self.wide if load.index in self.wide_ids else self.narrow).predict(req, load, now)
