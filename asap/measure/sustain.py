"""Whether a finite run's rate is one the engine sustains: the drain after the last arrival.

A rate search simulates a finite run and asks whether enough requests met their deadline. Past capacity a
queue grows over the run, and a short run can still pass; when the growing queue is confined to one group
(the longest prompts on a length-aware fleet's wide replicas, 2% of the requests but a third of the work on
the Mooncake conversation trace) even a long run passes at 90% of requests, and its attainment by arrival
third stays flat. What gives it away is the end: at a sustained rate what arrives last finishes within
about its TTFT budget, while a run over capacity goes on long after its last arrival, draining the queue.
So a run is `sustained` when the drain is no longer than the longest TTFT budget among its requests.
"""
from __future__ import annotations

from asap.measure.metrics import RequestResult


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
