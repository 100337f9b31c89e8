"""Benchmark charts, written as PNG files.

Uses matplotlib's object API (no pyplot), so it needs no display and leaves
the global backend alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from asap.bench.metrics import RequestResult
from asap.bench.report import SPAN_KINDS, check_spans

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
