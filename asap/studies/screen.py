"""The tuner's screen and vet (asap.studies.tune): which candidates of a space get a rate search, ranked
by a few simulations each, the same rule and budget for both engines (the space is too large to
rate-search every candidate). `screen` ranks on a short sample; `vet` re-ranks its leaders on the
longer confirmation sample of a "-sustained" criterion. Both measure through the tuner's
`measure_for(candidate, n)(rate)` (its cache), so neither simulates anything itself."""
from __future__ import annotations

import math

FINALISTS = 3               # screened candidates that get a rate search (REFINE of them a fine one)
SCREEN_KEEP = 4             # primary candidates whose secondary variants are screened; and the pool a raise stops at
SCREEN_STEP, SCREEN_ROUNDS = 1.5, 4     # the screen's rate raises (and steps back)
SCREEN_MAX_RAISE = SCREEN_STEP ** 2     # n is sized for two raises; the burst limit caps the rest


def screen(cands, measure_for, burst_of, num_requests: int, rate: float, target: float, key: str,
           prefetch=None) -> dict:
    """{candidate: {"score", "passed_rate", "rate", "attainment", "ttft_p90_ms", "n"}}, best first.

    The screen (the same rule for both engines): every candidate is simulated once at `rate` on the first n
    requests (n: as few as keep SCREEN_MAX_RAISE x `rate` below the burst limit). While more than
    SCREEN_KEEP candidates pass, the passing ones are simulated again at SCREEN_STEP x the rate (never
    above the burst limit); where a raise leaves none passing, they are tried halfway back; where none
    passes the first time, all are screened again at half the rate (at most SCREEN_ROUNDS more rounds in
    all). Where more than SCREEN_KEEP still pass at the burst limit of n requests, n cannot rank them: the
    passing ones go on with 2n requests (as the rate search does), up to all of them. Score: the highest
    screened rate passed, then attainment and P90 TTFT at the last rate tried."""
    if not cands:
        return {}
    n = num_requests
    while n > 64 and burst_of(n // 2) >= rate * SCREEN_MAX_RAISE:
        n //= 2
    limit = burst_of(n)
    rate = min(rate, limit)
    out: dict = {}
    pool, passed_at = list(cands), None       # passed_at: the last rate some of the pool passed at
    rounds = SCREEN_ROUNDS + 1 + max(0, math.ceil(math.log2(num_requests / n)))   # and a round per doubling of n
    for _ in range(rounds):
        if prefetch is not None:
            prefetch([(c, n, rate) for c in pool])
        for c in pool:
            s = measure_for(c, n)(rate)
            ok = s[key] >= target
            prev = out[c]["passed_rate"] if c in out else None
            out[c] = {"passed_rate": rate if ok else prev, "rate": rate, "attainment": s[key],
                      "ttft_p90_ms": s["ttft_p90_ms"], "n": n}
        passing = [c for c in pool if out[c]["rate"] == rate and out[c]["attainment"] >= target]
        if not passing:
            if passed_at is None:
                rate /= 2                         # the first rate was too high for all: start lower
            else:
                rate = (passed_at + rate) / 2     # the raise went too far: halfway back, the same pool
            continue
        if len(passing) <= SCREEN_KEEP:
            break
        if rate >= limit:                 # a tie at the burst limit: more requests to rank them, if there are
            if n >= num_requests:
                break
            n = min(num_requests, 2 * n)
            limit = burst_of(n)
        pool, passed_at, rate = passing, rate, min(limit, rate * SCREEN_STEP)
    for v in out.values():
        v["score"] = (v["passed_rate"] or 0.0, v["attainment"], -(v["ttft_p90_ms"] or float("inf")))
    return dict(sorted(out.items(), key=lambda kv: kv[1]["score"], reverse=True))


VET_MOST, VET_DEPTH = 32, 2    # the screen's leaders re-ranked on the confirmation sample; bisection steps


def vet(screened: dict, measure_for, m: int, target: float, key: str, prefetch=None, more=(),
        burst: float | None = None) -> dict:
    """The screen re-ranked on m requests (measure_for(c, m): the confirmation sample), for a "-sustained"
    criterion.

    The screen ranks on a short sample, where a rate at which a queue grows slowly (a length-aware fleet's
    long prompts on too few devices) still passes: on the conversation trace at 32 dies it put a half-wide
    async fleet (2.46 req/s sustained on 1,500 requests) far above a 5/8-wide one (2.74). So the leaders, the
    candidates that passed at least 1/SCREEN_STEP of the highest rate screened (at most VET_MOST, in screen
    order), are each bisected VET_DEPTH times between that rate and the highest, on the longer sample, and
    ranked first by the highest rate of that grid they pass, then by their value at the rate above it; the
    rest follow in screen order. Leaders that pass the whole grid would tie there (in screen order, the order
    the vet exists to distrust): while more than FINALISTS do, the grid is raised for them, to the highest
    screened rate and then SCREEN_STEP x each rate passed (at most SCREEN_ROUNDS times, never above `burst`,
    the burst limit of m requests). The same rule for both engines. Each leader's entry gets vet_rate, the
    lower end of its bracket: the highest vetted rate it passed, or the bracket's floor (hi / SCREEN_STEP, not
    simulated on the longer sample) where it passed none; vet_hi, the upper end (the lowest vetted rate it
    failed, or the next rate of the grid where it failed none); and vet_requests = m.
    more: candidates to vet beside the leaders (the secondary variants of the vetted best), on the same grid and
    ranked with them; those the screen did not simulate get screen columns of None. Candidates an earlier call
    vetted on m requests are leaders again, so a later call ranks them all; none is simulated again (its grid
    is the same, and measure_for's cache holds it)."""
    passed = [s["passed_rate"] for s in screened.values() if s["passed_rate"]]
    if not passed:
        return screened
    hi = max(passed)
    lo = hi / SCREEN_STEP
    more = [c for c in dict.fromkeys(more) if screened.get(c, {}).get("vet_requests") != m]
    screened = screened | {c: {"score": None, "passed_rate": None, "rate": None, "attainment": None,
                               "ttft_p90_ms": None, "n": m} for c in more if c not in screened}
    before = [c for c, s in screened.items() if s.get("vet_requests") == m]     # vetted by an earlier call
    leaders = list(dict.fromkeys([c for c, s in screened.items() if (s["passed_rate"] or 0.0) >= lo][:VET_MOST]
                                 + before + more))
    bounds = {c: (lo, hi) for c in leaders}          # each leader's maximum lies in [lo, hi) as far as known
    value = {}                                       # its value at its upper bound's rate, once simulated
    for _ in range(VET_DEPTH):
        mids = {c: math.sqrt(a * b) for c, (a, b) in bounds.items()}
        if prefetch is not None:
            prefetch([(c, m, r) for c, r in mids.items()])
        for c, r in mids.items():
            v = measure_for(c, m)(r)[key]
            if v >= target:
                bounds[c] = (r, bounds[c][1])
            else:
                bounds[c], value[c] = (bounds[c][0], r), v
    # Leaders that passed the whole grid tie (their upper end untested) and would keep the short screen's
    # order, the order the vet exists to distrust: while more than FINALISTS share the top, they are simulated
    # at their upper end, and those passing there at SCREEN_STEP x it, up to the burst limit of m requests.
    for _ in range(SCREEN_ROUNDS):
        top = max(a for a, _ in bounds.values())
        tied = [c for c in leaders if bounds[c][0] == top and c not in value]
        if len(tied) <= FINALISTS:
            break
        rate = bounds[tied[0]][1] if burst is None else min(bounds[tied[0]][1], burst)    # the same for all tied
        if rate <= top:
            break
        if prefetch is not None:
            prefetch([(c, m, rate) for c in tied])
        for c in tied:
            v = measure_for(c, m)(rate)[key]
            if v >= target:
                bounds[c] = (rate, rate * SCREEN_STEP)
            else:
                bounds[c], value[c] = (top, rate), v
    order = sorted(leaders, key=lambda c: (bounds[c][0], value.get(c, 0.0)), reverse=True)
    for c in leaders:
        screened[c] = dict(screened[c], vet_rate=bounds[c][0], vet_hi=bounds[c][1], vet_requests=m)
    return {c: screened[c] for c in order} | {c: s for c, s in screened.items() if c not in bounds}


def vet_variants(screened: dict, measure_for, m: int, target: float, key: str, prefetch, variants, rounds: int,
                 burst: float | None = None) -> dict:
    """After `vet`: the secondary variants of the vetted best (variants(screened) -> candidates, those of its
    SCREEN_KEEP best) vetted beside them, then, while that makes a new candidate the leader, the leader's own
    (variants({leader: None}, keep=1)), up to `rounds` times: one knob at a time misses a leader's combination of
    two (srpt with a lane on the conversation row at 32 dies). Returns the re-ranked screen."""
    screened = vet(screened, measure_for, m, target, key, prefetch, more=variants(screened), burst=burst)
    for _ in range(rounds):
        more = [v for v in variants({next(iter(screened)): None}, keep=1)
                if screened.get(v, {}).get("vet_requests") != m]
        if not more:
            break
        screened = vet(screened, measure_for, m, target, key, prefetch, more=more, burst=burst)
    return screened


def screen_cols(sc: dict | None) -> dict:
    if sc is None:
        return {"screen_rate": None, "screen_attainment": None, "screen_passed_rate": None}
    return {"screen_rate": sc["rate"], "screen_attainment": sc["attainment"], "screen_passed_rate": sc["passed_rate"],
            **({"vet_rate": sc["vet_rate"]} if "vet_rate" in sc else {})}
