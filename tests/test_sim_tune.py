"""The tuner and the rate search it stands on: the same search for both engines, configurations that
run as they say, and no maximum reported from a burst or a search that did not converge."""
import dataclasses

import pytest

from asap.measure.metrics import RequestResult

from asap.measure.rate_search import burst_limit, find_max_rate
from asap.scheduler.request import Request
from asap.sim.run import run
from asap.studies.config import EngineConfig
from asap.studies.space import instance_sizes, space
from asap.studies.tune import Tuned, best_of_criteria, tune
from asap.workload.slo import SLO

SMALL = dict(model="small-deepseek-v3", hardware="h800")
RUN = dict(model_cfg="small-deepseek-v3", hardware="h800")


def test_a_search_that_passes_up_to_the_burst_limit_reports_no_maximum():
    out = find_max_rate(lambda r: {"slo_attainment": 1.0}, lo=1.0, burst_above=5.0)
    assert not out["valid"] and "burst" in out["reason"] and max(r for r, _ in out["points"]) == 5.0
    capped = find_max_rate(lambda r: {"slo_attainment": 1.0 if r <= 3.0 else 0.0}, lo=1.0, tol=0.05, burst_above=5.0)
    assert capped["valid"] and 2.85 <= capped["max_slo_rate"] <= 3.0
    stopped = find_max_rate(lambda r: {"slo_attainment": 1.0}, lo=1.0, max_iters=3)
    assert not stopped["valid"] and "converge" in stopped["reason"]
    assert burst_limit(101, 2.0) == pytest.approx(5.0)      # 100 gaps over 10 x 2 s


def test_the_spaces_hold_every_divisor_sized_instance_layout_an_operator_would_search():
    for devices in (32, 64):
        sync = space("sync", devices, "deepseek-v3", "cloudmatrix384")
        asyn = space("async", devices, "deepseek-v3", "cloudmatrix384", 12000)
        sizes = [s for s in range(1, devices + 1) if devices % s == 0 and s >= 16]   # 16: the experts' memory floor
        for engine, cands in (("sync", sync), ("async", asyn)):
            assert instance_sizes(devices, engine) == sizes
            assert {devices // c.instances for c in cands} == set(sizes)
            assert {c.token_budget for c in cands} == {4096, 8192, 16384, 32768}
            assert {c.router for c in cands} == {"queue-aware", "round-robin"}
        # every DP x TP layout of every instance size that fits in memory (TP1 on 16 dies does not)
        layouts = {(devices // c.instances, c.attention_tp) for c in sync}
        assert layouts == {(s, tp) for s in sizes for tp in (1, 4, 8, 16) if (s, tp) != (16, 1)}
        assert {c.two_batch_overlap for c in sync} == {True, False}
        assert {c.microbatches for c in asyn} == {1, 2, 3} and {c.attention_tp for c in asyn} == {1, 4, 8, 16}
        # the outside finding's layout is in the space: 2 x [DP1 x TP16, EP16] with 16K chunks
        assert EngineConfig("sync", 16, 16384, instances=devices // 16) in sync
        primary = space("sync", devices, "deepseek-v3", "cloudmatrix384", full=False)
        assert all(c.two_batch_overlap and c.router == "queue-aware" for c in primary)


def test_instances_split_the_arrivals_and_serve_every_request():
    reqs = [Request(i, 2000, 0.001 * i) for i in range(40)]
    one = run(reqs, "sync", devices=8, instances=1, **RUN)
    two = run(reqs, "sync", devices=8, instances=2, **RUN)
    assert [r.request_id for r in two.results] == [r.id for r in reqs] and all(r.ttft > 0 for r in two.results)
    assert two.stats["instances"] == 2 and len(two.stats["per_instance"]) == 2
    assert one.attention_workers == 8 and two.attention_workers == 8
    with pytest.raises(ValueError, match="instances"):
        run(reqs, "sync", devices=8, instances=3, **RUN)


def test_tune_returns_a_valid_best_and_its_table():
    reqs = SLO(0.005, 1e-6).apply([Request(i, 1000 + 500 * (i % 7), 0.01 * i) for i in range(120)])
    for engine in ("sync", "async"):
        t = tune(reqs, engine, 4, **SMALL)
        assert t.best is not None and t.best.engine == engine and t.max_slo_rate > 0 and t.ttft_p90_s > 0
        primary = space(engine, 4, **SMALL, prompt_len=2500, full=False)
        assert t.num_screened >= len(primary) and len(t.candidates) == t.num_screened    # every one screened
        assert sum(c["coarse_rate"] is not None or c["coarse_reason"] != "screened out" for c in t.candidates) <= 3
        assert max(c["fine_rate"] or 0 for c in t.candidates) == t.max_slo_rate
    with pytest.raises(ValueError, match="deadlines"):
        tune([Request(0, 100)], "sync", 4, **SMALL)


def test_engine_config_keywords_reach_the_engine():
    c = EngineConfig("sync", attention_tp=4, token_budget=8192)
    res = run([Request(0, 3000)], c.spec("small-deepseek-v3", "h800", 8))
    assert res.attention_workers == 2 and res.expert_workers == 8       # DP2 x TP4, EP8


def test_the_instance_router_spreads_a_light_load_instead_of_piling_it_on_instance_0():
    """A light load drains every instance's estimated queue between arrivals, so every arrival sees a tie;
    the ties must go round-robin. (Before, they went to the lowest index: every request of a light load on
    instance 0 of 12, which made a 12-instance sync baseline fail its SLO at lower rates than at higher.)"""
    from asap.scheduler.request import Request
    from asap.sim.run import split_instances
    light = [Request(i, 1000, arrival=float(i)) for i in range(24)]          # 1 s apart, drained in 1 ms
    parts = split_instances(light, 12, tokens_per_s=1e6)
    assert [len(p) for p in parts] == [2] * 12
    heavy = [Request(i, 1000, arrival=i * 1e-6) for i in range(24)]         # all at once: least work wins
    assert [len(p) for p in split_instances(heavy, 12, tokens_per_s=1e6)] == [2] * 12


def test_a_candidate_that_outruns_the_sample_is_not_passed_over_for_a_weaker_one(monkeypatch):
    """TP1 has a certified maximum of ~3 req/s; TP4 still passes where the requests would be a burst. The tuner
    must not name TP1 (and its 3 req/s) as the best: it reports no best, TP4's lower bound and why."""
    import types

    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(101)])   # a burst above 5 req/s
    served = {1: 3.0, 4: 1e9}                                       # each candidate's true maximum, req/s

    def fake_run(requests, spec):
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[spec.attention_tp] * (1 + 1e-9)
        return types.SimpleNamespace(results=[RequestResult(0, 0.0, 1000, 0.001 if ok else 9.0, deadline_s=2.0)],
                                     stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    cands = [EngineConfig("sync", tp, 4096) for tp in (1, 4)]
    t = tune(reqs, "sync", 8, candidates=cands, start_rate=1.0, **SMALL)
    assert t.best is None and t.max_slo_rate is None
    assert t.lower_bound == pytest.approx(5.0) and "more requests" in t.reason and "TP4" in t.reason
    assert t.lower_bound_config == cands[1]
    t = tune(reqs, "sync", 8, candidates=cands[1:], start_rate=1.0, **SMALL)     # nothing certified at all
    assert t.best is None and "no candidate has a valid rate" in t.reason
    assert t.lower_bound == pytest.approx(5.0) and t.lower_bound_config == cands[1]
    served[4] = 2.0                                                 # now TP1 really is the best
    t = tune(reqs, "sync", 8, candidates=cands, start_rate=1.0, **SMALL)
    assert t.best == cands[0] and 2.85 <= t.max_slo_rate <= 3.0 and t.lower_bound is None


def test_the_screen_finds_the_best_of_a_large_space_and_rate_searches_only_the_finalists(monkeypatch):
    """Twelve candidates with known maxima: the screen (one rate, raised while more than SCREEN_KEEP pass)
    must hand the best one to the rate searches, which run on FINALISTS candidates only. Under the
    every-bucket criterion, a candidate that gives up the short prompts (5% of requests) above 1.2 req/s
    loses to the next best."""
    import types

    import asap.studies.tune as tune_mod
    reqs = SLO(2.0).apply([Request(i, 1000 if i % 20 == 0 else 20000, float(i)) for i in range(2001)])
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    served = {c: 1.0 + 0.1 * i for i, c in enumerate(cands)}     # the last one is the best: 2.1 req/s

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances,
                         two_batch_overlap=spec.two_batch_overlap, router=spec.router)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[c] * (1 + 1e-9)
        drop_short = c == cands[-1] and rate > 1.2
        return types.SimpleNamespace(results=[
            RequestResult(r.id, 0.0, r.num_tokens, 0.001 if ok and not (drop_short and r.num_tokens < 4096) else 9.0,
                          deadline_s=2.0) for r in requests], stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    t = tune(reqs, "sync", 8, candidates=cands, **SMALL)
    searched = [c for c in t.candidates if c["coarse_reason"] != "screened out"]
    assert t.num_screened == len(cands) and len(searched) == tune_mod.FINALISTS
    assert t.best == cands[-1] and 2.0 <= t.max_slo_rate <= 2.1
    assert t.buckets["<4K"]["slo_attainment"] == 0.0 and t.buckets[">64K"]["num_requests"] == 0
    eb = tune(reqs, "sync", 8, candidates=cands, criterion="every-bucket", **SMALL)
    assert eb.best == cands[-2] and 1.9 <= eb.max_slo_rate <= 2.0 and eb.criterion == "every-bucket"
    assert min(b["slo_attainment"] for b in eb.buckets.values() if b["num_requests"]) >= 0.9
    with pytest.raises(ValueError, match="criterion"):
        tune(reqs, "sync", 8, candidates=cands, criterion="tokens", **SMALL)


def test_a_tie_at_the_screens_burst_limit_is_ranked_on_more_requests(monkeypatch):
    """Every candidate still passes at the burst limit of the screen's short sample (there the sample cannot
    tell them apart, and a tie-break by P90 TTFT at low load would pick a weak one): the screen goes on with
    twice the requests until it can, and the best one reaches the rate searches."""
    import types

    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(2001)])
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    first_limit = burst_limit(62, 2.0)
    served = {c: first_limit * 1.3 + 0.4 * i for i, c in enumerate(cands)}     # all above the first limit
    p90 = {c: 0.001 * (i + 1) for i, c in enumerate(cands)}                  # the weakest is the fastest at low load

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances,
                         two_batch_overlap=spec.two_batch_overlap, router=spec.router)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[c] * (1 + 1e-9)
        return types.SimpleNamespace(results=[RequestResult(r.id, 0.0, r.num_tokens, p90[c] if ok else 9.0,
                                                            deadline_s=2.0) for r in requests], stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    t = tune(reqs, "sync", 8, candidates=cands, **SMALL)
    screened = {tuple(sorted(c["config"].items())): c for c in t.candidates}
    assert max(c["num_requests"] for c in screened.values()) > 62      # the tied ones went on with more requests
    assert t.best == cands[-1]


def _served_by_tp(served: dict, split: int):
    """A stand-in for asap.sim.run.run: every request of a run meets its SLO where the run's rate is at most
    served[attention TP][0] (runs of at most `split` requests) or [1] (longer runs), none otherwise."""
    import types

    def fake_run(requests, spec):
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[spec.attention_tp][len(requests) > split] * (1 + 1e-9)
        return types.SimpleNamespace(results=[RequestResult(r.id, 0.0, r.num_tokens, 0.001 if ok else 9.0,
                                                            deadline_s=2.0) for r in requests], stats={})
    return fake_run


def test_a_maximum_that_only_the_short_sample_sustains_is_confirmed_on_a_longer_one(monkeypatch):
    """Under a "-sustained" criterion a queue that grows slower than the search's sample passes every third
    of it. Given the workload continued (`longer`), tune re-simulates each refined maximum on all of it
    (here twice the requests): TP1 passes up to 3 req/s on 101 requests but sustains only 2 on 202, so TP4
    (2.6 on both) is the best, reported with the longer sample's size. The default criterion ignores
    `longer` (the same result)."""
    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(202)])
    short, longer = reqs[:101], reqs
    served = {1: (3.0, 2.0), 4: (2.6, 2.6)}        # (max on <= 101 requests, max on more), req/s

    monkeypatch.setattr("asap.studies.tune_tasks.run", _served_by_tp(served, 101))
    cands = [EngineConfig("sync", tp, 4096) for tp in (1, 4)]
    plain = tune(short, "sync", 8, candidates=cands, start_rate=1.0, criterion="requests-sustained", **SMALL)
    assert plain.best == cands[0] and 2.85 <= plain.max_slo_rate <= 3.0 and plain.search_rate is None
    t = tune(short, "sync", 8, candidates=cands, start_rate=1.0, criterion="requests-sustained", longer=longer, **SMALL)
    rows = {c["config"]["attention_tp"]: c for c in t.candidates}
    assert t.best == cands[1] and 2.47 <= t.max_slo_rate <= 2.6
    assert t.num_requests == rows[4]["sustained_num_requests"] == 2 * rows[4]["num_requests"]
    assert t.search_rate == t.max_slo_rate          # TP4's maximum held on the longer sample
    assert 1.9 <= rows[1]["sustained_rate"] <= 2.0 and rows[1]["fine_rate"] >= 2.85
    same = tune(short, "sync", 8, candidates=cands, start_rate=1.0, criterion="requests", longer=longer, **SMALL)
    assert same == tune(short, "sync", 8, candidates=cands, start_rate=1.0, criterion="requests", **SMALL)
    served.update({1: (3.0, 0.0), 4: (2.6, 0.0)})   # nothing holds on the longer sample: no best, and why
    none = tune(short, "sync", 8, candidates=cands, start_rate=1.0, criterion="requests-sustained", longer=longer,
                **SMALL)
    assert none.best is None and "no refined maximum is sustained on" in none.reason
    with pytest.raises(ValueError, match="continue"):
        tune(short, "sync", 8, candidates=cands, criterion="requests-sustained", longer=short[:50], **SMALL)


def test_vet_promotes_a_candidate_the_short_screen_ranks_below_the_finalists(monkeypatch):
    """The conversation trace's case at 32 dies, in miniature: three candidates pass the most on the screen's
    short samples but sustain little on a longer one (a queue that grows slowly), and the one that sustains
    the most ranks fourth there. Without vet the finalists are the three and the best confirmed is one of
    them; with vet the screen's leaders are re-ranked on the confirmation sample, the fourth reaches the
    finalists and wins. The rule is the engine-neutral one: the same call for either engine."""
    import types

    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(4002)])
    short, longer = reqs[:2001], reqs
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    served = {c: (1.0 + 0.05 * i, 1.0 + 0.05 * i) for i, c in enumerate(cands)}   # (on <= 62 requests, on more)
    growers, steady = cands[-3:], cands[-4]
    for c in growers:
        served[c] = (served[c][0] + 0.6, 1.2)          # 2.1-2.2 req/s on the short samples, 1.2 sustained
    served[steady] = (1.75, 1.75)                      # fourth on the short samples, the best sustained

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances,
                         two_batch_overlap=spec.two_batch_overlap, router=spec.router)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[c][len(requests) > 62] * (1 + 1e-9)     # the screen and searches sample 62
        return types.SimpleNamespace(results=[RequestResult(r.id, 0.0, r.num_tokens, 0.001 if ok else 9.0,
                                                            deadline_s=2.0) for r in requests], stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    kw = dict(candidates=cands, criterion="requests-sustained", longer=longer, screen=True, **SMALL)
    plain = tune(short, "sync", 8, **kw)
    assert plain.best in growers and plain.max_slo_rate <= 1.2
    t = tune(short, "sync", 8, vet=True, **kw)
    assert t.best == steady and 1.66 <= t.max_slo_rate <= 1.75
    vetted = [c for c in t.candidates if "vet_rate" in c]
    assert vetted and all(c["vet_rate"] is not None for c in vetted)
    assert tune(short, "sync", 8, vet=True, **dict(kw, criterion="requests")) == \
        tune(short, "sync", 8, **dict(kw, criterion="requests"))      # vet applies to "-sustained" criteria only


def test_vet_vets_the_secondary_variants_of_its_own_best(monkeypatch):
    """The secondary knobs screened on the short sample are those of its best, which the vet can demote: the
    conversation trace at 32 dies, where the vetted 5/8-wide async fleet never had its expert window tried.
    In miniature (the space and its secondary variants given): four candidates lead the short screen and
    sustain little; the fifth sustains the most, and its variant (TBO off) more still. Without the change the
    variant is never simulated; with vet it is vetted beside its primary and wins."""
    import types

    import asap.studies.tune as tune_mod
    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(4002)])
    short, longer = reqs[:2001], reqs
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    served = {c: (1.0 + 0.05 * i, 1.0 + 0.05 * i) for i, c in enumerate(cands)}   # (on <= 62 requests, on more)
    for c in cands[-4:]:
        served[c] = (served[c][0] + 0.6, 1.2)          # the short screen's four best, 1.2 sustained
    steady = cands[-5]
    served[steady] = (1.7, 1.7)                        # fifth on the short samples
    variant = dataclasses.replace(steady, two_batch_overlap=False)
    variants = {variant: (1.9, 1.9)}                   # the best of all, simulated only as a variant

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances,
                         two_batch_overlap=spec.two_batch_overlap, router=spec.router)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        top = variants.get(c) or served[dataclasses.replace(c, two_batch_overlap=True)]
        ok = rate <= top[len(requests) > 62] * (1 + 1e-9)
        return types.SimpleNamespace(results=[RequestResult(r.id, 0.0, r.num_tokens, 0.001 if ok else 9.0,
                                                            deadline_s=2.0) for r in requests], stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    monkeypatch.setattr(tune_mod, "space", lambda *a, **k: list(cands))
    monkeypatch.setattr(tune_mod, "secondary", lambda c, *orders: [dataclasses.replace(c, two_batch_overlap=False)])
    kw = dict(criterion="requests-sustained", longer=longer, screen=True, **SMALL)
    t = tune(short, "sync", 8, vet=True, **kw)
    assert t.best == variant and 1.8 <= t.max_slo_rate <= 1.9
    rows = {(c["config"]["instances"], c["config"]["token_budget"], c["config"]["two_batch_overlap"]): c
            for c in t.candidates}
    row = rows[(steady.instances, steady.token_budget, False)]
    primary = rows[(steady.instances, steady.token_budget, True)]
    assert row["screen_rate"] is None and primary["screen_rate"] is not None    # vetted, never screened
    assert row["vet_rate"] >= primary["vet_rate"] and row["fine_rate"] is not None     # and a finalist
    plain = tune(short, "sync", 8, **kw)        # without vet: the short screen's best four, and their variants
    assert plain.best != variant and plain.max_slo_rate <= 1.2


def test_vet_tries_the_variants_of_a_new_leader_until_the_leader_is_unchanged(monkeypatch):
    """One secondary knob at a time misses a combination of two: the conversation row at 32 dies, where the
    vet made the fleet with a short-prompt lane its leader and never tried that lane with srpt (2.89 req/s
    tuned, 3.13 in a probe). In miniature (two secondary knobs: TBO off, round-robin router): four decoys lead
    the short screen (so its variants are theirs) and sustain little; the fifth sustains 1.7; TBO off lifts it
    to 1.9, the router alone does not (1.6), both together reach 2.1. The vet ranks the fifth first, vets its
    variants (TBO off leads), then the new leader's own variants, and the pair wins."""
    import math
    import types

    import asap.studies.tune as tune_mod
    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(4002)])
    short, longer = reqs[:2001], reqs
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    served = {c: (1.0 + 0.05 * i,) * 2 for i, c in enumerate(cands)}     # (on <= 62 requests, on more)
    for c in cands[-4:]:
        served[c] = (served[c][0] + 0.6, 1.2)          # the short screen's four best, 1.2 sustained
    steady = cands[-5]
    tbo_off = dataclasses.replace(steady, two_batch_overlap=False)
    rr = dataclasses.replace(steady, router="round-robin")
    both = dataclasses.replace(tbo_off, router="round-robin")
    served |= {steady: (1.7, 1.7), tbo_off: (1.9, 1.9), rr: (1.6, 1.6), both: (2.1, 2.1)}

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances,
                         two_batch_overlap=spec.two_batch_overlap, router=spec.router)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        base = served[dataclasses.replace(c, two_batch_overlap=True, router="queue-aware")]
        top = served.get(c, (base[0] - 0.2, base[1] - 0.2))[len(requests) > 62]     # other variants: weaker
        f, n = min(1.0, top / rate * (1 + 1e-9)), len(requests)
        ok = [math.ceil((n - i) * f) != math.ceil((n - i - 1) * f) for i in range(n)]  # a share f, spread; last ok
        return types.SimpleNamespace(results=[RequestResult(r.id, r.arrival, r.num_tokens, 0.001 if o else 2.1,
                                                            deadline_s=2.0) for o, r in zip(ok, requests)], stats={})

    def secondary(c, *rest):
        return [dataclasses.replace(c, two_batch_overlap=not c.two_batch_overlap),
                dataclasses.replace(c, router="round-robin" if c.router == "queue-aware" else "queue-aware")]

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    monkeypatch.setattr(tune_mod, "space", lambda *a, **k: list(cands))
    monkeypatch.setattr(tune_mod, "secondary", secondary)
    kw = dict(vet=True, criterion="requests-sustained", longer=longer, screen=True, **SMALL)
    t = tune(short, "sync", 8, **kw)
    assert t.best == both and 1.9 / 0.9 < t.max_slo_rate <= 2.1 / 0.9       # 90% within SLO: 2.1 / 0.9 req/s
    row = {(c["config"]["token_budget"], c["config"]["instances"], c["config"]["two_batch_overlap"],
            c["config"]["router"]): c for c in t.candidates}[(both.token_budget, both.instances, False, "round-robin")]
    assert row["screen_rate"] is None and row["vet_rate"] is not None       # vetted, never screened
    monkeypatch.setattr(tune_mod, "LEADER_ROUNDS", 0)         # the variants of the first vetted best only
    assert tune(short, "sync", 8, **kw).best == tbo_off


def test_vet_breaks_a_tie_at_the_top_of_its_grid_by_raising_the_rate(monkeypatch):
    """The vet's grid spans [hi / SCREEN_STEP, hi] (hi: the screen's highest passed rate); leaders that pass
    all of it tie, and kept the short screen's order: the conversation trace at 32 dies, where 6 async and 5
    sync leaders tied at the top and the every-bucket tune's best fleet (passing its grid at 97-98%) was not
    a finalist. In miniature: six candidates tie on the short screen and all pass the vet's grid; on the vet's
    sample the last of them in screen order sustains the most. While more than FINALISTS share the top, the
    vet raises the rate for them (hi, then SCREEN_STEP x), so that one becomes a finalist and wins."""
    import math
    import types

    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(4002)])
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    served = {c: (1.0 + 0.02 * i,) * 2 for i, c in enumerate(cands)}    # (on <= 62 requests, on more)
    tied = cands[-6:]
    for c in tied:
        served[c] = (2.0, 2.0)
    best = tied[-1]
    served[best] = (2.0, 2.6)

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        f, n = min(1.0, served[c][len(requests) > 62] / rate * (1 + 1e-9)), len(requests)
        ok = [math.ceil((n - i) * f) != math.ceil((n - i - 1) * f) for i in range(n)]  # a share f, spread; last ok
        return types.SimpleNamespace(results=[RequestResult(r.id, r.arrival, r.num_tokens, 0.001 if o else 2.1,
                                                            deadline_s=2.0) for o, r in zip(ok, requests)], stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    kw = dict(candidates=cands, criterion="requests-sustained", screen=True, **SMALL)
    t = tune(reqs[:2001], "sync", 8, vet=True, longer=reqs, **kw)
    rows = {(c["config"]["token_budget"], c["config"]["instances"]): c for c in t.candidates}
    top = [rows[(c.token_budget, c.instances)] for c in tied]
    assert len({r["screen_passed_rate"] for r in top}) == 1          # the short screen cannot rank them
    assert t.best == best and t.max_slo_rate >= 2.6
    assert top[-1]["vet_rate"] > max(r["vet_rate"] for r in top[:-1])


def test_vet_ranks_and_searches_each_finalist_on_all_of_the_confirmation_sample(monkeypatch):
    """The conversation trace at 32 dies: the tuned async fleet reaches 2.62 req/s on the 750 requests its
    maximum was searched on, 2.80 on 1,500, and fails 2.81 on 3,000; and a vet on twice each engine's own
    screen sample chose sync's finalists on 750 of the synthetic row's 3,000 requests and async's on 1,496.
    Under vet each finalist is ranked and searched on all of the longer sample the caller gives (the one its
    maximum is reported on, the same for both engines), so nothing is left to search down. In miniature: A
    sustains 2.0 on the short samples, 2.6 on twice the screen's and 2.4 on more; B 2.1 on the short ones and
    2.0 on more. A wins at its maximum on the longest sample, found there."""
    import types

    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(4002)])
    cands = [EngineConfig("sync", 1, b, instances=k) for b in (4096, 8192, 16384) for k in (1, 2, 4, 8)]
    served = {c: (1.0 + 0.05 * i,) * 3 for i, c in enumerate(cands)}    # on <= 62, <= 124 and more requests
    a, b = cands[-2], cands[-1]
    served[a], served[b] = (2.0, 2.6, 2.4), (2.1, 2.0, 2.0)

    def fake_run(requests, spec):
        c = EngineConfig("sync", spec.attention_tp, spec.token_budget, instances=spec.instances)
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[c][(len(requests) > 62) + (len(requests) > 124)] * (1 + 1e-9)
        return types.SimpleNamespace(results=[RequestResult(r.id, 0.0, r.num_tokens, 0.001 if ok else 9.0,
                                                            deadline_s=2.0) for r in requests], stats={})

    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)
    monkeypatch.setattr("asap.studies.tune_tasks.closed_batch_rate", lambda *a: 1.0)
    kw = dict(candidates=cands, criterion="requests-sustained", screen=True, **SMALL)
    t = tune(reqs[:2001], "sync", 8, vet=True, longer=reqs, **kw)
    rows = {c["config"]["token_budget"] * 10 + c["config"]["instances"]: c for c in t.candidates}
    row = rows[a.token_budget * 10 + a.instances]
    assert t.best == a and 2.28 <= t.max_slo_rate <= 2.4
    assert row["num_requests"] == t.num_requests == row["sustained_num_requests"] == len(reqs)
    assert t.search_rate == t.max_slo_rate and row["coarse_rate"] is None  # searched on the vet's sample only
    assert row["vet_rate"] <= 2.4        # vetted on all of `longer`, not where A sustains 2.6
    plain = tune(reqs[:2001], "sync", 8, longer=reqs, **kw)                # the old path stays as it was
    assert plain.max_slo_rate <= 2.1
    edge = tune(reqs[:100], "sync", 8, vet=True, longer=reqs[:124], **kw)  # nothing longer than the vet's sample
    assert edge.best == a and edge.num_requests == 124 and edge.search_rate == edge.max_slo_rate >= 2.47


def test_both_engines_are_confirmed_on_the_same_requests_whatever_their_searches_sampled(monkeypatch):
    """The synthetic trace at 32 dies: each engine's search sample is sized by its own capacity, and each
    maximum was confirmed on twice its own sample, so sync was held on 1,500 requests and async on 2,992 of a
    trace whose later part is heavier (0.93x; 1.43x on the same 2,992). Confirmation is on all of `longer`,
    so two tunes given the same `longer` report maxima on the same requests. In miniature: a slow candidate
    (searched on few requests) and a fast one (on more), each sustaining less on the trace's later part."""
    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(4002)])
    short, longer = reqs[:2001], reqs
    served = {1: (0.5, 0.4), 4: (4.0, 3.2)}        # (max on <= 2,001 requests, max on more), req/s

    monkeypatch.setattr("asap.studies.tune_tasks.run", _served_by_tp(served, 2001))
    kw = dict(criterion="requests-sustained", longer=longer, **SMALL)
    slow = tune(short, "sync", 8, candidates=[EngineConfig("sync", 1, 4096)], start_rate=0.5, **kw)
    fast = tune(short, "sync", 8, candidates=[EngineConfig("sync", 4, 4096)], start_rate=4.0, **kw)
    searched = [t.candidates[0]["num_requests"] for t in (slow, fast)]
    assert searched[0] < searched[1] < len(longer) // 2     # the searches sampled differently, both short
    assert slow.num_requests == fast.num_requests == len(longer)
    assert 0.38 <= slow.max_slo_rate <= 0.4 and 3.04 <= fast.max_slo_rate <= 3.2


def test_the_every_bucket_best_is_a_main_criterion_candidate(monkeypatch):
    """Every bucket at 90% implies 90% of requests, so where an engine's every-bucket best sustains more than its
    main-criterion best (the synthetic 32-die row: sync's every-bucket fleet 1.534 req/s, its main best 1.498),
    the main result is that configuration, searched under the main criterion upward from there on the same
    requests. In miniature: X's main maximum is 2.0; Y's every-bucket maximum 2.2, and all its requests are
    within SLO up to 2.3."""
    import types

    reqs = SLO(2.0).apply([Request(i, 1000, float(i)) for i in range(1001)])
    x, y = EngineConfig("sync", 1, 4096), EngineConfig("sync", 2, 8192)
    served = {x: 2.0, y: 2.3}

    def fake_run(requests, spec):
        c = x if spec.attention_tp == 1 else y
        rate = (len(requests) - 1) / (requests[-1].arrival - requests[0].arrival)
        ok = rate <= served[c] * (1 + 1e-9)
        return types.SimpleNamespace(results=[RequestResult(r.id, 0.0, r.num_tokens, 0.001 if ok else 9.0,
                                                            deadline_s=2.0) for r in requests], stats={})
    monkeypatch.setattr("asap.studies.tune_tasks.run", fake_run)

    def tuned(c, rate, criterion):
        return Tuned("sync", 8, c, rate, 0.1, 100.0, candidates=[{"config": dataclasses.asdict(c)}],
                     num_requests=len(reqs), criterion=criterion)
    main = tuned(x, 2.0, "requests-sustained")
    out = best_of_criteria(main, tuned(y, 2.2, "every-bucket-sustained"), reqs[:500], reqs, **SMALL)
    assert out.best == y and 2.3 / 1.05 <= out.max_slo_rate <= 2.3 and out.num_requests == len(reqs)
    assert out.criterion == "requests-sustained" and out.candidates[-1]["sustained_rate"] == out.max_slo_rate
    assert best_of_criteria(main, tuned(y, 1.9, "every-bucket-sustained"), reqs[:500], reqs, **SMALL) is main
    assert best_of_criteria(main, tuned(x, 2.2, "every-bucket-sustained"), reqs[:500], reqs, **SMALL) is main
    unranked = dataclasses.replace(main, best=None, max_slo_rate=None, lower_bound=2.5, lower_bound_config=x)
    assert best_of_criteria(unranked, tuned(y, 2.2, "every-bucket-sustained"), reqs[:500], reqs, **SMALL) is unranked
