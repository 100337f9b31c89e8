"""EMULATED: a DeepSeek-V3 cluster as real worker processes, compute timed from the cost model.

Every device is a worker process (an attention TP group is one process that stands for its devices);
requests, dispatch/combine and the sync barrier are real messages over shared memory. Only the compute
and the link are replaced: each op waits for the time the cost model gives for a CloudMatrix384-like die
(`compute="emulated"`, `hardware="cloudmatrix384"`), and each message is delivered when the profile's link
would deliver it (asap/workers/emulation/link.py), both stretched by `dilation` so that this CPU's own overheads stay
small against them (figures are reported in emulated-hardware time).

Both engines run in their best-tuned configuration for this workload and cluster, from the tuner
(asap/demo/tuning.py: asap.studies.tune, restricted to what the runtime can emulate).
"""
from __future__ import annotations

import dataclasses
import re
import time
import warnings

from asap.bench.runner import Run
from asap.measure.metrics import summarize
from asap.bench.targets import EngineTarget
from asap.config import RuntimeConfig
from asap.demo.load import FLAG_MARGIN, MAX_RAISE, contention, flag, machine_load, raised_dilation
from asap.demo.settings import DemoSettings, demo_requests
from asap.demo.tuning import rate_text, tuned_configs, worker_processes
from asap.studies.deploy import runtime_config


def runtime_for(c, s: DemoSettings, devices: int) -> RuntimeConfig:
    """The runtime configuration of a tuned EngineConfig, with emulated compute."""
    from asap.sim.run import get_model
    return runtime_config(c, devices, get_model(s.model).num_experts, compute="emulated", hardware=s.hardware,
                          dilation=s.dilation, comm_timeout_s=120.0)


def run_emulated(s: DemoSettings, log, retune: bool = False) -> tuple[dict, list[Run]]:
    t0 = time.monotonic()
    load = machine_load()
    base, s = s.dilation, dataclasses.replace(s, dilation=raised_dilation(s.dilation, load))
    log(f"EMULATED: load average {load.load_avg:.1f} on {load.cores} cores: dilation {s.dilation:g}"
        + (f" (raised from {base:g})" if s.dilation != base else ""))
    tuned = tuned_configs(s, s.devices, emulatable_only=True, retune=retune)
    requests = demo_requests(s, s.devices, s.num_requests, s.rate)
    out = {"devices": s.devices, "model": s.model, "hardware": s.hardware, "dilation": s.dilation,
           "base_dilation": base, "load_avg_before": load.load_avg, "cores": load.cores,
           "num_requests": len(requests), "rate": s.rate, "length_scale": s.length_scale,
           "max_tokens": s.max_tokens, "tuned": tuned["tuning"],
           "tuned_source": tuned["source"], "notes": [],
           "tune_s": time.monotonic() - t0, "engines": {}}
    runs = []
    for engine in ("sync", "async"):
        runtime = runtime_for(tuned[engine], s, s.devices)
        procs = worker_processes(tuned[engine], s.devices)
        log(f"EMULATED: {engine}: starting {procs} worker processes for {s.devices} dies "
            f"({tuned[engine].describe(s.devices)})")
        target = EngineTarget(engine, s.model, runtime, progress=False)
        try:
            log(f"EMULATED: {engine}: {len(requests)} requests at {s.rate:g} req/s "
                f"(~{(requests[-1].arrival + 2) * s.dilation:.0f} s of wall time at dilation {s.dilation:g})")
            before = contention()
            t1 = time.monotonic()
            with warnings.catch_warnings(record=True) as caught:     # the replay's lag becomes a figure, not a
                warnings.simplefilter("always")                      # raw warning with a file path
                results = target.run(requests)
            wall = time.monotonic() - t1
            worst = max(before, contention())
            lag_ms = replay_lag_ms(caught, out["notes"], s.dilation)
            summary = summarize(results)
            runs.append(Run(f"{engine} (EMULATED)", s.rate, results, summary, target.workers(), target.spans(), wall))
            out["engines"][engine] = {"runtime": dataclasses.asdict(runtime), "summary": summary,
                                      "contention": worst, "replay_lag_ms": lag_ms,
                                      "flag": flag(s.dilation, base, worst, lag_ms, summary["ttft_p50_ms"]),
                                      "workers": target.workers(), "startup_s": target.startup_s, "wall_s": wall,
                                      "stall_fraction": mean_fraction(target.workers(), "stall")}
        finally:
            target.close()
    out["flag"] = merge_flags({e: r["flag"] for e, r in out["engines"].items()})
    out["wall_s"] = time.monotonic() - t0
    return out, runs


def merge_flags(flags: dict[str, str | None]) -> str | None:
    """One line: each reason once, after the engines it concerns ("sync, async: ...")."""
    engines: dict[str, list[str]] = {}
    for engine, text in flags.items():
        for reason in (text.split("; ") if text else ()):
            engines.setdefault(reason, []).append(engine)
    return "; ".join(f"{', '.join(es)}: {reason}" for reason, es in engines.items()) or None


def replay_lag_ms(caught, notes: list[str], dilation: float) -> float | None:
    """The replay's lag from its warning, in emulated time; any other warning is kept as a note."""
    lag = None
    for w in caught:
        m = re.search(r"fell behind schedule by up to (\d+) ms", str(w.message))
        if m:
            lag = float(m.group(1)) / dilation
        else:
            notes.append(f"{w.category.__name__}: {w.message}")
    return lag


def mean_fraction(workers: dict, kind: str, prefix: str = "") -> float | None:
    xs = [f[kind] for w, f in workers.items() if w.startswith(prefix)]
    return sum(xs) / len(xs) if xs else None


def format_emulated(e: dict) -> list[str]:
    lines = [f"{e['model']} on {e['devices']} CloudMatrix384-like dies: {e['num_requests']} requests, Poisson at "
             f"{e['rate']:g} req/s, Mooncake prompt lengths{_lengths(e)}; dilation {e['dilation']:g} (times below are "
             f"emulated-hardware time)",
             f"best-tuned configurations (SIMULATED search by asap.studies.tune over the emulatable candidates, "
             f"{e['tuned_source']}):"]
    for engine, t in e["tuned"].items():
        lines.append(f"  {engine:<5} {t['describe']}  (SIMULATED SLO-compliant rate {rate_text(t, 2)}, "
                     f"best of {t['candidates']})")
    lines.append(load_line(e))
    if e.get("flag"):
        lines.append(f"FLAGGED: the figures below are not trusted ({e['flag']}); compare with the simulator's "
                     f"replay of this run in part 3")
    head = f"{'':<18}{'SLO attainment':>15}{'TTFT p50':>10}{'p90':>9}{'p99':>9}{'max':>9}{'req/s':>8}{'stall':>8}"
    lines.append(head)
    for engine, r in e["engines"].items():
        m = r["summary"]
        lines.append(f"{engine + ' (EMULATED)':<18}{m['slo_attainment']:>15.2f}{_s(m['ttft_p50_ms'])}"
                     f"{_s(m['ttft_p90_ms'], 9)}{_s(m['ttft_p99_ms'], 9)}{_s(m['ttft_max_ms'], 9)}"
                     f"{m['request_throughput']:>8.2f}{r['stall_fraction']:>8.0%}")
    lines.append("stall = mean fraction of the run each worker spent waiting on a peer (sync: the barrier at "
                 "every MoE layer)")
    lines += [f"note: {n}" for n in e.get("notes", [])]
    return lines


def _lengths(e: dict) -> str:
    return f" x {e['length_scale']:g}, at most {e['max_tokens']:,} tokens"


def load_line(e: dict) -> str:
    raised = f", raised from {e['base_dilation']:g}" if e["dilation"] != e["base_dilation"] else \
        f", not raised: no raise up to x{MAX_RAISE:g} covers this load" \
        if e["load_avg_before"] / e["cores"] > MAX_RAISE * FLAG_MARGIN else ""
    lags = [f"{k} {r['replay_lag_ms']:.0f} ms" for k, r in e["engines"].items() if r["replay_lag_ms"] is not None]
    return (f"machine: load average {e['load_avg_before']:.1f} on {e['cores']} cores before this part (dilation "
            f"{e['dilation']:g}{raised}); CPU contention around the runs "
            + ", ".join(f"x{r['contention']:.1f} ({k})" for k, r in e["engines"].items())
            + (f"; replay behind schedule by up to {', '.join(lags)} (emulated time)" if lags else ""))


def _s(ms, width: int = 10) -> str:
    return f"{'-':>{width}}" if ms is None else f"{ms / 1000:>{width - 1}.2f}s"
