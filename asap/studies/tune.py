"""One tuner for both engines (every figure SIMULATED): the best configuration of sync and of async for a
model, hardware, workload, SLO and device count, found with the same search and the same budget.

Configuration spaces: asap.studies.space (`space`), each candidate an asap.studies.config.EngineConfig.

Search, the same rule and budget for both engines (the space is too large to rate-search every candidate):
1. screen (asap.studies.screen.screen): every primary candidate (TBO on / k=2, queue-aware) is simulated
   at one rate on a short sample, the passing ones again at 1.5x the rate while more than SCREEN_KEEP pass
   (with twice the requests where they still tie at the sample's burst limit); then the secondary variants
   (TBO / router / k / expert window / selector) of the best SCREEN_KEEP are screened the same way;
2. the best FINALISTS screened candidates get a coarse rate search (tol COARSE_TOL), the best REFINE of
   them a fine one (tol FINE_TOL).
A candidate's answer counts only if its search is valid (asap.measure.rate_search: converged, not a burst).
Each candidate simulates the first n requests, n sized so the arrivals at its closed-batch capacity still
span 10x the mean SLO budget (fewer requests where the burst rule allows); a search that hits the burst
limit is rerun with 2n. `criterion="every-bucket"` makes the pass rule ">= target in every prompt-length
bucket" (asap.measure.buckets) instead of ">= target of all requests"; the "-sustained" variants of both also
require the run to drain within its longest TTFT budget after its last arrival and the target to hold in each
third of the run by arrival (asap.measure.sustain), so a rate at which a queue grows until the run ends (one
group's, or everyone's) does not pass. A queue that grows slower than the sample still passes each third of
it, so under those criteria, given `longer` (the same workload continued), each refined maximum is confirmed
on all of `longer`: simulated there at the rate found, and where it fails there, searched down on it
(asap.studies.tune_tasks.confirm); the engine's best is the best confirmed maximum, reported with the longer
sample's size. The caller sizes `longer` (asap sim headline: CONFIRM x the row's requests), so both engines
of a comparison are confirmed on the same requests whatever samples their searches used (confirming each on
CONFIRM x its own search sample held one engine on 1,500 requests and the other on 2,992 of a trace whose later part
is heavier). With `vet` (off by default here; on by default under `asap sim headline --sustained`), the screen's
leaders are first re-ranked on that longer sample (asap.studies.screen.vet), then the secondary variants of the
SCREEN_KEEP best vetted are vetted beside them, and while that makes a new candidate the leader, the leader's own
variants (up to LEADER_ROUNDS times; one knob at a time missed a leader's combination of two: srpt with a lane on
the conversation row at 32 dies, 2.89 req/s tuned against 3.13 in a probe); leaders that pass the vet's whole grid
have it raised while more than FINALISTS tie at its top; each of the FINALISTS best vetted is then searched (tol
FINE_TOL) on the vet's sample from its vetted bracket, instead of the coarse and fine searches on the short one, and
confirmed on all of `longer` as above (the vet's sample is all of `longer`, for both engines alike, so every
finalist is chosen on the requests its maximum is confirmed on: a vet on CONFIRM x each engine's own screen sample
chose sync's finalists on 750 of the synthetic 32-die row's 3,000 requests and async's on 1,496): the screen's short
sample can rank a candidate whose queue grows slowly (a length-aware fleet with too few devices for its long
prompts) far above one that sustains more, which the confirmation of the finalists alone cannot undo; the secondary
knobs screened for the short sample's best are not those of the best the vet finds; and a maximum searched on the
short sample is a floor the downward-only confirmation keeps even where the longer sample sustains more (the 32-die
conversation row's async fleet: 2.62 req/s on 750 requests, 2.80 on 1,500).
`tune(..., prefix_cache=True)` gives every candidate of either engine the same prefix cache (one per replica
/ DP group, asap.scheduler.prefix_cache; off by default) and reports its token hit rate at the best rate.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from asap.measure.rate_search import burst_limit, find_max_rate
from asap.pipeline.plan import token_weighted_length
from asap.scheduler.request import Request
from asap.studies import screen as screening
from asap.studies.config import EngineConfig
from asap.studies.parallel import Executor, Progress, Serial
from asap.studies.screen import FINALISTS, SCREEN_KEEP
from asap.studies.space import FLEET_FRACTIONS, QUEUE_ORDERS, buildable, secondary, space
from asap.studies import tune_tasks as tasks
from asap.studies.tune_tasks import CRITERIA

COARSE_TOL, FINE_TOL, REFINE = 0.2, 0.02, 2
LEADER_ROUNDS = 3           # with vet: rounds that vet the secondary variants of a new leader (see tune)
TARGET = 0.9                # the attainment the criteria require by default
CONFIRM = 2                 # callers size `longer` (the confirmation and vet sample) as CONFIRM x the search's


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
    buckets: dict | None = None         # attainment per prompt-length bucket at the best rate (asap.measure.buckets)
    criterion: str = "requests"
    num_screened: int = 0               # candidates the screen simulated (and, with vet, those only vetted)
    # "-sustained" with `longer`: the best's maximum on its search's requests, before the confirmation on
    # num_requests (all of `longer`); None where no confirmation ran
    search_rate: float | None = None


def tune(requests: list[Request], engine: str, devices: int, model="deepseek-v3", hardware="cloudmatrix384", *,
         candidates: list[EngineConfig] | None = None, target: float = TARGET, zipf: float = 0.0,
         start_rate: float | None = None, refine: int = REFINE, verbose: bool = False,
         prefix_cache: bool = False, criterion: str = "requests", screen: bool | None = None,
         cache: dict | None = None, executor: Executor | None = None, progress: Progress | None = None,
         fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS, longer: list[Request] | None = None,
         vet: bool = False, orders: tuple[str, ...] = QUEUE_ORDERS, lanes: tuple = ()) -> Tuned:
    """Best configuration of `engine` for `requests` (with deadlines) on `devices` devices.
    start_rate: where the first search starts (req/s; default: from a closed batch).
    prefix_cache: every candidate (given or from `space`) runs with the prefix cache on.
    criterion: "requests" (>= target of all requests within SLO) or "every-bucket" (>= target in every
    prompt-length bucket, asap.measure.buckets), or either with "-sustained" (and drained in time).
    screen: screen the candidates before the rate searches (default: when there are more than FINALISTS).
    cache: a dict shared by calls on the same requests (e.g. both criteria): simulations are not repeated.
    executor (asap.studies.parallel): runs the screen's simulations and the fine searches side by side; the
    result is the same as a serial run's (default). progress: prints a line per simulation (to stderr).
    fleet_fractions: the wide group's shares the length-aware fleets of the space try (asap.studies.space.space).
    orders: the queue orders the space's candidates try as a secondary knob (asap.studies.space.secondary);
    lanes: the short-prompt lanes they try likewise ((replicas, below_tokens) pairs, those a layout holds).
    longer: the same workload continued (more requests, the first len(requests) of them `requests`); under a
    "-sustained" criterion each refined maximum is confirmed on all of it (asap.studies.tune_tasks.confirm), and
    the best confirmed one wins: give both engines the same `longer` and both are confirmed on the same
    requests. Ignored under the other criteria.
    vet: with `longer` under a "-sustained" criterion, the screen's leaders are re-ranked on the confirmation
    sample before the finalists are chosen (asap.studies.screen.vet; with the space's candidates, the
    secondary variants of the SCREEN_KEEP best vetted are then vetted too, and those of each new leader, up to
    LEADER_ROUNDS times), and every finalist is searched on that sample from its vetted bracket and confirmed
    on all of `longer`: the short screen can rank a
    candidate whose queue grows slowly above one that sustains more, and understate one the longer sample
    shows sustaining more."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    key = CRITERIA[criterion]
    if not requests or any(r.deadline is None for r in requests):
        raise ValueError("tune needs requests with deadlines (asap.workload.slo.SLO.apply)")
    confirm = longer is not None and criterion.endswith("-sustained")
    if confirm and (len(longer) <= len(requests) or any(r.deadline is None for r in longer)
                    or any((a.arrival, a.num_tokens) != (b.arrival, b.num_tokens) for a, b in zip(requests, longer))):
        raise ValueError("longer must continue `requests` (the same workload, more of it, with deadlines)")
    prompt_len = token_weighted_length(requests)
    cands = candidates if candidates is not None else space(engine, devices, model, hardware, prompt_len, full=False,
                                                            fleet_fractions=fleet_fractions)
    if prefix_cache:
        cands = list(dict.fromkeys(dataclasses.replace(c, prefix_cache=True) for c in cands))
    if not cands:
        return Tuned(engine, devices, None, None, None, None, reason="no feasible configuration")
    sims = 0
    cache = {} if cache is None else cache
    ex = executor or Serial()

    def task(c: EngineConfig, n: int, rate: float) -> tuple:
        return ((longer if n > len(requests) else requests)[:n], rate, engine, model, hardware, devices, c, zipf,
                progress)

    def measure_for(c: EngineConfig, n: int):
        def measure(rate: float) -> dict:
            nonlocal sims
            k = (engine, devices, c, n, round(rate, 9), zipf)
            if k not in cache:
                sims += 1
                cache[k] = tasks.simulate(task(c, n, rate))
            return cache[k]
        return measure

    def prefetch(points) -> None:
        """Simulate the (candidate, n, rate) points not cached yet side by side (measure then finds them)."""
        nonlocal sims
        todo = {}
        for c, n, rate in points:
            k = (engine, devices, c, n, round(rate, 9), zipf)
            if k not in cache and k not in todo:
                todo[k] = task(c, n, rate)
        for k, summary in zip(todo, ex.map(tasks.simulate, todo.values())):
            cache[k] = summary
            sims += 1

    def searches(jobs) -> list[dict]:
        """Rate searches (find_max_rate), one per (candidate, n, keyword arguments), side by side: each runs
        whole in a worker with the cached simulations of its candidate on n requests, and hands back its
        answer and the simulations it added (the same a serial run makes)."""
        nonlocal sims
        out = []
        for (c, n, kw), (found, added) in zip(jobs, ex.map(tasks.search, [
                (task(c, n, kw["lo"]), {k: v for k, v in cache.items() if k[:4] == (engine, devices, c, n)}, kw)
                for c, n, kw in jobs])):
            out.append(found)
            cache.update(added)
            sims += len(added)
        return out

    def burst_of(n: int) -> float:
        pool = longer if n > len(requests) else requests
        return burst_limit(n, sum(r.deadline - r.arrival for r in pool[:n]) / n)

    def variants(ranked: dict, keep: int = SCREEN_KEEP) -> list[EngineConfig]:
        """The secondary variants (asap.studies.space.secondary) of the `keep` best of `ranked` not yet in it,
        those a layout cannot hold left out (a lane; asap.studies.space.buildable)."""
        more = [v for c in list(ranked)[:keep] for v in secondary(c, orders, lanes)
                if v not in ranked and (not v.short_replicas or buildable(v, devices, model, hardware))]
        return [dataclasses.replace(v, prefix_cache=True) for v in more] if prefix_cache else more

    screened: dict = {}
    start = start_rate
    vetted = 0          # with vet: the vet's sample size (all of `longer`), on which every finalist is searched
    if screen if screen is not None else len(cands) > FINALISTS:
        if start is None:
            start = tasks.closed_batch_rate(requests, engine, devices, model, hardware, cands[0], zipf)
            sims += 1
        screened = screening.screen(cands, measure_for, burst_of, len(requests), start, target, key, prefetch)
        if candidates is None:      # the secondary knobs of the best primary candidates (asap.studies.space.space)
            more = variants(screened)
            screened.update(screening.screen(more, measure_for, burst_of, len(requests), start, target, key, prefetch))
            screened = dict(sorted(screened.items(), key=lambda kv: kv[1]["score"], reverse=True))
        if vet and confirm:     # the screen's leaders re-ranked on the confirmation sample, finalists searched there
            m = len(longer)     # both engines' finalists chosen on the requests their maxima are confirmed on
            screened = screening.vet(screened, measure_for, m, target, key, prefetch, burst=burst_of(m))
            if candidates is None:  # and the secondary knobs of the vetted best, then of each new leader
                screened = screening.vet_variants(screened, measure_for, m, target, key, prefetch, variants,
                                                  LEADER_ROUNDS, burst=burst_of(m))
            vetted = m
        cands = list(screened)[:FINALISTS]
        passed = [s["passed_rate"] for s in screened.values() if s["passed_rate"]]
        start = max(passed) if passed else start
    rows = []
    if vetted:      # each finalist searched on the vet's sample from its vetted bracket, side by side
        jobs = []
        for c in cands:
            sc = screened[c]
            lo = sc.get("vet_rate") or sc["passed_rate"] or 0.5 * start
            hi = sc.get("vet_hi")
            jobs.append((c, vetted, dict(target=target, lo=lo, hi=hi if hi and hi > lo else None, tol=FINE_TOL,
                                         max_iters=10, burst_above=burst_of(vetted), key=key)))
        for c, found in zip(cands, searches(jobs)):
            rows.append({"config": c, "coarse": found, "fine": found, "n": vetted, "vetted": True})
    for c in cands if not vetted else ():
        if start is None:
            cap = tasks.closed_batch_rate(requests, engine, devices, model, hardware, c, zipf) * 2
            sims += 1
        else:
            cap = 2 * start
        n = len(requests)
        while n > 64 and burst_of(n // 2) >= (start or cap):
            n //= 2
        lo = min(start or 0.5 * cap, 0.5 * burst_of(n))
        while True:
            found = find_max_rate(measure_for(c, n), target=target, lo=lo, tol=COARSE_TOL, max_iters=10,
                                  burst_above=burst_of(n), key=key)
            if found["valid"] or "burst" not in (found["reason"] or "") or n >= len(requests):
                break
            n = min(len(requests), 2 * n)
        rows.append({"config": c, "coarse": found, "n": n})
        if found["valid"]:
            start = max(start or 0.0, found["max_slo_rate"])
    ranked = sorted((r for r in rows if r["coarse"]["valid"] and not r.get("vetted")),
                    key=lambda r: -r["coarse"]["max_slo_rate"])
    fine = [(r["config"], r["n"], dict(target=target, lo=r["coarse"]["max_slo_rate"],
                                       hi=r["coarse"]["max_slo_rate"] * (1 + COARSE_TOL), tol=FINE_TOL, max_iters=8,
                                       burst_above=burst_of(r["n"]), key=key)) for r in ranked[:refine]]
    for r, found in zip(ranked[:refine], searches(fine)):
        r["fine"] = found
    valid = [r for r in rows if r.get("fine", {}).get("valid")]
    table = [{"config": dataclasses.asdict(r["config"]), "describe": r["config"].describe(devices),
              "coarse_rate": r["coarse"]["max_slo_rate"] if r["coarse"]["valid"] and not r.get("vetted") else None,
              "coarse_reason": r["coarse"]["reason"], "num_requests": r["n"],
              "fine_rate": r["fine"]["max_slo_rate"] if r.get("fine", {}).get("valid") else None,
              **screening.screen_cols(screened.get(r["config"]))} for r in rows]
    table += [{"config": dataclasses.asdict(c), "describe": c.describe(devices), "coarse_rate": None,
               "coarse_reason": "screened out", "num_requests": sc["n"], "fine_rate": None, **screening.screen_cols(sc)}
              for c, sc in screened.items() if c not in cands]
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
                     lower_bound_config=top["config"] if top else None, num_screened=len(screened),
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
                     num_screened=len(screened), reason=f"{top['config'].describe(devices)} still passes at {top['coarse']['max_slo_rate']:.3g} "
                            f"req/s, at or above the best certified maximum ({best['fine']['max_slo_rate']:.3g} req/s, "
                            f"{best['config'].describe(devices)}), and its search is not valid "
                            f"({top['coarse']['reason']}): more requests are needed to rank them")
    search_rate, pool = None, requests
    if confirm:
        m, pool = len(longer), longer   # the same requests for every maximum (and, given the same `longer`, engine)
        # one searched on all of `longer` (the vet's sample is) has nothing longer to be confirmed on
        jobs = [None if m == r["n"] else
                ((longer, r["fine"]["max_slo_rate"], engine, model, hardware, devices, r["config"], zipf, progress),
                 dict(lo=r["fine"]["max_slo_rate"] / (1 + COARSE_TOL), hi=r["fine"]["max_slo_rate"], target=target,
                      tol=FINE_TOL, max_iters=10, key=key, burst_above=burst_of(m))) for r in valid]
        confirmed = iter(ex.map(tasks.confirm, [j for j in jobs if j is not None]))
        for r, job in zip(valid, jobs):
            found, added = next(confirmed) if job is not None else (dict(r["fine"], held=True), {})
            r["confirmed"], r["m"] = found, m
            cache.update(added)
            sims += len(added)
        for t in table:
            for r in valid:
                if t["config"] == dataclasses.asdict(r["config"]):
                    t["sustained_rate"] = r["confirmed"]["max_slo_rate"] if r["confirmed"]["valid"] else None
                    t["sustained_num_requests"] = r["m"]
        held = [r for r in valid if r["confirmed"]["valid"]]
        if not held:
            return Tuned(engine, devices, None, None, None, None, table, sims, num_screened=len(screened),
                         reason="no refined maximum is sustained on " + ", ".join(
                             f"{r['m']} requests ({r['config'].describe(devices)}: {r['confirmed']['reason']})"
                             for r in valid))
        best = max(held, key=lambda r: r["confirmed"]["max_slo_rate"])
        search_rate = best["fine"]["max_slo_rate"]
        rate, n = best["confirmed"]["max_slo_rate"], best["m"]
        at_best = cache[(engine, devices, best["config"], n, round(rate, 9), zipf)]    # tasks.confirm simulated it
    else:
        rate, n = best["fine"]["max_slo_rate"], best["n"]
        at_best = measure_for(best["config"], n)(rate)
    p90 = at_best["ttft_p90_ms"]
    mean_tokens = sum(r.num_tokens for r in pool[:n]) / n      # cached tokens count as served input
    return Tuned(engine, devices, best["config"], rate, None if p90 is None else p90 / 1e3,
                 rate * mean_tokens / devices, table, sims, num_requests=n,
                 prefix_hit_rate=at_best.get("prefix_token_hit_rate"), buckets=at_best["buckets"],
                 criterion=criterion, num_screened=len(screened), search_rate=search_rate)


def best_of_criteria(main: Tuned, per_bucket: Tuned, requests: list[Request], longer: list[Request] | None = None, *,
                     model="deepseek-v3", hardware="cloudmatrix384", target: float = TARGET,
                     cache: dict | None = None, progress: Progress | None = None) -> Tuned:
    """An engine's best under `main`'s criterion, given its tune under the every-bucket one (`per_bucket`, on
    the same requests): at least `target` in every prompt-length bucket implies at least `target` of all
    requests (and so for the "-sustained" variants: each arrival third's attainment bounds both alike), so where
    the every-bucket best sustains a higher rate than main's best, it is a better main-criterion configuration
    than the one main found (its searches' 5% tolerance and its finalists' choice on a sample can miss it: the
    synthetic 32-die row's sync every-bucket fleet held 1.534 req/s, its main-criterion best 1.498). Then that
    configuration is searched under main's criterion on the requests its every-bucket maximum was certified on,
    upward from that maximum, and the better of the two is returned (with the search's row added to the
    candidates); otherwise `main` as it is, and so where main found that its requests cannot rank its candidates
    (a lower bound, no best: a configuration naming a maximum there would hide that). cache: tune's, shared with
    both tunes (no simulation repeated)."""
    if per_bucket.best is None or per_bucket.best == main.best or per_bucket.criterion == main.criterion \
            or main.lower_bound is not None \
            or (main.max_slo_rate is not None and main.max_slo_rate >= per_bucket.max_slo_rate):
        return main
    n = per_bucket.num_requests
    pool = (longer if longer is not None and n > len(requests) else requests)[:n]
    engine, devices, c, key = main.engine, main.devices, per_bucket.best, CRITERIA[main.criterion]
    cache = {} if cache is None else cache
    added = 0

    def measure(rate: float) -> dict:
        nonlocal added
        k = (engine, devices, c, n, round(rate, 9), 0.0)
        if k not in cache:
            added += 1
            cache[k] = tasks.simulate((pool, rate, engine, model, hardware, devices, c, 0.0, progress))
        return cache[k]
    found = find_max_rate(measure, target=target, lo=per_bucket.max_slo_rate,
                          hi=per_bucket.max_slo_rate * (1 + COARSE_TOL), tol=FINE_TOL, max_iters=10, key=key,
                          burst_above=burst_limit(n, sum(r.deadline - r.arrival for r in pool) / n))
    row = {"config": dataclasses.asdict(c), "describe": c.describe(devices), "coarse_rate": None,
           "coarse_reason": "the every-bucket best, searched under this criterion", "num_requests": n,
           "fine_rate": found["max_slo_rate"] if found["valid"] else None}
    if main.criterion.endswith("-sustained") and longer is not None:
        row |= {"sustained_rate": row["fine_rate"], "sustained_num_requests": n}
    out = dataclasses.replace(main, candidates=main.candidates + [row], num_sims=main.num_sims + added)
    if not found["valid"] or (main.max_slo_rate is not None and found["max_slo_rate"] <= main.max_slo_rate):
        return out
    rate = found["max_slo_rate"]
    at_best = measure(rate)
    p90 = at_best["ttft_p90_ms"]
    return dataclasses.replace(out, best=c, max_slo_rate=rate, ttft_p90_s=None if p90 is None else p90 / 1e3,
                               tokens_per_s_per_device=rate * sum(r.num_tokens for r in pool) / n / devices,
                               num_requests=n, prefix_hit_rate=at_best.get("prefix_token_hit_rate"),
                               buckets=at_best["buckets"], search_rate=None, reason=None, lower_bound=None,
                               lower_bound_config=None)


def _rate(x) -> str:
    return f"{x:8.3f}" if x is not None else "       -"
