"""One tuner for both engines (every figure SIMULATED): the best configuration of sync and of async for a
model, hardware, workload, SLO and device count, found with the same search and the same budget.

Configuration spaces (`space`), the knobs each engine has in deployment:
- sync  (SGLang / vLLM DP-attention + EP): attention TP inside each DP group (1 / 4 / 8 / 16 where a node
        holds it), the per-DP-group chunk (SGLang's chunked_prefill_size / dp_size; 4K or 16K tokens),
        independent instances of INSTANCE_DEVICES devices at large N, two-batch overlap on, EPLB
        redundant experts, queue-aware routing;
- async (ASAP): attention TP per replica (1 / 4), the per-replica chunk (4K or 16K tokens), the A:E split
        (the cost model's balance point, and 25% more attention replicas, or 20% fewer where memory is
        full), 2 micro-batches.
Both spaces hold the same number of candidates. Search: every candidate gets a coarse rate search
(tol COARSE_TOL); the best REFINE get a fine one (tol FINE_TOL). A candidate's answer counts only if its
search is valid (asap.measure.rate_search: converged, not a burst). Each candidate simulates the first n
requests, n sized so the arrivals at its closed-batch capacity still span 10x the mean SLO budget
(fewer requests where the burst rule allows); a search that hits the burst limit is rerun with 2n.
`tune(..., prefix_cache=True)` gives every candidate of either engine the same prefix cache (one per replica
/ DP group, asap.scheduler.prefix_cache; off by default) and reports its token hit rate at the best rate.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from asap.measure.metrics import summarize
from asap.measure.rate_search import burst_limit, find_max_rate
from asap.cost.hardware import get_hardware
from asap.cost.model import CostModel
from asap.scheduler.request import Request
from asap.sim.experiments import at_rate
from asap.sim.memory import min_expert_workers
from asap.sim.run import balanced_split, get_model, run

INSTANCE_DEVICES = 32       # a sync prefill instance at large N (DeepSeek's and SGLang's EP32 on 4 nodes)
COARSE_TOL, FINE_TOL, REFINE = 0.2, 0.05, 2
TARGET = 0.9


@dataclass(frozen=True)
class EngineConfig:
    engine: str                         # "sync" | "async"
    attention_tp: int = 1
    token_budget: int = 16384           # tokens per step of one DP group (sync) / replica (async)
    instances: int = 1                  # independent instances (devices split evenly)
    attention_workers: int | None = None    # async: attention replicas A per instance (each attention_tp devices)
    microbatches: "int | str" = 2       # async micro-batches per step
    two_batch_overlap: bool = True      # sync
    router: str = "queue-aware"
    redundant_experts: int | None = None
    prefix_cache: bool = False          # a prefix cache per replica / DP group (the same policy for both)

    def sim_kw(self) -> dict:
        kw = dict(attention_tp=self.attention_tp, token_budget=self.token_budget, router=self.router,
                  redundant_experts=self.redundant_experts, instances=self.instances)
        if self.prefix_cache:
            kw.update(prefix_cache=True)
        if self.engine == "sync":
            kw.update(two_batch_overlap=self.two_batch_overlap)
        else:
            kw.update(microbatches=self.microbatches)
        return kw

    def describe(self, devices: int) -> str:
        return self._describe(devices) + (", prefix cache" if self.prefix_cache else "")

    def _describe(self, devices: int) -> str:
        if self.engine == "sync":
            per = devices // self.instances
            return (f"sync {self.instances}x[DP{per // self.attention_tp} x TP{self.attention_tp}, EP{per}], "
                    f"chunk {self.token_budget}/group, TBO {'on' if self.two_batch_overlap else 'off'}")
        per = devices // self.instances
        E = per - self.attention_workers * self.attention_tp
        inst = f"{self.instances}x" if self.instances > 1 else ""
        return (f"async {inst}[A={self.attention_workers} x TP{self.attention_tp} + E={E}], chunk {self.token_budget}"
                f"/replica, k={self.microbatches}")


def space(engine: str, devices: int, model="deepseek-v3", hardware="cloudmatrix384",
          prompt_len: float = 4096) -> list[EngineConfig]:
    """The candidate configurations of `engine` on `devices` devices (feasible ones only)."""
    cfg, hw = get_model(model), get_hardware(hardware)
    out = []
    if engine == "sync":
        per = INSTANCE_DEVICES if devices > INSTANCE_DEVICES and devices % INSTANCE_DEVICES == 0 else devices
        for tp in (1, 4, 8, 16):
            for budget in (4096, 16384):
                if per % tp or tp > hw.link.node_size:
                    continue
                out.append(EngineConfig("sync", tp, budget, instances=devices // per))
        return out
    if engine != "async":
        raise ValueError(f"engine must be 'sync' or 'async', got {engine!r}")
    e_min = min_expert_workers(cfg, hw)
    for tp in (1, 4):
        for budget in (4096, 16384):
            try:
                a0 = balanced_split(CostModel(cfg, hw, attn_tp=tp), devices, budget, 2, prompt_len)
            except ValueError:
                continue
            a_max = (devices - e_min) // tp
            alt = max(a0 + 1, math.ceil(a0 * 1.25))          # more replicas, or fewer where memory says no
            if alt > a_max:
                alt = min(a0 - 1, math.floor(a0 * 0.8))
            for a in sorted({a0, alt} if alt >= 1 else {a0}):
                out.append(EngineConfig("async", tp, budget, attention_workers=a))
    return out


@dataclass
class Tuned:
    engine: str
    devices: int
    best: EngineConfig | None
    max_slo_rate: float | None          # req/s, only from a valid search
    ttft_p90_s: float | None            # P90 TTFT at that rate
    tokens_per_s_per_device: float | None
    candidates: list[dict] = field(default_factory=list)
    num_sims: int = 0
    reason: str | None = None
    num_requests: int | None = None     # requests the best candidate's search simulated
    prefix_hit_rate: float | None = None    # prompt tokens served from the prefix caches at the best rate
    # no best: a candidate whose search is not valid passed at this rate, at or above the best certified maximum
    lower_bound: float | None = None
    lower_bound_config: EngineConfig | None = None  # the candidate that passed there


def tune(requests: list[Request], engine: str, devices: int, model="deepseek-v3", hardware="cloudmatrix384", *,
         candidates: list[EngineConfig] | None = None, target: float = TARGET, zipf: float = 0.0,
         start_rate: float | None = None, refine: int = REFINE, verbose: bool = False,
         prefix_cache: bool = False) -> Tuned:
    """Best configuration of `engine` for `requests` (with deadlines) on `devices` devices.
    start_rate: where the first search starts (req/s; default: from a closed batch).
    prefix_cache: every candidate (given or from `space`) runs with the prefix cache on."""
    if not requests or any(r.deadline is None for r in requests):
        raise ValueError("tune needs requests with deadlines (asap.workload.slo.SLO.apply)")
    prompt_len = sum(r.num_tokens ** 2 for r in requests) / sum(r.num_tokens for r in requests)
    cands = candidates if candidates is not None else space(engine, devices, model, hardware, prompt_len)
    if prefix_cache:
        cands = list(dict.fromkeys(dataclasses.replace(c, prefix_cache=True) for c in cands))
    if not cands:
        return Tuned(engine, devices, None, None, None, None, reason="no feasible configuration")
    sims = 0
    cache: dict = {}

    def measure_for(c: EngineConfig, n: int):
        reqs = requests[:n]

        def measure(rate: float) -> dict:
            nonlocal sims
            key = (c, n, round(rate, 9))
            if key not in cache:
                sims += 1
                res = run(at_rate(reqs, rate), engine, model, hardware, devices, c.attention_workers,
                          zipf=zipf, **c.sim_kw())
                cache[key] = summarize(res.results)
                if "prefix_cache" in res.stats:
                    cache[key]["prefix_token_hit_rate"] = res.stats["prefix_cache"]["token_hit_rate"]
            return cache[key]
        return measure

    def burst_of(n: int) -> float:
        return burst_limit(n, sum(r.deadline - r.arrival for r in requests[:n]) / n)

    rows = []
    start = start_rate
    for c in cands:
        if start is None:
            cap = _closed_batch_rate(requests, engine, devices, model, hardware, c, zipf) * 2
            sims += 1
        else:
            cap = 2 * start
        n = len(requests)
        while n > 64 and burst_of(n // 2) >= (start or cap):
            n //= 2
        lo = min(start or 0.5 * cap, 0.5 * burst_of(n))
        while True:
            found = find_max_rate(measure_for(c, n), target=target, lo=lo, tol=COARSE_TOL, max_iters=10,
                                  burst_above=burst_of(n))
            if found["valid"] or "burst" not in (found["reason"] or "") or n >= len(requests):
                break
            n = min(len(requests), 2 * n)
        rows.append({"config": c, "coarse": found, "n": n})
        if found["valid"]:
            start = max(start or 0.0, found["max_slo_rate"])
    ranked = sorted((r for r in rows if r["coarse"]["valid"]), key=lambda r: -r["coarse"]["max_slo_rate"])
    for r in ranked[:refine]:
        lo, n = r["coarse"]["max_slo_rate"], r["n"]
        r["fine"] = find_max_rate(measure_for(r["config"], n), target=target, lo=lo, hi=lo * (1 + COARSE_TOL),
                                  tol=FINE_TOL, max_iters=8, burst_above=burst_of(n))
    valid = [r for r in rows if r.get("fine", {}).get("valid")]
    table = [{"config": dataclasses.asdict(r["config"]), "describe": r["config"].describe(devices),
              "coarse_rate": r["coarse"]["max_slo_rate"] if r["coarse"]["valid"] else None,
              "coarse_reason": r["coarse"]["reason"], "num_requests": r["n"],
              "fine_rate": r["fine"]["max_slo_rate"] if r.get("fine", {}).get("valid") else None} for r in rows]
    if verbose:
        for t in table:
            print(f"[SIMULATED]   {t['describe']:<60} coarse {_rate(t['coarse_rate'])} fine {_rate(t['fine_rate'])}"
                  + (f" ({t['coarse_reason']})" if t["coarse_reason"] else ""), flush=True)
    if not valid:
        reasons = sorted({r["coarse"]["reason"] for r in rows if r["coarse"]["reason"]})
        passed = [r for r in rows if r["coarse"]["max_slo_rate"]]     # a rate it passed at: a lower bound
        top = max(passed, key=lambda r: r["coarse"]["max_slo_rate"]) if passed else None
        return Tuned(engine, devices, None, None, None, None, table, sims,
                     num_requests=top["n"] if top else None,
                     lower_bound=top["coarse"]["max_slo_rate"] if top else None,
                     lower_bound_config=top["config"] if top else None,
                     reason="no candidate has a valid rate: " + "; ".join(reasons))
    best = max(valid, key=lambda r: r["fine"]["max_slo_rate"])
    # A search that is not valid still passed at its highest rate: a lower bound on that candidate's maximum.
    # Where one reaches the best certified maximum, these requests cannot tell which candidate is best, and
    # naming the certified one would report a weaker configuration (and rate) as the engine's best.
    unranked = [r for r in rows if not r["coarse"]["valid"]
                and (r["coarse"]["max_slo_rate"] or 0.0) >= best["fine"]["max_slo_rate"]]
    if unranked:
        top = max(unranked, key=lambda r: r["coarse"]["max_slo_rate"])
        return Tuned(engine, devices, None, None, None, None, table, sims, num_requests=top["n"],
                     lower_bound=top["coarse"]["max_slo_rate"], lower_bound_config=top["config"],
                     reason=f"{top['config'].describe(devices)} still passes at {top['coarse']['max_slo_rate']:.3g} "
                            f"req/s, at or above the best certified maximum ({best['fine']['max_slo_rate']:.3g} req/s, "
                            f"{best['config'].describe(devices)}), and its search is not valid "
                            f"({top['coarse']['reason']}): more requests are needed to rank them")
    rate, n = best["fine"]["max_slo_rate"], best["n"]
    at_best = measure_for(best["config"], n)(rate)
    p90 = at_best["ttft_p90_ms"]
    mean_tokens = sum(r.num_tokens for r in requests[:n]) / n      # cached tokens count as served input
    return Tuned(engine, devices, best["config"], rate, None if p90 is None else p90 / 1e3,
                 rate * mean_tokens / devices, table, sims, num_requests=n,
                 prefix_hit_rate=at_best.get("prefix_token_hit_rate"))


def _closed_batch_rate(requests, engine, devices, model, hardware, c: EngineConfig, zipf: float) -> float:
    """Half the rate a closed batch of the first requests (all arriving at 0) drains at: a search start."""
    sample = [dataclasses.replace(r, arrival=0.0, deadline=None) for r in requests[:max(2 * devices, 64)]]
    res = run(sample, engine, model, hardware, devices, c.attention_workers, zipf=zipf, **c.sim_kw())
    return 0.5 * len(sample) / max(r.ttft for r in res.results)


def _rate(x) -> str:
    return f"{x:8.3f}" if x is not None else "       -"
