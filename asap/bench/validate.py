"""`asap sim validate`: one workload three ways, to check the simulator and the CPU profile.

  EMULATED   the async runtime with compute="emulated": real processes, messages, scheduling and
             queues; every stage is a wait from the cost table (asap.workers.costs) on the profile
  SIMULATED  the simulator with the same profile, layout and policies, on the same requests
             (same arrival times and lengths)
  REAL       the async runtime with compute="real" (float32, `threads` torch threads per worker)

Layout: A attention + E expert workers (default 1 + 1, two devices). With dilation d the emulated
waits are d times longer; its arrivals are stretched by d and its TTFTs divided by d, so all three
runs share one clock. Errors are relative, (x - ref) / ref, on mean, P50 and P90 TTFT:
SIMULATED vs EMULATED (does the simulator match the runtime it models?), SIMULATED vs REAL and
EMULATED vs REAL (does the profile match this machine?). Targets: 10% on the mean, 15% on P90;
they are reported, never enforced. Each runtime run also reports the machine's CPU use (its own
and other processes') and how long its threads waited for a CPU: on a shared machine the REAL
run's TTFTs grow with the neighbours' load, which no profile can foresee.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from asap.measure.metrics import summarize
from asap.config import RuntimeConfig
from asap.sim.hardware import Hardware, cpu_profile_path, get_hardware
from asap.workload import Poisson, Uniform, Workload

LABELS = ("EMULATED", "SIMULATED", "REAL")
PAIRS = (("SIMULATED", "EMULATED"), ("SIMULATED", "REAL"), ("EMULATED", "REAL"))
TARGETS = {"ttft_mean_ms": 0.10, "ttft_p90_ms": 0.15}
STATS = ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms")


def profile_path(hardware: str) -> Path | str:
    """"cpu" as a concrete file (the measured profile if there is one), so that every process, the
    workers included, reads the same one; a built-in name or a path as given."""
    return cpu_profile_path() if hardware == "cpu" else hardware


def request_seconds(cost, num_tokens: int, expert_workers: int) -> tuple[float, float]:
    """(attention replica, expert pool) busy seconds for one lone prompt, by the cost model."""
    from asap.workers.costs import CostTable
    m, L = cost.model, num_tokens
    attention = sum(cost.attention_seconds(moe, L, L * (L + 1) // 2, L) for moe in m.moe_layers)
    pairs = L * m.top_k // expert_workers                 # per worker, routing spread evenly
    experts = sum(m.moe_layers) * CostTable(cost).experts(pairs, min(m.num_experts // expert_workers, pairs))
    return attention, experts


def workload(model_cfg, hw: Hardware, num_requests: int, rate: float | None, utilization: float,
             min_tokens: int, max_tokens: int, seed: int, attention_workers: int, expert_workers: int):
    """Poisson arrivals, uniform lengths. Without `rate`: the rate that keeps the busier side (attention
    replicas or expert pool, by the cost model) `utilization` busy."""
    from asap.sim.cost import CostModel
    base = Workload(arrivals=Poisson(1.0), lengths=Uniform(min_tokens, max_tokens), num_requests=num_requests,
                    seed=seed, vocab_size=model_cfg.vocab_size)
    if rate is None:
        cost = CostModel(model_cfg, hw)
        busy = [request_seconds(cost, r.num_tokens, expert_workers) for r in base.build()]
        per_request = max(sum(a for a, _ in busy) / attention_workers, sum(e for _, e in busy)) / len(busy)
        rate = utilization / per_request
    return dataclasses.replace(base, rate=rate), rate


def engine_results(model: str, runtime: RuntimeConfig, requests, dilation: float, progress: bool,
                   machine: dict, label: str):
    """Replay on a started runtime; with dilation d, arrivals x d in, TTFTs / d out. One prompt of the
    longest length goes first, so first-call costs at full size (allocations, page faults) stay out.
    The machine's CPU use during the replay goes into machine[label]."""
    from asap.bench.targets import EngineTarget
    target = EngineTarget("async", model, runtime, progress=progress)
    try:
        target.prefill_seconds(max(r.num_tokens for r in requests))
        stretched = [dataclasses.replace(r, arrival=r.arrival * dilation, deadline=None) for r in requests]
        with cpu_use(machine, label):
            results = target.run(stretched)
    finally:
        target.close()
    return [dataclasses.replace(r, arrival=r.arrival / dilation, ttft=None if r.ttft is None else r.ttft / dilation)
            for r in results]


@contextmanager
def cpu_use(into: dict, label: str):
    """While a run lasts: the whole machine's mean busy cores (/proc/stat), this process tree's (the
    engine and its workers), and the seconds the tree's threads sat runnable waiting for a CPU
    (/proc/*/task/*/schedstat). A REAL run on a shared machine is only as fast as the neighbours allow."""
    machine, (cpu, wait), t0 = _machine_ticks(), _tree_schedstat(), time.monotonic()
    yield
    machine2, (cpu2, wait2), wall = _machine_ticks(), _tree_schedstat(), time.monotonic() - t0
    if machine and machine2 and wall > 0:
        d = [b - a for a, b in zip(machine, machine2)]
        busy = (sum(d) - d[3] - d[4]) / max(sum(d), 1) * (os.cpu_count() or 1)
        into[label] = {"cpus": os.cpu_count(), "wall_s": wall, "busy_cores": busy, "our_cores": (cpu2 - cpu) / wall,
                       "others_cores": busy - (cpu2 - cpu) / wall, "our_runqueue_wait_s": wait2 - wait}


def _machine_ticks() -> list[int] | None:
    try:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None


def _tree_schedstat() -> tuple[float, float]:
    """(CPU seconds, seconds runnable but waiting for a CPU) of this process and every live descendant
    (the runtime's workers), summed over their threads."""
    parent = {}
    for d in Path("/proc").iterdir():
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {os.getpid()}, True
    while grew:
        new = {pid for pid, ppid in parent.items() if ppid in tree and pid not in tree}
        tree |= new
        grew = bool(new)
    cpu = wait = 0.0
    for pid in tree:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                run_ns, wait_ns, _ = (int(x) for x in (task / "schedstat").read_text().split())
            except (OSError, ValueError):
                continue
            cpu, wait = cpu + run_ns / 1e9, wait + wait_ns / 1e9
    return cpu, wait


def errors(summaries: dict[str, dict]) -> dict[str, dict]:
    """{"A vs B": {stat: (A - B) / B, ..., "met": bool}} for each pair present."""
    out = {}
    for a, b in PAIRS:
        if a not in summaries or b not in summaries:
            continue
        e = {s: _rel(summaries[a][s], summaries[b][s]) for s in STATS}
        e["met"] = all(e[s] is not None and abs(e[s]) <= bound for s, bound in TARGETS.items())
        out[f"{a} vs {b}"] = e
    return out


def _rel(x, ref):
    return None if x is None or not ref else x / ref - 1


def validate(model: str = "small-deepseek-v3", num_requests: int = 24, rate: float | None = None,
             utilization: float = 0.5, min_tokens: int = 64, max_tokens: int = 1024, seed: int = 0,
             hardware: str = "cpu", dilation: float = 1.0, attention_workers: int = 1, expert_workers: int = 1,
             token_budget: int = 2048, microbatches: int = 2, threads: int = 1, real: bool = True,
             progress: bool = True, log=print) -> dict:
    """Run the workload EMULATED, SIMULATED and (unless real=False) REAL; summaries and errors."""
    from asap.bench.targets import model_config, sim_target
    if rate is None and not utilization > 0:
        raise ValueError(f"utilization must be > 0, got {utilization}")
    path = profile_path(hardware)
    hw = get_hardware(path)
    log(f"hardware profile: {path} ({'calibrated' if hw.calibrated else 'UNCALIBRATED'}; {hw.source})")
    cfg = model_config(model)
    devices = attention_workers + expert_workers
    runtime = RuntimeConfig(attention_workers=attention_workers, expert_workers=expert_workers, devices=devices,
                            token_budget=token_budget, microbatches=microbatches, compute="emulated",
                            hardware=str(path), dilation=dilation, threads_per_worker=threads)
    wl, rate = workload(cfg, hw, num_requests, rate, utilization, min_tokens, max_tokens, seed,
                        attention_workers, expert_workers)
    requests = wl.build()
    setting = {"model": str(model), "engine": "async", "attention_workers": attention_workers,
               "expert_workers": expert_workers, "devices": devices, "token_budget": token_budget,
               "microbatches": microbatches, "dilation": dilation, "threads_per_worker": threads,
               "hardware": str(path), "hardware_calibrated": hw.calibrated, "num_requests": len(requests),
               "arrivals": f"poisson {rate:.4g} req/s", "lengths": f"uniform {min_tokens}..{max_tokens}", "seed": seed}
    log(f"workload: {len(requests)} requests, Poisson {rate:.3g} req/s, prompt lengths uniform "
        f"{min_tokens}..{max_tokens} (seed {seed}); async {attention_workers} attention + {expert_workers} expert "
        f"worker(s), token_budget {token_budget}, {microbatches} micro-batches, dilation {dilation:g}")
    results = {"SIMULATED": sim_target("async", model, runtime, devices).run(requests)}
    machine = {}
    log("SIMULATED done; running EMULATED")
    results["EMULATED"] = engine_results(model, runtime, requests, dilation, progress, machine, "EMULATED")
    if real:
        log("EMULATED done; running REAL")
        results["REAL"] = engine_results(model, dataclasses.replace(runtime, compute="real", dilation=1.0),
                                         requests, 1.0, progress, machine, "REAL")
    summaries = {label: summarize(results[label]) for label in LABELS if label in results}
    return {"setting": setting, "summaries": summaries, "errors": errors(summaries), "machine": machine,
            "targets": {s: f"|error| <= {b:.0%}" for s, b in TARGETS.items()},
            "ttft_s": {label: [r.ttft for r in res] for label, res in results.items()}}


def report(out: dict) -> str:
    lines = [f"{'':<12}{'mean ms':>10}{'P50 ms':>10}{'P90 ms':>10}{'failed':>8}"]
    for label, s in out["summaries"].items():
        lines.append(f"{label:<12}" + "".join(_ms(s[k]) for k in STATS) + f"{s['num_failed']:>8}")
    for label, m in out.get("machine", {}).items():
        lines.append(f"{label} run ({m['wall_s']:.0f} s): {m['busy_cores']:.2f} of the machine's {m['cpus']} cpus busy "
                     f"on average, {m['our_cores']:.2f} by this run, {m['others_cores']:.2f} by other processes; "
                     f"this run's threads waited {m['our_runqueue_wait_s']:.1f} s for a cpu")
    lines.append(f"\n{'error':<24}{'mean':>8}{'P50':>8}{'P90':>8}   target: mean within 10%, P90 within 15%")
    for pair, e in out["errors"].items():
        lines.append(f"{pair:<24}" + "".join(_pct(e[k]) for k in STATS) + ("   met" if e["met"] else "   NOT met"))
    return "\n".join(lines)


def _ms(x) -> str:
    return f"{'-':>10}" if x is None else f"{x:>10.1f}"


def _pct(x) -> str:
    return f"{'-':>8}" if x is None else f"{x:>+8.1%}"


# ---- CLI (`asap sim validate`: asap/cli.py adds this parser to the sim command) ----

def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="one workload EMULATED, SIMULATED and REAL: TTFT errors",
                       description=__doc__.split("\n\n")[0] + " About 3 minutes on two cores with the defaults "
                                   "(24 requests, 2 devices; --no-real: about half).")
    v.add_argument("--model", default="small-deepseek-v3", help="preset name or HF model directory")
    v.add_argument("--num-requests", type=int, default=24, help="requests of the workload")
    v.add_argument("--rate", type=float, default=None, help="req/s (default: from --utilization)")
    v.add_argument("--utilization", type=float, default=0.5,
                   help="without --rate: the busier side's predicted busy fraction (default: %(default)s)")
    v.add_argument("--min-tokens", type=int, default=64, help="shortest prompt (tokens)")
    v.add_argument("--max-tokens", type=int, default=1024, help="longest prompt (tokens)")
    v.add_argument("--seed", type=int, default=0, help="seed of the lengths and arrivals")
    v.add_argument("--hardware", default="cpu",
                   help="profile: cpu (the measured one if `asap profile` wrote it), a built-in name or a .json")
    v.add_argument("--dilation", type=float, default=1.0, help="emulated waits x this (divided out)")
    v.add_argument("--attention-workers", type=int, default=1, help="A: attention workers")
    v.add_argument("--expert-workers", type=int, default=1, help="E: expert workers")
    v.add_argument("--token-budget", type=int, default=2048, help="prompt tokens per replica step")
    v.add_argument("--microbatches", type=int, default=2, help="micro-batches per step")
    v.add_argument("--threads", type=int, default=1, help="torch threads per REAL worker")
    v.add_argument("--no-real", dest="real", action="store_false", help="skip the REAL run")
    v.add_argument("--json", default=None, help="write settings, summaries, errors and per-request TTFTs here")
    v.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar per run on stderr")
    v.set_defaults(run=run_args)


def run_args(a) -> int:
    out = validate(a.model, a.num_requests, a.rate, a.utilization, a.min_tokens, a.max_tokens, a.seed, a.hardware,
                   a.dilation, a.attention_workers, a.expert_workers, a.token_budget, a.microbatches, a.threads,
                   a.real, a.progress)
    print(report(out))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 0
