"""SLO-compliant throughput and the headline async-vs-sync sweep (all results SIMULATED).

TTFT SLO (our choice, documented): a request of L prompt tokens must see its first
token within SLO_SCALE (5) x t_ref(max(L, token_budget)), where t_ref(n) is the TTFT
of an n-token prompt alone on the idle SYNC system of the same device count. So:
- budgets scale with the work a prompt really needs (its L^2 attention included);
- both engines are judged against the same per-request budget;
- no prompt is asked to beat 5x one unloaded full chunk (16K tokens): under any load a
  request waits for at least the step in progress, whatever its own size.
SLO-compliant throughput is the highest request rate (the trace's arrival times rescaled,
asap.workload.Workload's definition) at which >= 90% of requests meet their SLO, found
by asap.bench.rate_search.find_max_rate (bracket, then bisect to 5%).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from asap.bench.metrics import summarize
from asap.bench.rate_search import find_max_rate
from asap.scheduler.request import Request
from asap.sim.run import run
from asap.sim.trace_export import write_trace
from asap.workload.workload import Workload

TRACE = Path("/work/shared/traces/mooncake_conversation.jsonl")
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


def capacity_guess(requests: list[Request], engine: str, devices: int, **sim_kw) -> float:
    """Requests/s a fully loaded system would roughly sustain: one closed batch, all arriving at 0."""
    sample = [dataclasses.replace(r, arrival=0.0, deadline=None) for r in requests[:max(2 * devices, 64)]]
    res = run(sample, engine, devices=devices, **sim_kw)
    return len(sample) / max(r.ttft for r in res.results)


def slo_throughput(requests: list[Request], engine: str, devices: int, target: float = TARGET, tol: float = 0.05,
                   **sim_kw) -> dict:
    """Highest rate (req/s) with >= target of requests within their deadline; `requests` carry deadlines."""
    tokens = sum(r.num_tokens for r in requests)
    info = {}

    def measure(rate: float) -> dict:
        res = run(at_rate(requests, rate), engine, devices=devices, **sim_kw)
        info.update(attention_workers=res.attention_workers, expert_workers=res.expert_workers)
        info["events"] = info.get("events", 0) + res.num_events
        info["wall_s"] = info.get("wall_s", 0.0) + res.wall_s
        return summarize(res.results)

    lo = 0.5 * capacity_guess(requests, engine, devices, **sim_kw)
    search = find_max_rate(measure, target=target, lo=lo, tol=tol)
    rate = search["max_slo_rate"]
    return {"engine": engine, "devices": devices, "max_slo_rate": rate,
            "input_tokens_per_s": rate * tokens / len(requests),
            "input_tokens_per_s_per_device": rate * tokens / len(requests) / devices,
            "converged": search["converged"],
            "points": [{"rate": r, "slo_attainment": s["slo_attainment"], "ttft_p50_ms": s["ttft_p50_ms"],
                        "ttft_p90_ms": s["ttft_p90_ms"]} for r, s in search["points"]],
            **info}


def run_headline(device_counts=(32, 64, 128, 384), num_requests: int | None = None, model="deepseek-v3",
                 hardware="cloudmatrix384", trace: str | Path = TRACE, slo_scale: float = SLO_SCALE,
                 out_dir: str | Path | None = "out/sim_headline", tol: float = 0.05, verbose: bool = True,
                 max_prompt: int | None = None, trace_s: float = 2.0, **sim_kw) -> dict:
    """Async vs sync SLO-compliant throughput at equal device counts; JSON + plots in out_dir.

    num_requests: the trace's first N requests (default: 40 per device, at most the whole trace).
    max_prompt: clip prompt lengths (the trace's tail reaches 126K tokens), for a sensitivity check.
    Also writes Chrome/Perfetto traces of both engines, `trace_s` seconds from the middle of the run, at
    the first device count and the async SLO-compliant rate.
    sim_kw go to asap.sim.run.run for both engines (engine-specific ones, e.g. microbatches, are
    ignored by the sync engine).
    """
    t_start = time.perf_counter()
    base = trace_requests(trace)
    if max_prompt is not None:
        base = [dataclasses.replace(r, num_tokens=min(r.num_tokens, max_prompt)) for r in base]
    rows = []
    for devices in device_counts:
        n = min(len(base), num_requests or 40 * devices)
        reqs = with_slo(base[:n], slo_scale, sim_kw.get("token_budget", 16384), model=model, hardware=hardware,
                        devices=devices)
        row = {"devices": devices, "num_requests": n}
        for engine in ("sync", "async"):
            kw = dict(sim_kw) if engine == "async" else {k: v for k, v in sim_kw.items() if k in _SYNC_KW}
            row[engine] = slo_throughput(reqs, engine, devices, tol=tol, model_cfg=model, hardware=hardware, **kw)
        s, a = row["sync"]["max_slo_rate"], row["async"]["max_slo_rate"]
        row["ratio"] = a / s if s > 0 else None      # None: sync met the SLO at no rate tried
        rows.append(row)
        if verbose:
            print(f"[{LABEL}] {devices:4d} devices, {n} requests: SLO-compliant throughput sync {s:.2f} req/s "
                  f"({row['sync']['input_tokens_per_s_per_device']:.0f} tok/s/device), async {a:.2f} req/s "
                  f"({row['async']['input_tokens_per_s_per_device']:.0f} tok/s/device, "
                  f"A={row['async']['attention_workers']} E={row['async']['expert_workers']}); "
                  f"async/sync = {_ratio(row['ratio'])}", flush=True)
    out = {"label": LABEL, "model": str(model), "hardware": str(hardware), "trace": str(trace),
           "max_prompt": max_prompt, "sim_kw": {k: str(v) for k, v in sim_kw.items()},
           "slo": f"deadline = arrival + {slo_scale} x t_ref(max(L, token_budget)); t_ref = idle sync TTFT",
           "target_attainment": TARGET, "rows": rows, "wall_s": time.perf_counter() - t_start}
    if out_dir is not None:
        write_headline(out, out_dir)
        first = rows[0]
        if first["async"]["max_slo_rate"] > 0:
            reqs = at_rate(with_slo(base[:first["num_requests"]], slo_scale, sim_kw.get("token_budget", 16384),
                                    model=model, hardware=hardware, devices=first["devices"]),
                           first["async"]["max_slo_rate"])
            mid = reqs[len(reqs) // 2].arrival
            for engine in ("sync", "async"):
                kw = dict(sim_kw) if engine == "async" else {k: v for k, v in sim_kw.items() if k in _SYNC_KW}
                res = run(reqs, engine, model, hardware, first["devices"], trace_window=(mid, mid + trace_s), **kw)
                write_trace(res.spans, Path(out_dir) / f"trace_{engine}_{first['devices']}.json")
    return out


def _ratio(r: float | None) -> str:
    return "n/a (sync met the SLO at no rate)" if r is None else f"{r:.2f}x"


_SYNC_KW = {"token_budget", "router", "order", "max_queue", "two_batch_overlap", "expert_loads", "zipf",
            "redundant_experts", "seed"}


def write_headline(out: dict, out_dir: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "headline.json").write_text(json.dumps(out, indent=2) + "\n")
    rows = out["rows"]
    devs = [r["devices"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for engine in ("sync", "async"):
        ax1.plot(devs, [r[engine]["input_tokens_per_s_per_device"] for r in rows], "o-", label=engine)
    ax1.set(xscale="log", xlabel="devices", ylabel="SLO-compliant input tokens/s per device",
            title=f"{LABEL}: {out['model']} on {out['hardware']}")
    ax1.legend()
    ax2.plot(devs, [r["ratio"] if r["ratio"] is not None else np.nan for r in rows], "o-", color="C2")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set(xscale="log", xlabel="devices", ylabel="async / sync", title=f"{LABEL}: SLO-compliant throughput ratio")
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    if ratios and max(ratios) > 10 * min(ratios + [1.0]):
        ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.minorticks_off()
        ax.set_xticks(devs, [str(x) for x in devs])
    fig.tight_layout()
    fig.savefig(d / "headline.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.5), squeeze=False)
    for ax, r in zip(axes[0], rows):
        for engine in ("sync", "async"):
            pts = sorted((p["rate"], p["slo_attainment"]) for p in r[engine]["points"])
            ax.plot(*zip(*pts), "o-", label=engine)
        ax.axhline(out["target_attainment"], color="gray", lw=0.8, ls="--")
        ax.set(xlabel="request rate (req/s)", ylabel="SLO attainment", title=f"{LABEL}: {r['devices']} devices")
        ax.legend()
    fig.tight_layout()
    fig.savefig(d / "attainment.png", dpi=120)
    plt.close(fig)
