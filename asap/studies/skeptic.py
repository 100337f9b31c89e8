"""What a skeptic asks of a headline row (asap.studies.headline), both engines alike (every figure SIMULATED):
attainment per prompt-length bucket at the compared rate, the ratio at other attainment targets and under the
every-bucket criterion (`skeptic_views`), and at other SLO scales (`ratio_by_slo_scale`); each re-search is a
plain rate search of one configuration (`rate_at`)."""
from __future__ import annotations

from asap.measure.buckets import by_length, min_bucket_attainment
from asap.measure.metrics import summarize
from asap.measure.rate_search import burst_limit, find_max_rate
from asap.sim.run import run
from asap.studies.config import EngineConfig
from asap.studies.experiments import at_rate
from asap.studies.parallel import Serial
from asap.studies.tune_tasks import CRITERIA, simulate

TARGETS = (0.85, 0.9, 0.95)     # the ratio is printed at each attainment target (the row is tuned at 0.9)


def rate_at(requests, c: EngineConfig, devices: int, model, hardware, lo: float, tol: float = 0.1,
            target: float = 0.9, criterion: str = "requests", cache: dict | None = None) -> dict:
    """A valid-or-not rate search for one fixed configuration (the SLO-scale and target sweeps).
    criterion: asap.studies.tune_tasks.CRITERIA's; cache: {rate: summary}, shared by searches of this configuration
    on these requests (e.g. both criteria), so no rate is simulated twice."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    mean_budget = sum(r.deadline - r.arrival for r in requests) / len(requests)
    cache = {} if cache is None else cache

    def measure(rate):
        if rate not in cache:       # the summary the tune ranks by (its values for every criterion)
            cache[rate] = simulate((requests, rate, c.engine, model, hardware, devices, c, 0.0, None))
        return cache[rate]
    return find_max_rate(measure, target=target, lo=lo, tol=tol, max_iters=10, key=CRITERIA[criterion],
                         burst_above=burst_limit(len(requests), mean_budget))


def buckets_at(requests, c: EngineConfig, devices: int, model, hardware, rate: float) -> dict:
    """Attainment per prompt-length bucket of one configuration at one rate (asap.measure.buckets)."""
    res = run(at_rate(requests, rate), c.spec(model, hardware, devices))
    return {"overall": summarize(res.results)["slo_attainment"], "min_bucket": min_bucket_attainment(res.results),
            "buckets": by_length(res.results)}


def rate_at_task(job: tuple) -> dict:
    """rate_at as an executor's task: (positional arguments, keyword arguments)."""
    args, kw = job
    return rate_at(*args, **kw)


def skeptic_views(row, reqs, devices, model, hardware, every_bucket: bool, executor=None,
             criterion: str = "requests") -> None:
    """What a skeptic asks of a row: both engines' attainment per prompt-length bucket at the compared rate
    (the lower of the two maxima, where both claim >= 90% of requests), the ratio at other attainment
    targets (the two best configurations re-searched), and the ratio under the every-bucket criterion."""
    s, a = row["sync"], row["async"]
    cfg = {e: EngineConfig(**row[e]["config"]) for e in ("sync", "async") if row[e]["config"]}
    if len(cfg) == 2:
        rate = min(s["max_slo_rate"], a["max_slo_rate"])
        n = min(len(reqs), max(s["num_requests"] or 0, a["num_requests"] or 0))
        row["compared"] = {"rate": rate, "num_requests": n,
                           **{e: buckets_at(reqs[:n], cfg[e], devices, model, hardware, rate) for e in cfg}}
    rates, searches = {}, {}      # the re-searches are independent: run side by side where an executor allows
    for target in TARGETS:
        if target == 0.9:
            rates[str(target)] = {"sync": s["max_slo_rate"], "async": a["max_slo_rate"]}
            continue
        rates[str(target)] = {}
        for e in ("sync", "async"):
            rates[str(target)][e] = None
            if e not in cfg or not row[e]["max_slo_rate"]:
                continue
            n = row[e]["num_requests"] or len(reqs)
            searches[(str(target), e)] = ((reqs[:n], cfg[e], devices, model, hardware, row[e]["max_slo_rate"]),
                                          dict(target=target, criterion=criterion))
    for (target, e), found in zip(searches, (executor or Serial()).map(rate_at_task, searches.values())):
        rates[target][e] = found["max_slo_rate"] if found["valid"] else None
    row["ratio_by_target"] = {k: {"ratio": v["async"] / v["sync"] if v["sync"] and v["async"] else None, **v}
                              for k, v in rates.items()}
    if every_bucket:
        se, ae = s["every_bucket"]["max_slo_rate"], a["every_bucket"]["max_slo_rate"]
        row["ratio_every_bucket"] = ae / se if se and ae else None


def ratio_by_slo_scale(row, reqs, base, base_slo, slo_scales, devices, model, hardware, executor=None,
            criterion: str = "requests") -> dict:
    """The row's ratio at each SLO scale k (its deadlines k x the base SLO's): both engines' best configurations
    re-searched on k x their requests (at least; a looser SLO needs longer arrivals to stay a steady state)."""
    searches = {}       # independent: run side by side where an executor allows
    for k in slo_scales:
        if k == 1.0:
            continue
        for engine in ("sync", "async"):
            cfg = row[engine]["config"]
            # a looser SLO needs longer arrivals to stay a steady state (the burst rule): k x the requests
            n = min(len(base), int((row[engine]["num_requests"] or len(base)) * max(1.0, 1.5 * k)))
            if cfg is None:
                continue
            scaled = base_slo.scaled(k).apply(base[:n])
            lo = (row[engine]["max_slo_rate"] or 0.1) * k
            searches[(k, engine)] = ((scaled, EngineConfig(**cfg), devices, model, hardware, lo),
                                     dict(criterion=criterion))
    found = dict(zip(searches, (executor or Serial()).map(rate_at_task, searches.values())))
    out = {}
    for k in slo_scales:
        if k == 1.0:
            out[str(k)] = row["ratio"]
            continue
        rates = {e: found[(k, e)]["max_slo_rate"] if (k, e) in found and found[(k, e)]["valid"] else None
                 for e in ("sync", "async")}
        out[str(k)] = rates["async"] / rates["sync"] if rates["sync"] and rates["async"] else None
    return out
