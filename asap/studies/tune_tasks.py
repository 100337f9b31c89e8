"""What the tuner (asap.studies.tune) measures, and the tasks it hands an executor (asap.studies.parallel):
one simulation's summary with the values its criteria compare (`simulate`, `pass_values`, CRITERIA), one rate
search of a candidate from its cached simulations (`search`), the confirmation of a maximum on the longer
sample (`confirm`), and a search's starting rate (`closed_batch_rate`). Module-level functions of picklable
tuples, so any executor runs them; every figure they give is SIMULATED."""
from __future__ import annotations

import dataclasses

from asap.measure.buckets import by_length, min_bucket_attainment
from asap.measure.metrics import summarize
from asap.measure.rate_search import find_max_rate
from asap.measure.sustain import sustained_value
from asap.sim.run import run
from asap.studies.config import EngineConfig
from asap.studies.experiments import at_rate

CRITERIA = {"requests": "slo_attainment", "every-bucket": "min_bucket_attainment",
            "requests-sustained": "sustained_attainment", "every-bucket-sustained": "sustained_min_bucket_attainment"}


def pass_values(results, slo_attainment: float | None) -> dict:
    """The values the criteria compare with the target, but slo_attainment (summarize's, passed in): the worst
    length bucket's attainment, and both again as the run sustains them (asap.measure.sustain.sustained_value:
    no higher than the worst arrival third's attainment, zero where the run did not drain in time)."""
    worst = min_bucket_attainment(results)
    return {"min_bucket_attainment": worst, "sustained_attainment": sustained_value(results, slo_attainment),
            "sustained_min_bucket_attainment": sustained_value(results, worst)}


def simulate(task: tuple) -> dict:
    """One simulation of a search, the summary it is ranked by (a module-level function: an executor's task)."""
    reqs, rate, engine, model, hardware, devices, c, zipf, progress = task
    res = run(at_rate(reqs, rate), c.spec(model, hardware, devices, zipf=zipf))
    out = summarize(res.results)
    out["buckets"] = by_length(res.results)
    out |= pass_values(res.results, out["slo_attainment"])
    if "prefix_cache" in res.stats:
        out["prefix_token_hit_rate"] = res.stats["prefix_cache"]["token_hit_rate"]
    if progress is not None:
        within, worst = out["slo_attainment"], out["min_bucket_attainment"]
        progress(f"{c.describe(devices)}: {rate:.4g} req/s, {len(reqs)} requests -> "
                 + ("-" if within is None else f"{within:.1%} within SLO")
                 + ("" if worst is None else f", worst length bucket {worst:.1%}"))
    return out


def search(job: tuple) -> tuple[dict, dict]:
    """One rate search (find_max_rate) of one candidate, from the simulations `cached` for it: its answer and
    the simulations it added, keyed as tune caches them."""
    task, cached, kw = job
    reqs, _, engine, model, hardware, devices, c, zipf, progress = task
    added: dict = {}

    def measure(rate: float) -> dict:
        k = (engine, devices, c, len(reqs), round(rate, 9), zipf)
        if k not in cached and k not in added:
            added[k] = simulate((reqs, rate, *task[2:]))
        return cached[k] if k in cached else added[k]
    return find_max_rate(measure, **kw), added


def confirm(job: tuple) -> tuple[dict, dict]:
    """A refined maximum on the confirmation sample (all of tune's `longer`; an executor's task): `task`
    simulates the longer sample at the rate found; where it passes there, that rate stands ("held"), else the
    maximum is searched for below it on the longer sample (find_max_rate with `kw`, whose lo / hi bracket it).
    Returns the answer and the simulations added."""
    task, kw = job
    reqs, rate, engine, model, hardware, devices, c, zipf, progress = task
    added: dict = {}

    def measure(r: float) -> dict:
        k = (engine, devices, c, len(reqs), round(r, 9), zipf)
        if k not in added:
            added[k] = simulate((reqs, r, *task[2:]))
        return added[k]
    first = measure(rate)
    if first[kw["key"]] >= kw["target"]:
        return {"max_slo_rate": rate, "points": [(rate, first)], "valid": True, "reason": None, "held": True}, added
    return dict(find_max_rate(measure, **kw), held=False), added


def closed_batch_rate(requests, engine, devices, model, hardware, c: EngineConfig, zipf: float) -> float:
    """Half the rate a closed batch of the first requests (all arriving at 0) drains at: a search start."""
    sample = [dataclasses.replace(r, arrival=0.0, deadline=None) for r in requests[:max(2 * devices, 64)]]
    res = run(sample, c.spec(model, hardware, devices, zipf=zipf))
    return 0.5 * len(sample) / max(r.ttft for r in res.results)
