"""`asap plan`: split N devices into A attention replicas and E expert workers (every figure SIMULATED).

1. Analytic: `balanced_split` balances replica and expert throughput from the cost model -> A0.
2. Reference rate R0: the SLO-compliant throughput of A0 (find_max_rate on the simulator).
3. Screen: every feasible A (1 .. N - E_min, E_min from expert memory) is simulated once at R0,
   giving its SLO attainment and P90 TTFT there.
4. Check: the `check` best screened candidates, by (attainment, -P90), get their own rate search.
The recommendation is the checked candidate with the highest SLO-compliant throughput (ties: lower
P90 TTFT at R0, then fewer attention workers). The workload helpers here are shared with
`asap ablation` (asap/bench/ablation.py).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from asap.measure.metrics import summarize
from asap.measure.rate_search import find_max_rate
from asap.measure.report import cell, text_table
from asap.pipeline.plan import token_weighted_length
from asap.scheduler.request import Request
from asap.sim.cost import CostModel
from asap.studies.experiments import TARGET, TRACE, at_rate, with_slo
from asap.studies.space import FLEET_FRACTIONS, QUEUE_ORDERS, check_search
from asap.sim.hardware import get_hardware
from asap.sim.memory import min_expert_workers
from asap.sim.run import balanced_split, get_model, run
from asap.workload.slo import SLO, IdleMultiple, parse_slo

WORKLOADS = ("trace", "poisson", "gamma")


def workload_requests(kind: str = "trace", num_requests: int = 300, seed: int = 0,
                      trace: str | Path = TRACE) -> list[Request]:
    """The trace's first requests: its own arrivals ("trace"), or its lengths with Poisson or bursty
    Gamma (cv 2) arrivals drawn from `seed`. Only the arrival pattern matters: rates are rescaled."""
    from asap.workload import Gamma, Poisson, Workload
    arrivals = {"trace": None, "poisson": Poisson(1.0), "gamma": Gamma(1.0, 2.0)}
    if kind not in arrivals:
        raise ValueError(f"unknown workload {kind!r}; choose one of {', '.join(WORKLOADS)}")
    return Workload(trace=trace, arrivals=arrivals[kind], num_requests=num_requests, seed=seed,
                    with_prompts=False).build()


def apply_slo(requests: list[Request], slo: "str | SLO | IdleMultiple", model, hardware, devices: int,
              token_budget: int = 16384) -> list[Request]:
    """Deadlines from an asap.workload.slo spec: a time budget ("10s", "2s+1ms/tok") as every command takes,
    or "5x" = 5 x the idle sync TTFT of max(L, token_budget) tokens on `devices` devices
    (asap.studies.experiments.with_slo)."""
    try:
        spec = parse_slo(slo, relative=True)
    except ValueError as e:
        raise ValueError(f"--slo: {e}") from None
    if isinstance(spec, IdleMultiple):
        return with_slo(requests, spec.factor, token_budget, model=model, hardware=hardware, devices=devices)
    return spec.apply(requests)


def rate_measure(sim, requests, engine, model, hardware, devices, attention_workers=None, **sim_kw):
    """measure(rate) -> summary of `requests` rescaled to `rate` and simulated (for find_max_rate)."""
    def measure(rate: float) -> dict:
        res = sim(at_rate(requests, rate), engine, model, hardware, devices, attention_workers, **sim_kw)
        return summarize(res.results)
    return measure


def start_rate(sim, requests, engine, model, hardware, devices, attention_workers=None, **sim_kw) -> float:
    """Half the rate a closed batch of the first requests (all arriving at 0) drains at: a search start."""
    sample = [dataclasses.replace(r, arrival=0.0, deadline=None) for r in requests[:max(2 * devices, 64)]]
    res = sim(sample, engine, model, hardware, devices, attention_workers, **sim_kw)
    return 0.5 * len(sample) / max(r.ttft for r in res.results)


def unbounded(found: dict) -> bool:
    """A rate search that never failed: the requests drain within their SLO even arriving all at once."""
    return not found["converged"] and all(s["slo_attainment"] >= found["target"] for _, s in found["points"])


@dataclass
class Candidate:
    attention_workers: int
    expert_workers: int
    analytic: bool                       # the cost model's throughput balance picked it
    attainment_at_ref: float             # SLO attainment at the reference rate
    ttft_p90_ms_at_ref: float | None
    max_slo_rate: float | None = None    # req/s, only for checked candidates
    tokens_per_s_per_device: float | None = None
    converged: bool | None = None


@dataclass
class Plan:
    devices: int
    model: str
    hardware: str
    num_requests: int
    ref_rate: float
    candidates: list[Candidate]          # every feasible A, ascending
    best: Candidate
    sync: dict | None = None             # the sync engine on the same devices, for comparison
    settings: dict = field(default_factory=dict)
    label: str = "SIMULATED"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan(requests: list[Request], devices: int, model="deepseek-v3", hardware="cloudmatrix384", *,
         check: int = 3, target: float = TARGET, tol: float = 0.1, with_sync: bool = True, sim=run,
         **sim_kw) -> Plan:
    """Recommend A:E for `devices` on `requests` (with deadlines). `check` = 0 searches every candidate.
    `sim` is asap.sim.run.run or a stand-in with its signature; sim_kw go to it (policies, zipf, ...)."""
    if not requests or any(r.deadline is None for r in requests):
        raise ValueError("plan needs requests with deadlines (see apply_slo)")
    cfg, hw = get_model(model), get_hardware(hardware)
    e_min = min_expert_workers(cfg, hw)
    if devices - e_min < 1:
        raise ValueError(f"{devices} x {hw.name} cannot hold {cfg.model_type} experts ({e_min} expert workers "
                         f"needed) plus an attention replica")
    tokens = sum(r.num_tokens for r in requests)
    prompt_len = token_weighted_length(requests)
    balance_kw = {k: sim_kw[k] for k in ("token_budget", "microbatches", "max_batch_tokens") if k in sim_kw}
    a0 = balanced_split(CostModel(cfg, hw), devices, prompt_len=prompt_len, **balance_kw)
    common = (sim, requests, "async", model, hardware, devices)

    def search(a: int, lo: float) -> dict:
        return find_max_rate(rate_measure(*common, a, **sim_kw), target=target, lo=lo, tol=tol)

    searched = {a0: search(a0, start_rate(*common, a0, **sim_kw))}
    if unbounded(searched[a0]):
        raise ValueError(f"{len(requests)} requests meet their SLO even at {searched[a0]['max_slo_rate']:.3g} req/s "
                         f"on A={a0}: the SLO-compliant rate is unbounded; use more requests or a tighter SLO")
    ref = searched[a0]["max_slo_rate"] or min(rate for rate, _ in searched[a0]["points"])
    candidates = []
    for a in range(1, devices - e_min + 1):
        s = dict(searched[a0]["points"]).get(ref) if a == a0 else rate_measure(*common, a, **sim_kw)(ref)
        candidates.append(Candidate(a, devices - a, a == a0, s["slo_attainment"], s["ttft_p90_ms"]))
    screened = sorted(candidates, key=lambda c: (-c.attainment_at_ref, _p90(c), c.attention_workers))
    for c in screened[:check] if check > 0 else screened:
        a = c.attention_workers
        found = searched.get(a) or search(a, ref)
        c.max_slo_rate, c.converged = found["max_slo_rate"], found["converged"]
        c.tokens_per_s_per_device = c.max_slo_rate * tokens / len(requests) / devices
    a0_cand = next(c for c in candidates if c.analytic)
    if a0_cand.max_slo_rate is None:        # the analytic pick is always shown searched
        a0_cand.max_slo_rate, a0_cand.converged = searched[a0]["max_slo_rate"], searched[a0]["converged"]
        a0_cand.tokens_per_s_per_device = a0_cand.max_slo_rate * tokens / len(requests) / devices
    checked = [c for c in candidates if c.max_slo_rate is not None]
    best = max(checked, key=lambda c: (c.max_slo_rate, -_p90(c), -c.attention_workers))
    sync = None
    if with_sync:
        sync_kw = {k: v for k, v in sim_kw.items() if k not in ("microbatches", "selector", "window_s",
                                                                "max_wait_s", "max_batch_tokens")}
        found = find_max_rate(rate_measure(sim, requests, "sync", model, hardware, devices, **sync_kw),
                              target=target, lo=start_rate(sim, requests, "sync", model, hardware, devices,
                                                           **sync_kw), tol=tol)
        rate = found["max_slo_rate"]
        sync = {"max_slo_rate": rate, "tokens_per_s_per_device": rate * tokens / len(requests) / devices,
                "converged": found["converged"]}
    settings = {"target_attainment": target, "tolerance": tol, "check": check, "expert_workers_min": e_min,
                **{k: str(v) for k, v in sim_kw.items()}}
    return Plan(devices, str(model), str(hardware), len(requests), ref, candidates, best, sync, settings)


def _p90(c: Candidate) -> float:
    return float("inf") if c.ttft_p90_ms_at_ref is None else c.ttft_p90_ms_at_ref


def format_plan(p: Plan) -> str:
    """The candidates table (SIMULATED) and the recommendation."""
    head = ["A", "E", f"attain@{p.ref_rate:.3g}/s", f"P90 TTFT ms@{p.ref_rate:.3g}/s", "SLO req/s",
            "tok/s/device", "note"]
    rows = [head]
    for c in p.candidates:
        note = ", ".join(n for n, on in (("analytic", c.analytic), ("RECOMMENDED", c is p.best)) if on)
        rows.append([str(c.attention_workers), str(c.expert_workers), f"{c.attainment_at_ref:.2f}",
                     cell(c.ttft_p90_ms_at_ref, ".0f"), cell(c.max_slo_rate, ".3f") + ("*" if c.converged is False
                                                                                         else ""),
                     cell(c.tokens_per_s_per_device, ".0f"), note])
    lines = [line.rstrip() for line in text_table(rows, left=(len(head) - 1,))]
    b = p.best
    out = [f"[SIMULATED] asap plan: {p.model} on {p.devices} x {p.hardware}, {p.num_requests} requests; "
           f"SLO-compliant throughput = max rate with >= {p.settings['target_attainment']:.0%} of requests "
           f"within their TTFT SLO (searched to {p.settings['tolerance']:.0%}; '-' = screened only; * = search did "
           f"not converge)",
           *lines]
    if p.sync is not None:
        out.append(f"sync DP+EP on {p.devices} ranks (for comparison): {p.sync['max_slo_rate']:.3f} req/s, "
                   f"{p.sync['tokens_per_s_per_device']:.0f} tok/s/device")
    if not b.max_slo_rate:
        out.append("no split met the SLO target at any rate tried (SIMULATED): loosen --slo")
        return "\n".join(out)
    out.append(f"recommendation (SIMULATED): A={b.attention_workers} attention + E={b.expert_workers} expert "
               f"workers: {b.max_slo_rate:.3f} req/s SLO-compliant, P90 TTFT "
               f"{cell(b.ttft_p90_ms_at_ref, '.0f')} ms at {p.ref_rate:.3g} req/s")
    return "\n".join(out)


def best_configs(model="deepseek-v3", hardware="cloudmatrix384", devices: int = 32, workload="conversation",
                 slo="2s+1ms/tok", num_requests: int | None = None, verbose: bool = False, executor=None,
                 sustained: bool = False, vet: bool = False, orders: tuple[str, ...] = QUEUE_ORDERS,
                 fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS, lanes: tuple = ()) -> dict:
    """The best-tuned configuration of each engine (SIMULATED; asap.studies.tune, the same search and budget for
    both): {"sync": EngineConfig | None, "async": EngineConfig | None, "results": {engine: Tuned}}.

    workload: a name of asap.workload.presets or a trace path; slo: an asap.workload.slo spec; num_requests: the
    sample (None: as asap sim headline sizes a row, asap.studies.sample_size).
    EngineConfig.spec() gives the engine asap.sim.run.run simulates; None where no candidate has a valid rate
    (Tuned.reason says why). executor (asap.studies.parallel): where the simulations run (default: one after
    another); the results are the same for any. sustained: the headline's --sustained rule (a rate passes only
    if the run drains in time and holds the target in each arrival third, and each refined maximum of either
    engine is confirmed on the same CONFIRM x num_requests requests); vet (with sustained): the headline's
    --vet (each tune re-ranks its screen's leaders on a longer sample, searches its finalists there and
    confirms them as above, asap.studies.tune.tune); orders: the queue orders both engines' candidates try
    (asap.studies.space.secondary; the headline's --orders); fleet_fractions, lanes: the wide group's shares
    of both engines' length-aware fleets and the short-prompt lanes they try (the headline's --fleet-fractions,
    --lanes)."""
    lanes = check_search(fleet_fractions, orders, lanes)
    if vet and not sustained:
        raise ValueError("vet re-ranks on the sample the sustained rule confirms on: set sustained too")
    from asap.studies.tune import CONFIRM, tune
    from asap.workload.presets import workload_requests
    from asap.studies.headline import NUM_REQUESTS
    from asap.studies.sample_size import sample_size
    rule_slo = parse_slo(slo)
    if num_requests is None:
        cost = CostModel(get_model(model), get_hardware(hardware))
        num_requests = sample_size(lambda k: rule_slo.apply(workload_requests(workload, k)), devices, cost,
                                   NUM_REQUESTS)
    pool = rule_slo.apply(workload_requests(workload, num_requests * (CONFIRM if sustained else 1)))
    rule = dict(criterion="requests-sustained", longer=pool, vet=vet) if sustained else {}
    from asap.studies.parallel import Progress
    start = time.time()
    results = {engine: tune(pool[:num_requests], engine, devices, model, hardware, verbose=verbose,
                            executor=executor, progress=Progress(f"tune {engine} x{devices}", start) if verbose
                            else None, orders=tuple(orders), fleet_fractions=tuple(fleet_fractions),
                            lanes=tuple(lanes), **rule)
               for engine in ("sync", "async")}
    return {"sync": results["sync"].best, "async": results["async"].best, "results": results}
