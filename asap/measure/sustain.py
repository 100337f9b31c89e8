"""Whether a finite run's rate is one the engine sustains: the drain after the last arrival, and the
attainment of each third of the run by arrival.

A rate search simulates a finite run and asks whether enough requests met their deadline. Past capacity a
queue grows over the run, and a short run can still pass; when the growing queue is confined to one group
(the longest prompts on a length-aware fleet's wide replicas, 2% of the requests but a third of the work on
the Mooncake conversation trace) even a long run passes at 90% of requests, and its attainment by arrival
third stays flat. What gives it away is the end: at a sustained rate what arrives last finishes within
about its TTFT budget, while a run over capacity goes on long after its last arrival, draining the queue.
So a run is `sustained` when the drain is no longer than the longest TTFT budget among its requests.

The drain alone misses a queue that every request shares, when budgets differ: on a short-prompt trace (mean
2K tokens, budgets of 2 s + 1 ms/token, the longest 29 s) a run of 2,000 requests just past capacity drains
in 4 s and meets 91% overall, while its last third of arrivals meets 78%; twice the requests fail. So the
"-sustained" criteria also take the worst arrival third (`sustained_value`): the target must hold in each
third of the run, not only on average over a run that started empty.
"""
from __future__ import annotations

from asap.measure.metrics import RequestResult, summarize

# What a stored search under the "-sustained" criteria assumed (asap.studies.headline records it; a resume
# across rules is refused). Runs before 2026-12-03's thirds were recorded as `true`: the drain alone.
RULE = "drain within the longest TTFT budget after the last arrival; the target in each arrival third"


def drain(results: list[RequestResult]) -> dict:
    """{"drain_s": how long the run went on after its last arrival (the last first token), "max_budget_s": the
    longest TTFT budget of its requests}; both None where no request succeeded or none has a budget."""
    done = [r.arrival + r.ttft for r in results if r.ok]
    budgets = [r.deadline_s for r in results if r.deadline_s is not None]
    if not done or not budgets:
        return {"drain_s": None, "max_budget_s": None}
    return {"drain_s": max(0.0, max(done) - max(r.arrival for r in results)), "max_budget_s": max(budgets)}


def sustained(results: list[RequestResult]) -> bool:
    """Whether the run drained within its longest TTFT budget after its last arrival (module docstring)."""
    d = drain(results)
    return d["drain_s"] is not None and d["drain_s"] <= d["max_budget_s"]


def by_arrival_third(results: list[RequestResult]) -> list[float | None]:
    """SLO attainment of the first, middle and last third of the requests by arrival (None for an empty third
    or one without deadlines). At a rate the engine sustains they agree up to sampling noise; where the last
    is far below the first, the queue grew over the run."""
    rs = sorted(results, key=lambda r: r.arrival)
    n = len(rs)
    return [summarize(part)["slo_attainment"] if part else None
            for part in (rs[:n // 3], rs[n // 3:2 * n // 3], rs[2 * n // 3:])]


def sustained_value(results: list[RequestResult], value: float | None) -> float:
    """`value` (an attainment a criterion compares with its target) as far as the run sustains it: the lowest
    of it and each arrival third's attainment, or 0.0 where the run did not drain within its longest budget."""
    if value is None or not sustained(results):
        return 0.0
    return min([value] + [a for a in by_arrival_third(results) if a is not None])
