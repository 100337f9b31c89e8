"""`asap sim headline`: best-tuned sync against best-tuned async (every figure SIMULATED).

For each workload (asap.workload.presets) and device count: both engines are tuned by the same search
with the same budget (asap.studies.tune) under the same per-request TTFT deadlines (asap.workload.slo), and
the row prints each engine's best configuration, its SLO-compliant throughput (the highest rate with
>= 90% of requests within their deadline, from a valid search only), the P90 TTFT at that rate, and the
ratio. Coarse to fine: the first device count searches each engine's whole space; every larger count
searches only the best REFINE configurations of each engine from the count before, scaled (sync: the
same DP group shape, instances of 32; async: the same TP and chunk, A scaled with N) and replicated (as
N / N_before independent instances, for both engines alike). The ratio is then
re-measured at other SLO scales (at the first device count) for the two best configurations, so its
sensitivity to the SLO shows. Each later count starts its rate search from the earlier count's rate
scaled by N / N_before; more than FINALISTS carried are vetted (with --vet) and the best FINALISTS searched,
fewer are each refined and confirmed. Each engine's main-criterion result is the better of its own best
and its every-bucket best searched under the main criterion. `prefix_cache=True` (--prefix-cache) runs
every candidate of both engines with the same prefix cache (asap.scheduler.prefix_cache) and prints its hit rate.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from asap.measure.sustain import RULE as SUSTAIN_RULE
from asap.cost.hardware import get_hardware
from asap.studies.carry import carry, replicate, scale_config
from asap.studies.code_version import fingerprint
from asap.studies.parallel import Progress, Serial
from asap.sim.cost import CostModel
from asap.sim.run import get_model
from asap.studies.sample_size import MAX_REQUESTS, requests_needed, sample_size
from asap.studies.config import EngineConfig
from asap.studies.headline_output import LABEL, format_row, write_headline, write_traces
from asap.studies.space import FLEET_FRACTIONS, QUEUE_ORDERS, check_search, space
from asap.studies.skeptic import ratio_by_slo_scale, skeptic_views
from asap.studies.tune import CONFIRM, REFINE, best_of_criteria, tune
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

WORKLOADS = ("conversation", "synthetic", "fixed-4k")
DEFAULT_SLO = "2s+1ms/tok"
NUM_REQUESTS = 1500            # the least requests a row samples (each search uses as few as the burst rule allows)
# the rule a --sustained headline records (a resume across rules is refused); runs of 2026-12-03 recorded
# SUSTAIN_RULE alone, before tune confirmed each maximum on a longer sample, and runs to 2026-12-05
# "...; each maximum confirmed on 2x its requests", each engine on twice its own search sample
SUSTAINED = f"{SUSTAIN_RULE}; each maximum confirmed on the row's {CONFIRM}x requests, the same for both engines"
VETTED = "; the screen's leaders re-ranked on that sample, every finalist confirmed"     # --vet (tune's vet)


def run_headline(device_counts=(32, 64, 128, 384), workloads=WORKLOADS, slo: str = DEFAULT_SLO,
                 slo_scales=(0.5, 1.0, 2.0), model="deepseek-v3", hardware="cloudmatrix384",
                 num_requests: int | None = None, out_dir: "str | Path | None" = "out/sim_headline",
                 verbose: bool = True, trace_s: float = 2.0, resume: dict | None = None,
                 prefix_cache: bool = False, every_bucket: bool = True, executor=None,
                 fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS, sustained: bool = False,
                 vet: bool = False, orders: tuple[str, ...] = QUEUE_ORDERS, lanes: tuple = ()) -> dict:
    """Rows of best-tuned sync vs best-tuned async; JSON + plots (+ Chrome traces of the first row).
    executor (asap.studies.parallel): runs each tune's screen and fine searches side by side (the same rows as
    serial, the default); with verbose, a line per simulation goes to stderr.
    num_requests: the requests each row samples; None: per row, as many as a steady state at the work ceiling
    of its devices needs and at least NUM_REQUESTS (asap.studies.sample_size), so a larger row gets more.
    resume: an earlier headline (its JSON): each workload continues from its last row to the device counts
    above it (coarse to fine from there), and the earlier rows are kept.
    every_bucket: also tune both engines under ">= 90% in every prompt-length bucket" and print that ratio.
    fleet_fractions: the wide group's shares both engines' length-aware fleets try (asap.studies.space.space).
    orders: the queue orders both engines' candidates try (asap.studies.space.secondary; default fcfs only).
    lanes: the short-prompt lanes, (replicas, below_tokens) pairs, both engines' candidates try likewise where
    their layout holds one (default none); recorded, and checked on resume, as orders are.
    sustained: every criterion also requires a run to drain within its longest TTFT budget after its last
    arrival and the target to hold in each arrival third (asap.measure.sustain; tune's "-sustained"
    criteria), so no rate passes on a queue that grows; each workload is then read for CONFIRM x num_requests
    requests, and tune confirms every refined maximum of either engine on all of them (a queue that grows
    slower than the sample shows there; both engines on the same requests); the skeptic's views of a row use
    the longer sample too.
    vet (with sustained): each tune re-ranks its screen's leaders on that longer sample before choosing its
    finalists, and confirms every finalist (asap.studies.tune.tune's vet); recorded in the rule."""
    if vet and not sustained:
        raise ValueError("vet re-ranks on the sample a sustained headline confirms on: set sustained too")
    lanes = check_search(fleet_fractions, orders, lanes)
    t_start, t_wall = time.perf_counter(), time.time()
    base_slo = parse_slo(slo)
    main, per_bucket = ("requests-sustained", "every-bucket-sustained") if sustained else ("requests", "every-bucket")
    if num_requests is not None and num_requests < 2:
        raise ValueError(f"num_requests must be >= 2, got {num_requests}")
    cost = CostModel(get_model(model), get_hardware(hardware))
    rows = []
    for wl in workloads:
        def sample(devices: int, wl=wl) -> tuple[int, list, list, list]:
            """(n, base, pool, reqs): the row's requests without deadlines (base), with them (pool: a maximum
            is confirmed on these, sustained) and the n its searches use (reqs)."""
            n = num_requests if num_requests is not None else \
                sample_size(lambda k: base_slo.apply(workload_requests(wl, k)), devices, cost, NUM_REQUESTS)
            base = workload_requests(wl, n * (CONFIRM if sustained else 1))
            pool = base_slo.apply(base)
            return n, base, pool, pool[:n]
        prev: dict[str, list[EngineConfig]] = {}
        prev_devices = None
        if resume is not None:
            _check_resume(resume, dict(model=str(model), hardware=str(hardware), slo=str(base_slo),
                                       prefix_cache=prefix_cache, sustained=search_rule(sustained, vet),
                                       orders=list(orders), lanes=[list(x) for x in lanes]))
            done = [r for r in resume["rows"] if r["workload"] == str(wl)]
            if not done:
                raise ValueError(f"resume: the earlier headline has no row for workload {wl!r}")
            rows += done
            prev_devices = done[-1]["devices"]
            for engine in ("sync", "async"):     # as an unresumed run carries them on (a first row: REFINE)
                prev[engine] = carry(done[-1][engine], first=len(done) == 1)
        todo = [d for d in device_counts if prev_devices is None or d > prev_devices]   # resumed rows are kept
        if resume is not None and not todo:
            raise ValueError(f"resume: workload {wl!r} already has rows up to {prev_devices} devices; "
                             f"ask for more devices than that (--devices)")
        for devices in todo:
            n, base, pool, reqs = sample(devices)
            row = {"workload": str(wl), "devices": devices, "requests_available": n}
            progress = Progress(f"headline {wl} x{devices}", t_wall) if verbose else None
            need = requests_needed(reqs, devices, cost)
            if verbose and num_requests is None and need <= n:
                print(f"[{LABEL}] headline {wl} x{devices}: {n} requests (enough for a steady state at this size's "
                      f"work ceiling, at least {NUM_REQUESTS}; --num-requests sets it)", flush=True)
            elif verbose and need > n:
                print(f"[{LABEL}] headline {wl} x{devices}: {n} requests may be too few: a steady state at this "
                      f"size's work ceiling needs about {need} (searches that pass at the sample's burst limit "
                      f"end with 'use more requests'); " + ("leave --num-requests out to size each row"
                      if num_requests is not None else f"{MAX_REQUESTS} is the most a row samples unless "
                      f"--num-requests says more"), flush=True)
            t_row = time.perf_counter()
            searches = []
            for engine in ("sync", "async"):
                if prev_devices is None:
                    cands = None
                else:
                    cands = [s for s in (f(c, devices, prev_devices, *extra) for c in prev[engine]
                                         for f, extra in ((scale_config, (model, hardware)), (replicate, ())))
                             if s is not None]
                    cands = list(dict.fromkeys(cands)) or None
                hint = None
                if prev_devices is not None and rows and rows[-1][engine]["max_slo_rate"]:
                    hint = rows[-1][engine]["max_slo_rate"] * devices / prev_devices
                # a continued row refines (and confirms) every carried candidate that reaches a rate search (all
                # of them where there are no more than FINALISTS, else the screen's or vet's best): on the short
                # search sample two of them can tie that the confirmation sample tells apart (the synthetic 128-die
                # row refined one of two tied on 1,750 requests, which held 4.17 req/s on 7,000; the other 5.91)
                searches.append(dict(candidates=cands, start_rate=hint,
                                     refine=REFINE if prev_devices is None else max(REFINE, len(cands or ())),
                                     prefix_cache=prefix_cache, progress=progress, fleet_fractions=fleet_fractions,
                                     criterion=main, vet=vet, orders=orders, lanes=lanes))
            # A row's first device count searches the whole space: its screens run side by side within each
            # tune. Later ones search a few candidates: there the two engines' tunes run side by side instead.
            side_by_side = prev_devices is not None and executor is not None and executor.jobs > 1
            inner = None if side_by_side else executor
            tuned = (executor if side_by_side else Serial()).map(_tune_engine, [
                (reqs, engine, devices, model, hardware, per_bucket if every_bucket else None,
                 dict(kw, executor=inner, longer=pool if sustained else None))
                for engine, kw in zip(("sync", "async"), searches)])
            for engine, (t, eb) in zip(("sync", "async"), tuned):
                row[engine] = {"config": dataclasses.asdict(t.best) if t.best else None,
                               "describe": t.best.describe(devices) if t.best else None,
                               "max_slo_rate": t.max_slo_rate, "ttft_p90_s": t.ttft_p90_s,
                               "tokens_per_s_per_device": t.tokens_per_s_per_device,
                               "num_requests": t.num_requests, "num_sims": t.num_sims, "reason": t.reason,
                               "search_rate": t.search_rate,
                               "candidates": t.candidates, "prefix_hit_rate": t.prefix_hit_rate,
                               "lower_bound": t.lower_bound,
                               "lower_bound_describe": t.lower_bound_config.describe(devices)
                               if t.lower_bound_config else None, "buckets": t.buckets,
                               "num_screened": t.num_screened}
                if every_bucket:
                    row[engine]["every_bucket"] = {
                        "config": dataclasses.asdict(eb.best) if eb.best else None,
                        "describe": eb.best.describe(devices) if eb.best else None, "max_slo_rate": eb.max_slo_rate,
                        "num_requests": eb.num_requests, "num_sims": eb.num_sims, "reason": eb.reason,
                        "lower_bound": eb.lower_bound, "buckets": eb.buckets, "candidates": eb.candidates}
                prev[engine] = carry(row[engine], first=prev_devices is None) or \
                    (prev.get(engine) or space(engine, devices, model, hardware, fleet_fractions=fleet_fractions,
                                                           orders=orders, lanes=lanes))
            prev_devices = devices
            s, a = row["sync"]["max_slo_rate"], row["async"]["max_slo_rate"]
            row["ratio"] = a / s if s and a else None
            skeptic_views(row, pool, devices, model, hardware, every_bucket, executor, main)
            # the SLO-scale sweep at the first device count (its cost grows with N)
            first = devices == device_counts[0] and resume is None
            row["ratio_by_slo_scale"] = ratio_by_slo_scale(row, pool, base, base_slo,
                                                           slo_scales if first else (1.0,), devices, model,
                                                           hardware, executor, main)
            row["wall_s"] = time.perf_counter() - t_row
            rows.append(row)
            if verbose:
                print(format_row(row), flush=True)
            if out_dir is not None:      # partial results survive an interrupted run
                Path(out_dir).mkdir(parents=True, exist_ok=True)
                part = _summary(rows, model, hardware, base_slo, slo_scales, workloads, t_start, partial=True,
                                prefix_cache=prefix_cache, num_requests=num_requests,
                                fleet_fractions=fleet_fractions, sustained=sustained, vet=vet, orders=orders,
                                lanes=lanes)
                (Path(out_dir) / "headline.partial.json").write_text(json.dumps(part, indent=2, default=str) + "\n")
    out = _summary(rows, model, hardware, base_slo, slo_scales, workloads, t_start, prefix_cache=prefix_cache,
                   num_requests=num_requests, fleet_fractions=fleet_fractions, sustained=sustained, vet=vet,
                   orders=orders, lanes=lanes)
    if verbose:
        print(f"[{LABEL}] headline wall time {out['wall_s']:.0f} s", flush=True)
    if out_dir is not None:
        write_headline(out, out_dir)
        write_traces(rows[0], base_slo, workloads[0],  # a resumed first row may lack requests_available
                     rows[0].get("requests_available", num_requests or NUM_REQUESTS), model, hardware, out_dir,
                     trace_s)
    return out


def _tune_engine(job: tuple) -> tuple:
    """One engine's tunes of a row: by the headline's criterion, and (every_bucket) by the every-length-bucket
    one, its own search with the same space and rule, sharing simulations; the first is then the better of its
    own best and the every-bucket best searched under its criterion (asap.studies.tune.best_of_criteria: every
    bucket at 90% implies 90% of requests). An executor's task."""
    reqs, engine, devices, model, hardware, per_bucket, kw = job
    cache: dict = {}
    t = tune(reqs, engine, devices, model, hardware, cache=cache, **kw)
    if not per_bucket:
        return t, None
    eb = tune(reqs, engine, devices, model, hardware, cache=cache, **dict(kw, criterion=per_bucket))
    return best_of_criteria(t, eb, reqs, kw.get("longer"), model=model, hardware=hardware, cache=cache,
                            progress=kw.get("progress")), eb


def _summary(rows, model, hardware, slo, slo_scales, workloads, t_start, partial: bool = False,
             prefix_cache: bool = False, num_requests: int | None = None,
             fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS, sustained: bool = False, vet: bool = False,
             orders: tuple[str, ...] = QUEUE_ORDERS, lanes: tuple = ()) -> dict:
    """code_fingerprint: the simulation code the rows ran on (asap.studies.code_version), so a stored copy can
    tell whether it is current."""
    return {"label": LABEL, "model": str(model), "hardware": str(hardware), "slo": str(slo),
            "slo_scales": list(slo_scales), "target_attainment": 0.9, "workloads": list(map(str, workloads)),
            "num_requests": num_requests, "code_fingerprint": fingerprint(),
            "rows": rows, "wall_s": time.perf_counter() - t_start, "partial": partial, "prefix_cache": prefix_cache,
            "fleet_fractions": list(fleet_fractions), "sustained": search_rule(sustained, vet),
            "orders": list(orders), "lanes": [list(x) for x in lanes]}


def _check_resume(resume: dict, now: dict) -> None:
    """Refuse to resume a headline made under other settings, naming each one that differs, as it was there
    and as it is now (the search rule by the flags that give it)."""
    def shown(k, v):
        if k == "prefix_cache":
            return "--prefix-cache" if v else "no --prefix-cache"
        if k == "sustained":
            flags = {search_rule(True, True): "--sustained (--vet)", search_rule(True, False): "--sustained --no-vet",
                     False: "no --sustained"}
            return flags.get(v, f"an older rule no flag gives now ({v})")
        return str(v)
    old = {"prefix_cache": False, "sustained": False, "orders": list(QUEUE_ORDERS), "lanes": []}   # before recorded
    was = {k: resume.get(k, old.get(k)) for k in now}
    diff = [f"{k}: {shown(k, was[k])} there, {shown(k, now[k])} here" for k in now if was[k] != now[k]]
    if diff:
        raise ValueError("resume: the earlier headline was made under other settings (" + "; ".join(diff) + ")")


def search_rule(sustained: bool, vet: bool) -> str | bool:
    """The search rule a headline records (its "sustained" field): False for the default rule (the demo's
    stored case compares it, asap.demo.tuning.headline_rule)."""
    return SUSTAINED + (VETTED if vet else "") if sustained else False
