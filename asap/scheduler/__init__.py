"""Scheduling policies: small pure-Python objects shared by the async engine,
the sync DP+EP baseline and the simulator. No torch, no processes, no clock:
time always comes in as `now`.

- router:        which attention replica a new request joins
- replica:       which prompt tokens a replica prefills next (chunked prefill)
- microbatch:    how one replica step splits into micro-batches, and how many
- expert_select: which ready work items an expert worker runs next
- placement:     which expert workers hold which experts (EPLB-style copies)
- admission:     SLO-based reject / demote
- cost:          predicted prefill time of a batch (for routing and admission)
"""
from asap.scheduler.admission import DEMOTED_PRIORITY, AdmissionDecision, SLOAdmission
from asap.scheduler.cost import DEFAULT_COST, CostFn, linear_cost
from asap.scheduler.errors import QueueFull, Rejected
from asap.scheduler.expert_select import (AggregationWindow, DeadlineFirst, FullestLayer, LargestFirst, OldestFirst,
                                          Selector, WorkInfo, make_selector)
from asap.scheduler.microbatch import AdaptiveDepth, Chunk, split_microbatches
from asap.scheduler.placement import (Placement, ReplicaChooser, RoutingStats, balanced_placement,
                                      contiguous_placement)
from asap.scheduler.replica import ReplicaScheduler
from asap.scheduler.request import Request
from asap.scheduler.router import (LeastRequestsRouter, LeastTokensRouter, QueueAwareRouter, ReplicaLoad,
                                   RoundRobinRouter, Router, make_router)

__all__ = [
    "AdaptiveDepth", "AdmissionDecision", "AggregationWindow", "Chunk", "CostFn", "DEFAULT_COST",
    "DEMOTED_PRIORITY", "DeadlineFirst", "FullestLayer", "LargestFirst", "LeastRequestsRouter", "LeastTokensRouter",
    "OldestFirst", "Placement", "QueueAwareRouter", "QueueFull", "Rejected", "ReplicaChooser", "ReplicaLoad",
    "ReplicaScheduler", "Request", "RoundRobinRouter", "Router", "RoutingStats", "SLOAdmission", "Selector",
    "WorkInfo", "balanced_placement", "contiguous_placement", "linear_cost", "make_router", "make_selector",
    "split_microbatches",
]
