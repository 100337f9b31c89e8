"""Benchmark charts, written as PNG files.

Uses matplotlib's object API (no pyplot), so it needs no display and leaves
the global backend alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter, ScalarFormatter

from asap.measure.metrics import RequestResult
from asap.measure.report import SPAN_KINDS, check_spans

KIND_COLORS = {"compute": "tab:green", "stall": "tab:red", "idle": "lightgray"}


def _save(fig: Figure, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def plot_ttft_cdf(runs: dict[str, list[RequestResult]], path: str | Path, slo_s: float | None = None) -> None:
    """TTFT CDF per run (label -> results). Failed requests count as never
    finishing, so a run with failures tops out below 1."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for label, results in runs.items():
        ttft_ms = np.sort([r.ttft * 1000 for r in results if r.ok])
        frac = np.arange(1, len(ttft_ms) + 1) / max(len(results), 1)
        ax.step(ttft_ms, frac, where="post", label=label)
    if slo_s is not None:
        ax.axvline(slo_s * 1000, color="k", linestyle="--", linewidth=1, label="SLO")
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", ylim=(0, 1.02), title="TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_attainment_vs_rate(curves: dict[str, list[tuple[float, dict]]], path: str | Path,
                            target: float = 0.9) -> None:
    """SLO attainment vs request rate per engine (label -> find_max_rate()["points"])."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for label, points in curves.items():
        pts = sorted((rate, s["slo_attainment"]) for rate, s in points)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    ax.set(xlabel="request rate (req/s)", ylabel="SLO attainment", ylim=(0, 1.02), title="SLO attainment vs rate")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_timeline(spans: list[dict], path: str | Path) -> None:
    """One row per worker, a bar per span coloured by kind (compute/stall/idle)."""
    check_spans(spans)
    workers = list(dict.fromkeys(s["worker"] for s in spans))
    fig = Figure(figsize=(10, 0.5 * len(workers) + 1.5))
    ax = fig.add_subplot()
    for row, worker in enumerate(workers):
        for kind in SPAN_KINDS:
            bars = [(s["start"], s["end"] - s["start"]) for s in spans if s["worker"] == worker and s["kind"] == kind]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=KIND_COLORS[kind])
    ax.set_yticks(range(len(workers)), workers)
    ax.invert_yaxis()
    ax.set(xlabel="time (s)", title="worker timeline")
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in SPAN_KINDS],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(SPAN_KINDS))
    _save(fig, path)


def plot_demo(runs: dict[str, tuple[list[RequestResult], list[dict]]], path: str | Path, title: str,
              time_label: str = "wall time (s)") -> None:
    """The demo's figure: TTFT CDFs (TTFT in seconds, and TTFT / the request's SLO budget) on top, then
    one worker timeline per run (label -> (results, spans)), so stalls show as red."""
    check_spans([s for _, spans in runs.values() for s in spans])
    rows = [len({s["worker"] for s in spans}) for _, spans in runs.values()]
    fig = Figure(figsize=(11, 3.6 + 0.16 * sum(rows) + 0.8 * len(rows)), layout="constrained")
    grid = fig.add_gridspec(1 + len(runs), 2, height_ratios=[3.2] + [0.16 * r + 0.8 for r in rows])
    cdf, budget = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    for label, (results, _) in runs.items():
        n = max(len(results), 1)
        ttft = np.sort([r.ttft for r in results if r.ok])
        cdf.step(ttft, np.arange(1, len(ttft) + 1) / n, where="post", label=label)
        used = np.sort([r.ttft / r.deadline_s for r in results if r.ok and r.deadline_s])
        budget.step(used, np.arange(1, len(used) + 1) / n, where="post", label=label)
    budget.axvline(1.0, color="k", linestyle="--", linewidth=1, label="SLO")
    cdf.set(xlabel="TTFT (s)", ylabel="fraction of requests", ylim=(0, 1.02), title="TTFT CDF")
    budget.set(xlabel="TTFT / the request's SLO budget (1 = just in time)", ylim=(0, 1.02),
               title="SLO budget used (CDF)", xscale="log")
    budget.xaxis.set_major_formatter(ScalarFormatter())
    budget.xaxis.set_minor_formatter(NullFormatter())
    for ax in (cdf, budget):
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    end = max((s["end"] for _, spans in runs.values() for s in spans), default=1.0)
    for i, (label, (_, spans)) in enumerate(runs.items()):
        ax = fig.add_subplot(grid[1 + i, :])
        workers = sorted({s["worker"] for s in spans}, key=lambda w: (w.rstrip("0123456789"),
                                                                      int(w[len(w.rstrip("0123456789")):] or 0)))
        for row, worker in enumerate(workers):
            for kind in SPAN_KINDS:
                bars = [(s["start"], s["end"] - s["start"]) for s in spans if s["worker"] == worker and s["kind"] == kind]
                if bars:
                    ax.broken_barh(bars, (row - 0.45, 0.9), facecolors=KIND_COLORS[kind])
        ax.set_yticks(range(len(workers)), workers, fontsize=6)
        ax.invert_yaxis()
        ax.set(xlim=(0, end), title=f"{label}: worker timeline (green compute, red stall, grey idle)")
    fig.axes[-1].set_xlabel(time_label)
    fig.suptitle(title)
    _save(fig, path)
