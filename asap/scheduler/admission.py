"""SLO admission: turn away or deprioritise requests that will miss their TTFT SLO anyway.

A request may finish up to `slack` times its SLO budget (deadline - arrival)
after arrival. If its predicted finish (now + predicted_ttft) is later than that
bound, mode "reject" rejects it and mode "demote" lowers its priority to
DEMOTED_PRIORITY so it runs only when nothing with normal priority waits.
Requests without a deadline are always admitted.
"""
from __future__ import annotations

from dataclasses import dataclass

from asap.scheduler.errors import Rejected
from asap.scheduler.request import Request

MODES = ("off", "reject", "demote")
DEMOTED_PRIORITY = -1


@dataclass(frozen=True)
class AdmissionDecision:
    action: str          # "admit" | "reject" | "demote"
    reason: str = ""


class SLOAdmission:
    def __init__(self, mode: str = "off", slack: float = 2.0):
        if mode not in MODES:
            raise ValueError(f"unknown admission mode {mode!r}; choose one of {', '.join(MODES)}")
        if slack <= 0:
            raise ValueError(f"slack must be > 0, got {slack}")
        self.mode, self.slack = mode, slack

    def decide(self, req: Request, predicted_ttft: float, now: float) -> AdmissionDecision:
        """Pure: says what to do, changes nothing (see `admit` to apply it)."""
        if self.mode == "off" or req.deadline is None:
            return AdmissionDecision("admit")
        finish = now + predicted_ttft
        bound = req.arrival + self.slack * (req.deadline - req.arrival)
        if finish <= bound:
            return AdmissionDecision("admit")
        return AdmissionDecision(self.mode, f"predicted finish {finish:.3f}s > bound {bound:.3f}s")

    def admit(self, req: Request, predicted_ttft: float, now: float) -> AdmissionDecision:
        """decide, then apply: demote sets req.priority; reject raises Rejected."""
        decision = self.decide(req, predicted_ttft, now)
        if decision.action == "reject":
            raise Rejected(f"request {req.id}: {decision.reason}")
        if decision.action == "demote":
            req.priority = DEMOTED_PRIORITY
        return decision
