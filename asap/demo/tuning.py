"""Each engine's best-tuned configuration for the demo's two SIMULATED comparisons, stored offline.

- The demo's own workload on its emulated cluster (24 dies; 20 with --quick): asap.studies.tune over each
  engine's emulatable space (one instance, at most one worker process per die).
- The headline case: the Mooncake conversation trace on 32 dies, the 32-die row of `asap sim headline`
  (each engine's whole space, the same search and budget).

Both searches simulate every candidate with a rate search on enough requests that the highest passing rate
is a steady state and not a burst absorbed: minutes of simulation, too long for a 3-minute demo. So they
run offline,

    python -m asap.demo.tuning [--devices 24 18 32] [--jobs 2]     # rewrites asap/demo/tuned.json
    python -m asap.demo.tuning --from-headline out/headline.json    # the 32-die entry from a headline run

(measured on two cores with --jobs 2: 10 min for 24 dies, 9 for 20, 43 min for the headline's 32-die row), and
`asap demo` reads the result (`asap demo --retune` reruns the emulated cluster's first). Keys name what a
search depends on (model, hardware, devices, the workload and SLO settings, whether only emulatable
configurations were allowed), so a changed setting is never served another's entry (without an entry the
demo falls back to the analytic split, and says so). Each entry also records the fingerprint of the code
the result depends on (asap.studies.code_version); when that code has changed since (and was not found to
simulate the same, bit for bit: benchmarks/sim_equivalence.py), the demo says the tuning is stale and gives
no ratio. Where an engine's best candidate still passes at the highest rate the sample
can certify (asap.studies.tune's no-best case), its entry holds that candidate and the rate as a lower bound,
and the demo says so.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from asap.demo.settings import FULL, QUICK, DemoSettings, demo_requests
from asap.pipeline.plan import token_weighted_length
from asap.studies.code_version import fingerprint, is_current
from asap.studies.deploy import expert_workers
from asap.studies.headline import NUM_REQUESTS
from asap.studies.space import QUEUE_ORDERS

TUNED = Path(__file__).resolve().parent / "tuned.json"
TUNE_REQUESTS = 1200     # the tuner's sample of the demo workload: enough for a steady-state rate search
HEADLINE_REQUESTS = NUM_REQUESTS     # the headline's sample (`asap sim headline`'s default --num-requests)


def key(s: DemoSettings, devices: int, emulatable_only: bool) -> str:
    return (f"{s.model}/{s.hardware}/{devices}/x{s.length_scale:g}-max{s.max_tokens}-budget{s.token_budget}/"
            f"slo{s.slo_scale:g}x-floor{s.slo_floor_tokens}/seed{s.seed}/n{TUNE_REQUESTS}"
            + ("/emulatable-one-process-per-die" if emulatable_only else ""))


def headline_key(s: DemoSettings) -> str:
    return (f"headline/{s.model}/{s.hardware}/{s.sim_devices}/{s.sim_workload}/slo{s.sim_slo}/n{HEADLINE_REQUESTS}"
            f"/fleets{'-'.join(f'{f:g}' for f in s.sim_fleet_fractions)}" + ("/sustained" if s.sim_sustained else "")
            + (f"/orders{'-'.join(s.sim_orders)}" if tuple(s.sim_orders) != QUEUE_ORDERS else "")
            + (f"/lanes{'-'.join(f'{n}:{b}' for n, b in s.sim_lanes)}" if s.sim_lanes else "")
            + ("/vet" if s.sim_vet else ""))


def headline_rule(s: DemoSettings) -> str | bool:
    """What `asap sim headline` records as its search rule ("sustained" in its JSON) for the demo's case."""
    from asap.studies.headline import search_rule
    return search_rule(s.sim_sustained, s.sim_vet)


def worker_processes(c, devices: int) -> int:
    """The worker processes the runtime starts for `c` on `devices` devices: the expert side's, and for async
    a process per attention replica beside them."""
    return expert_workers(c, devices) + (0 if c.engine == "sync" else c.attention_workers)


def emulatable(c, devices: int) -> bool:
    """What the demo can emulate faithfully on a small machine: one instance (attention TP is emulated, one
    process per group), not a length-aware fleet (sync's is two engines behind a proxy; async's is co-located,
    which the runtime runs, but at two processes per device), and at most one worker process per device.
    Two cores keep up with the demo's dilation for 24 processes; the co-located layout starts two per device,
    and on 24 dies (48 processes) its emulated attainment fell to 0.19 where the simulator gives 1.00."""
    return c.instances == 1 and not c.wide_replicas and worker_processes(c, devices) <= devices


def tune_now(s: DemoSettings, devices: int, emulatable_only: bool, executor=None, progress: bool = False) -> dict:
    """{engine: {"config": EngineConfig fields, "describe", "max_slo_rate", ...}} (SIMULATED search).
    executor: asap.studies.parallel's (default serial; the same answer either way); progress: a line per simulation."""
    from asap.studies.parallel import Progress
    from asap.studies.space import space
    from asap.studies.tune import tune
    t0, t0_wall, code = time.monotonic(), time.time(), fingerprint()
    requests = demo_requests(s, devices, TUNE_REQUESTS, rate=1.0)
    prompt_len = token_weighted_length(requests)
    out = {}
    for engine in ("sync", "async"):
        cands = [c for c in space(engine, devices, s.model, s.hardware, prompt_len)
                 if emulatable(c, devices) or not emulatable_only]
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
    from asap.studies.config import EngineConfig
    cfg, hw = get_model(s.model), get_hardware(s.hardware)
    a = min(balanced_split(CostModel(cfg, hw), devices, s.token_budget), devices - min_expert_workers(cfg, hw))
    configs = {"sync": EngineConfig("sync", 1, s.token_budget),
               "async": EngineConfig("async", 1, s.token_budget, attention_workers=max(1, a))}
    return {e: {"config": dataclasses.asdict(c), "describe": c.describe(devices), "max_slo_rate": None,
                "candidates": 1} for e, c in configs.items()}


def headline_entry(row: dict, code: str, tune_s: float | None = None, rule: str | bool = False) -> dict:
    """A stored entry from a row of `asap sim headline` (its JSON): each engine's best configuration, its
    SLO-compliant rate and the sample it was certified on, its rate under ">= 90% in every bucket", and the
    search rule (`rule`: the headline's "sustained" field; False = the default rule)."""
    out = {}
    for e in ("sync", "async"):
        r = row[e]
        if not r.get("config"):
            raise RuntimeError(f"the headline row has no valid {e} configuration: {r.get('reason')}")
        out[e] = {"config": r["config"], "describe": r["describe"], "max_slo_rate": r["max_slo_rate"],
                  "num_requests": r["num_requests"], "num_sims": r["num_sims"], "candidates": r.get("num_screened"),
                  "every_bucket_rate": (r.get("every_bucket") or {}).get("max_slo_rate")}
    out["fingerprint"], out["tune_s"] = code, tune_s if tune_s is not None else row.get("wall_s")
    out["rule"] = rule or "default"
    return out


def tune_headline(s: DemoSettings, executor=None, progress: bool = False) -> dict:
    """The headline's row for the demo's SIMULATED case (SIMULATED search: `asap sim headline --devices
    {s.sim_devices} --workloads {s.sim_workload} --slo-scales 1.0 --fleet-fractions {s.sim_fleet_fractions}`,
    with --sustained where s.sim_sustained, --vet where s.sim_vet, --orders s.sim_orders, --lanes s.sim_lanes)."""
    from asap.studies.headline import run_headline
    t0, code = time.monotonic(), fingerprint()
    out = run_headline(device_counts=(s.sim_devices,), workloads=(s.sim_workload,), slo=s.sim_slo, slo_scales=(1.0,),
                       model=s.model, hardware=s.hardware, num_requests=HEADLINE_REQUESTS, out_dir=None,
                       verbose=progress, executor=executor, fleet_fractions=s.sim_fleet_fractions, orders=s.sim_orders,
                       lanes=s.sim_lanes,
                       sustained=s.sim_sustained, vet=s.sim_vet)
    return headline_entry(out["rows"][0], code, time.monotonic() - t0, out["sustained"])


def from_headline(path: Path, s: DemoSettings) -> dict:
    """The entry from a headline run's JSON; refused unless it is the demo's case and ran on this code."""
    doc = json.loads(Path(path).read_text())
    want = {"model": s.model, "hardware": s.hardware, "slo": s.sim_slo}
    got = {k: doc.get(k) for k in want}
    if got != want:
        raise ValueError(f"{path}: the headline ran {got}, the demo's case is {want}")
    if not is_current(doc.get("code_fingerprint")):
        raise ValueError(f"{path}: the headline ran on other simulation code (fingerprint "
                         f"{doc.get('code_fingerprint')}, this checkout {fingerprint()}); rerun it")
    if doc.get("sustained", False) != headline_rule(s):
        raise ValueError(f"{path}: the headline ran under another search rule (sustained: {doc.get('sustained')!r}); "
                         f"the demo's case wants {headline_rule(s)!r} (asap sim headline "
                         f"{'--sustained' if s.sim_sustained else 'without --sustained'}"
                         f"{' --vet' if s.sim_vet else ''})")
    if tuple(doc.get("fleet_fractions", (0.5,))) != tuple(s.sim_fleet_fractions):
        raise ValueError(f"{path}: the headline's fleets tried wide shares {doc.get('fleet_fractions', [0.5])}, the "
                         f"demo's case {list(s.sim_fleet_fractions)} (--fleet-fractions)")
    if tuple(doc.get("orders", QUEUE_ORDERS)) != tuple(s.sim_orders):
        raise ValueError(f"{path}: the headline's candidates tried the queue orders {doc.get('orders', ['fcfs'])}, "
                         f"the demo's case {list(s.sim_orders)} (--orders)")
    if tuple(tuple(x) for x in doc.get("lanes", ())) != tuple(s.sim_lanes):
        raise ValueError(f"{path}: the headline's candidates tried the short-prompt lanes {doc.get('lanes', [])}, "
                         f"the demo's case {[list(x) for x in s.sim_lanes]} (--lanes)")
    rows = [r for r in doc["rows"] if r["workload"] == s.sim_workload and r["devices"] == s.sim_devices]
    if not rows:
        raise ValueError(f"{path}: no {s.sim_workload} row on {s.sim_devices} devices")
    # a headline without --num-requests sizes each row's sample (asap.studies.sample_size) and records it per row
    n = doc.get("num_requests", HEADLINE_REQUESTS)
    n = rows[0].get("requests_available") if n is None else n
    if n != HEADLINE_REQUESTS:
        raise ValueError(f"{path}: the headline sampled {n} requests, the demo's entry {HEADLINE_REQUESTS}")
    return headline_entry(rows[0], doc["code_fingerprint"], rule=doc.get("sustained", False))


def _stored(k: str) -> tuple[dict | None, str]:
    table = json.loads(TUNED.read_text()) if TUNED.is_file() else {}
    entry, source = table.get(k), "tuned offline (asap/demo/tuned.json)"
    if entry is not None and not is_current(entry.get("fingerprint")):
        source = ("tuned offline on older code: STALE (the simulation code changed since, see "
                  "asap.studies.code_version; rerun `python -m asap.demo.tuning`)")
    return entry, source


def _configs(entry: dict, source: str) -> dict:
    from asap.studies.config import EngineConfig
    return {"sync": EngineConfig(**entry["sync"]["config"]), "async": EngineConfig(**entry["async"]["config"]),
            "tuning": {e: entry[e] for e in ("sync", "async")}, "source": source, "rule": entry.get("rule", "default")}


def tuned_configs(s: DemoSettings, devices: int, emulatable_only: bool, retune: bool = False) -> dict:
    """The demo workload's tuning: {"sync": EngineConfig, "async": EngineConfig, "tuning": {...}, "source"}."""
    entry, source = (None, "") if retune else _stored(key(s, devices, emulatable_only))
    if retune:
        entry, source = tune_now(s, devices, emulatable_only), "tuned just now"
    elif entry is None:
        entry, source = untuned(s, devices), "NOT TUNED (no entry in asap/demo/tuned.json: analytic A:E split and " \
            "sync defaults; run `asap demo --retune`)"
    return _configs(entry, source)


def headline_configs(s: DemoSettings) -> dict | None:
    """The headline case's stored tuning (as tuned_configs), None where none is stored; STALE (as for older
    code) where the entry was made under another search rule than the one `asap sim headline` records now
    for the demo's case: a rule can change while the settings that key the entry do not."""
    entry, source = _stored(headline_key(s))
    if entry is not None and "STALE" not in source and entry.get("rule", "default") != (headline_rule(s) or "default"):
        source = ("tuned offline under an older search rule: STALE (recorded as "
                  f"{entry.get('rule', 'default')!r}; rerun `python -m asap.demo.tuning --from-headline`)")
    return None if entry is None else _configs(entry, source)


def _store(k: str, entry: dict) -> None:
    table = json.loads(TUNED.read_text()) if TUNED.is_file() else {}     # re-read: another run may have written
    table[k] = entry
    TUNED.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m asap.demo.tuning", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, nargs="+", default=None,
                   help=f"retune only the entries for these device counts (default: every entry the demo reads: "
                        f"{FULL.devices} and {QUICK.devices} for the emulated cluster, {FULL.sim_devices} for the "
                        f"headline case)")
    p.add_argument("--from-headline", type=Path, default=None, metavar="JSON",
                   help=f"instead: store the headline case's entry from the headline.json of `asap sim headline "
                        f"--devices {FULL.sim_devices} --workloads {FULL.sim_workload} --slo-scales 1.0 "
                        f"--fleet-fractions {' '.join(f'{f:g}' for f in FULL.sim_fleet_fractions)}"
                        f"{' --sustained' if FULL.sim_sustained else ''}{' --vet' if FULL.sim_vet else ''}"
                        f" --orders {' '.join(FULL.sim_orders)}"
                        f"{' --lanes ' + ' '.join(f'{n}:{b}' for n, b in FULL.sim_lanes) if FULL.sim_lanes else ''}` run on "
                        f"this code")
    from asap.studies import parallel
    parallel.add_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no line per simulation on stderr")
    args = p.parse_args(argv)
    if args.from_headline is not None:
        try:
            entry = from_headline(args.from_headline, FULL)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            print(f"python -m asap.demo.tuning: {e}", file=sys.stderr)
            return 2
        _store(headline_key(FULL), entry)
        print(f"[SIMULATED] stored {headline_key(FULL)}: sync {rate_text(entry['sync'], 3)}, async "
              f"{rate_text(entry['async'], 3)}", file=sys.stderr)
        return 0
    executor = parallel.from_args(args)
    jobs = [(FULL, FULL.devices, True), (QUICK, QUICK.devices, True), (FULL, FULL.sim_devices, None)]
    jobs = [j for j in jobs if args.devices is None or j[1] in args.devices]
    if not jobs:
        p.error(f"no demo entry has {args.devices} devices (the demo tunes {FULL.devices} and {QUICK.devices}, "
                f"and the headline case on {FULL.sim_devices})")
    failed = 0
    for s, devices, emulatable_only in jobs:
        k = headline_key(s) if emulatable_only is None else key(s, devices, emulatable_only)
        print(f"[SIMULATED] tuning {k} ...", file=sys.stderr, flush=True)
        try:
            entry = tune_headline(s, executor, progress=not args.quiet) if emulatable_only is None else \
                tune_now(s, devices, emulatable_only, executor, progress=not args.quiet)
        except RuntimeError as e:       # no best for an engine (e.g. the sample cannot rank its candidates)
            print(f"python -m asap.demo.tuning: {devices} devices: {e}; its entry is left as it was",
                  file=sys.stderr, flush=True)
            failed += 1
            continue
        rate = {e: rate_text(entry[e], 2) for e in ("sync", "async")}
        print(f"  sync  {entry['sync']['describe']}: {rate['sync']}\n"
              f"  async {entry['async']['describe']}: {rate['async']} ({entry['tune_s']:.0f} s)",
              file=sys.stderr, flush=True)
        _store(k, entry)
    executor.close()
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
