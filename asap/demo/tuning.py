"""The best-tuned configuration of each engine for the demo's workload, from asap.sim.tune.

The tuner (the search behind `asap plan`'s best_configs) simulates every candidate configuration of an
engine with a rate search each, on enough requests that the highest passing rate is a steady state
and not a burst absorbed: minutes of simulation, too long for a 3-minute demo. So it runs offline,

    python -m asap.demo.tuning          # rewrites asap/demo/tuned.json (~10 min on two cores)

and `asap demo` reads the result (`asap demo --retune` reruns it first). Keys name what the search
depends on (model, hardware, devices, the workload and SLO settings, whether only emulatable
configurations were allowed), so a changed setting is never served another's entry (without an entry
the demo falls back to the analytic split, and says so). Each entry also records a fingerprint of the
code the result depends on (asap/cost, asap/pipeline, asap/sim, asap/scheduler, asap/measure); when that code has changed since,
the demo says the tuning is stale, and the live simulations it prints show by how much. Where an
engine's best candidate still passes at the highest rate the sample can certify (asap.sim.tune's no-best
case), its entry holds that candidate and the rate as a lower bound, and the demo says so.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

from asap.demo.settings import FULL, QUICK, DemoSettings, demo_requests
from asap.pipeline.plan import token_weighted_length

TUNED = Path(__file__).resolve().parent / "tuned.json"
TUNE_REQUESTS = 1200     # the tuner's sample of the demo workload: enough for a steady-state rate search
# ... up to 32 devices. Larger clusters pass the SLO at higher rates, where 1,200 arrivals span less than
# 10x the SLO (a burst, which the rate search refuses to call a steady state): 3,600 of the 3,658 requests
# in the shipped sample at 384 devices.
TUNE_REQUESTS_LARGE = 3600


def tune_requests(devices: int) -> int:
    return TUNE_REQUESTS if devices <= 32 else TUNE_REQUESTS_LARGE


# asap/sim files off the simulation path: commands and other studies
NOT_SIMULATION = {"__main__.py", "cli.py", "headline.py", "plan.py", "validate.py", "profile.py", "calibrate.py", "from_runtime.py",
                  "trace_export.py", "explain.py", "parallel.py", "kernels.py"}


def fingerprint() -> str:
    """A hash of the code the tuner's answer depends on: cost model, simulator, policies, rate search. It
    hashes each file's syntax tree without its docstrings (comments never reach the tree), so an edit to
    the documentation alone does not make the stored tuning stale; any change to the code does."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in ("cost", "pipeline", "sim", "scheduler", "measure"):
        for f in sorted((root / sub).rglob("*.py")):
            if sub == "sim" and f.name in NOT_SIMULATION:
                continue
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + _code(f.read_text()).encode() + b"\0")
    return h.hexdigest()[:12]


def _code(source: str) -> str:
    """The source's syntax tree without docstrings (module, class and function), as text."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def key(s: DemoSettings, devices: int, emulatable_only: bool) -> str:
    return (f"{s.model}/{s.hardware}/{devices}/x{s.length_scale:g}-max{s.max_tokens}-budget{s.token_budget}/"
            f"slo{s.slo_scale:g}x-floor{s.slo_floor_tokens}/seed{s.seed}/n{tune_requests(devices)}"
            + ("/emulatable" if emulatable_only else ""))


def emulatable(c) -> bool:
    """What the emulated runtime can run: one instance (attention TP is emulated: one process per group)."""
    return c.instances == 1


def tune_now(s: DemoSettings, devices: int, emulatable_only: bool, executor=None, progress: bool = False) -> dict:
    """{engine: {"config": EngineConfig fields, "describe", "max_slo_rate", ...}} (SIMULATED search).
    executor: asap.sim.parallel's (default serial; the same answer either way); progress: a line per simulation."""
    from asap.sim.parallel import Progress
    from asap.sim.tune import space, tune
    t0, t0_wall, code = time.monotonic(), time.time(), fingerprint()
    requests = demo_requests(s, devices, tune_requests(devices), rate=1.0)
    prompt_len = token_weighted_length(requests)
    out = {}
    for engine in ("sync", "async"):
        cands = [c for c in space(engine, devices, s.model, s.hardware, prompt_len)
                 if emulatable(c) or not emulatable_only]
        t = tune(requests, engine, devices, s.model, s.hardware, candidates=cands, executor=executor,
                 progress=Progress(f"demo tuning {devices} devices", t0_wall) if progress else None)
        best = t.best or t.lower_bound_config
        if best is None:
            raise RuntimeError(f"the tuner found no valid {engine} configuration on {devices} devices: {t.reason}")
        out[engine] = {"config": dataclasses.asdict(best), "describe": best.describe(devices),
                       "max_slo_rate": t.max_slo_rate, "candidates": len(cands), "num_sims": t.num_sims,
                       "num_requests": t.num_requests}
        if t.best is None:      # it outran the sample: its maximum is at least this, the best of the rest is below
            out[engine].update(lower_bound=t.lower_bound, reason=t.reason)
    out["tune_s"] = time.monotonic() - t0
    out["fingerprint"] = code
    return out


def rate_of(t: dict) -> float | None:
    """The req/s a stored engine entry is run and compared at: its certified maximum, or its lower bound."""
    return t["max_slo_rate"] or t.get("lower_bound")


def rate_text(t: dict, digits: int = 1) -> str:
    if t["max_slo_rate"] is not None:
        return f"{t['max_slo_rate']:.{digits}f} req/s"
    if t.get("lower_bound") is not None:
        return (f">= {t['lower_bound']:.{digits}f} req/s (a lower bound: still within SLO at the highest rate "
                f"{t['num_requests']} requests can certify)")
    return "- req/s"


def untuned(s: DemoSettings, devices: int) -> dict:
    """The fallback when no tuning is stored: the cost model's balanced A:E split, sync with its defaults."""
    from asap.sim.cost import CostModel
    from asap.sim.memory import min_expert_workers
    from asap.sim.run import balanced_split, get_model
    from asap.sim.hardware import get_hardware
    from asap.sim.tune import EngineConfig
    cfg, hw = get_model(s.model), get_hardware(s.hardware)
    a = min(balanced_split(CostModel(cfg, hw), devices, s.token_budget), devices - min_expert_workers(cfg, hw))
    configs = {"sync": EngineConfig("sync", 1, s.token_budget),
               "async": EngineConfig("async", 1, s.token_budget, attention_workers=max(1, a))}
    return {e: {"config": dataclasses.asdict(c), "describe": c.describe(devices), "max_slo_rate": None,
                "candidates": 1} for e, c in configs.items()}


def tuned_configs(s: DemoSettings, devices: int, emulatable_only: bool, retune: bool = False) -> dict:
    """The one call site of the tuner: {"sync": EngineConfig, "async": EngineConfig, "tuning": {...}}."""
    from asap.sim.tune import EngineConfig
    k = key(s, devices, emulatable_only)
    table = json.loads(TUNED.read_text()) if TUNED.is_file() else {}
    entry = None if retune else table.get(k)
    source = "tuned offline (asap/demo/tuned.json)"
    if entry is not None and entry.get("fingerprint") != fingerprint():
        source = ("tuned offline on older code: STALE (asap/cost, asap/pipeline, asap/sim, asap/scheduler or "
                  "asap/measure changed since; rerun `python -m asap.demo.tuning`)")
    if retune:
        entry, source = tune_now(s, devices, emulatable_only), "tuned just now"
    elif entry is None:
        entry, source = untuned(s, devices), "NOT TUNED (no entry in asap/demo/tuned.json: analytic A:E split and " \
            "sync defaults; run `asap demo --retune`)"
    return {"sync": EngineConfig(**entry["sync"]["config"]), "async": EngineConfig(**entry["async"]["config"]),
            "tuning": {e: entry[e] for e in ("sync", "async")}, "source": source}


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m asap.demo.tuning", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, nargs="+", default=None,
                   help="retune only the entries for these device counts (default: every entry the demo reads)")
    from asap.sim import parallel
    parallel.add_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no line per simulation on stderr")
    args = p.parse_args(argv)
    executor = parallel.from_args(args)
    jobs = [(FULL, FULL.devices, True), (FULL, FULL.sim_devices, False), (QUICK, QUICK.devices, True)]
    jobs = [j for j in jobs if args.devices is None or j[1] in args.devices]
    if not jobs:
        p.error(f"no demo entry has {args.devices} devices (the demo tunes {FULL.devices}, {FULL.sim_devices} "
                f"and {QUICK.devices})")
    failed = 0
    for s, devices, emulatable_only in jobs:
        k = key(s, devices, emulatable_only)
        print(f"[SIMULATED] tuning {k} ...", file=sys.stderr, flush=True)
        try:
            entry = tune_now(s, devices, emulatable_only, executor, progress=not args.quiet)
        except RuntimeError as e:       # no best for an engine (e.g. the sample cannot rank its candidates)
            print(f"python -m asap.demo.tuning: {devices} devices: {e}; its entry is left as it was",
                  file=sys.stderr, flush=True)
            failed += 1
            continue
        rate = {e: rate_text(entry[e], 2) for e in ("sync", "async")}
        print(f"  sync  {entry['sync']['describe']}: {rate['sync']}\n"
              f"  async {entry['async']['describe']}: {rate['async']} ({entry['tune_s']:.0f} s)",
              file=sys.stderr, flush=True)
        table = json.loads(TUNED.read_text()) if TUNED.is_file() else {}     # re-read: another run may have written
        table[k] = entry
        TUNED.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    executor.close()
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
