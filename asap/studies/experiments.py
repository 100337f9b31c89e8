"""Workload helpers shared by the tuner, `asap plan` and `asap ablation` (all results SIMULATED).

The headline lives in asap/studies/headline.py and judges both engines on peer-style SLOs
(asap.workload.slo). The older relative SLO stays here for `asap plan --slo 5x` and the ablation:
a request of L prompt tokens must see its first
token within SLO_SCALE (5) x t_ref(max(L, token_budget)), where t_ref(n) is the TTFT
of an n-token prompt alone on the idle SYNC system of the same device count. So:
- budgets scale with the work a prompt really needs (its L^2 attention included);
- both engines are judged against the same per-request budget;
- no prompt is asked to beat 5x one unloaded full chunk (16K tokens): under any load a
  request waits for at least the step in progress, whatever its own size.
SLO-compliant throughput is the highest request rate (the trace's arrival times rescaled,
asap.workload.Workload's definition) at which >= 90% of requests meet their SLO, found
by asap.measure.rate_search.find_max_rate (bracket, then bisect to 5%).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from asap.scheduler.request import Request
from asap.sim.run import run
from asap.workload.traces import default_trace_path
from asap.workload.workload import Workload

TRACE = default_trace_path()   # shipped in the package; --trace PATH takes the full files
SLO_SCALE = 5.0
TARGET = 0.9
LABEL = "SIMULATED"


def trace_requests(path: str | Path = TRACE, num_requests: int | None = None) -> list[Request]:
    """The trace's first `num_requests` requests at their recorded times (seconds from the first)."""
    return Workload(trace=path, num_requests=num_requests, with_prompts=False).build()


def at_rate(requests: list[Request], rate: float) -> list[Request]:
    """Rescale arrival times so the mean rate, (N-1) / span, is `rate` req/s (Workload's definition)."""
    t0, t1 = requests[0].arrival, requests[-1].arrival
    scale = (len(requests) - 1) / (t1 - t0) / rate if t1 > t0 else 1.0
    out = []
    for r in requests:
        arrival = (r.arrival - t0) * scale
        budget = None if r.deadline is None else r.deadline - r.arrival
        out.append(dataclasses.replace(r, arrival=arrival, deadline=None if budget is None else arrival + budget,
                                       meta=dict(r.meta)))
    return out


def reference_ttft(lengths, model="deepseek-v3", hardware="cloudmatrix384", devices: int = 32,
                   token_budget: int = 16384, **sim_kw) -> np.ndarray:
    """t_ref(L): TTFT of each prompt alone on the idle sync system, interpolated on a log grid."""
    lengths = np.asarray(lengths, dtype=float)
    grid = np.unique(np.geomspace(max(1, lengths.min()), max(2, lengths.max()), 24).round().astype(int))
    ref = [run([Request(0, int(n))], "sync", model, hardware, devices, token_budget=token_budget,
               **sim_kw).results[0].ttft for n in grid]
    return np.interp(lengths, grid, ref)


def with_slo(requests: list[Request], slo_scale: float = SLO_SCALE, token_budget: int = 16384,
             **ref_kw) -> list[Request]:
    """Copies of `requests` with deadline = arrival + slo_scale * t_ref(max(L, token_budget))."""
    lengths = [max(r.num_tokens, token_budget) for r in requests]
    budgets = slo_scale * reference_ttft(lengths, token_budget=token_budget, **ref_kw)
    return [dataclasses.replace(r, deadline=r.arrival + float(b), meta=dict(r.meta)) for r, b in zip(requests, budgets)]
