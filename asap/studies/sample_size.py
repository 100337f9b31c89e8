"""How many requests a search at N devices needs, so that its maximum is a steady state and not a burst.

A rate search counts a rate only where the requests' arrivals span at least BURST_SPAN_FACTOR x their mean
SLO budget (asap.measure.rate_search.burst_limit); above that rate it says "use more requests". No engine
sustains more than the work ceiling (asap.studies.bound), so requests enough for that span at MARGIN x the
ceiling let every engine's maximum be measured, at any device count:

    n = BURST_SPAN_FACTOR x mean budget (s) x ceiling (req/s) x MARGIN, rounded up to STEP, at least a floor.

Conversation at 32 dies (ceiling ~3.6 req/s, mean budget ~14 s) needs ~630, so the floor (the headline's
1,500) holds; fixed 4K prompts at 32 dies (37 req/s, 6.1 s) need 3,000, conversation at 384 dies 9,500:
the sizes earlier runs found by trial ("use more requests", then more). Very short prompts on many dies
would need millions (64-token prompts at 384 dies: ~990,000), so a size stops at MAX_REQUESTS; the headline
then warns that the row may end "use more requests".
"""
from __future__ import annotations

import math
from typing import Callable

from asap.measure.rate_search import BURST_SPAN_FACTOR
from asap.scheduler.request import Request
from asap.studies.bound import work_bound

MARGIN = 1.25       # headroom above the ceiling for a search's bracket
STEP = 500          # sizes are rounded up to a multiple of this
ROUNDS = 3          # the mean budget and ceiling are re-read on the larger sample this many times at most
MAX_REQUESTS = 100_000      # a larger sample would take hours per simulation on two cores


def requests_needed(requests: list[Request], devices: int, cost) -> int:
    """Requests whose arrivals span BURST_SPAN_FACTOR x the mean budget of `requests` (deadlines set) at
    MARGIN x their work ceiling on `devices` devices (asap.studies.bound.work_bound with `cost`)."""
    if not requests:
        raise ValueError("requests_needed needs at least one request")
    if any(r.deadline is None for r in requests):
        raise ValueError("requests_needed needs requests with deadlines (an SLO applied)")
    budget = sum(r.deadline - r.arrival for r in requests) / len(requests)
    ceiling = work_bound(requests, devices, cost)["ceiling"][devices]
    return math.ceil(BURST_SPAN_FACTOR * budget * ceiling * MARGIN) + 1


def sample_size(requests_of: Callable[[int], list[Request]], devices: int, cost, floor: int,
                most: int = MAX_REQUESTS) -> int:
    """The requests a search on `devices` devices needs: `floor`, or more where requests_needed says so, read on
    the larger sample itself (a trace's later requests may be longer), rounded up to STEP, at most `most`.
    requests_of(n): the workload's first n requests with their deadlines."""
    if not 2 <= floor <= most:
        raise ValueError(f"the floor must be >= 2 requests and at most {most}, got {floor}")
    n = floor
    for _ in range(ROUNDS):
        need = requests_needed(requests_of(n), devices, cost)
        if need <= n:
            return n
        n = min(most, STEP * math.ceil(need / STEP))
        if n == most:
            return n
    return n
