"""The sustain rule (asap.measure.sustain) and the "-sustained" criteria of the tuner: a run passes only if it
drains within its longest TTFT budget after its last arrival, so a queue that grows until the run ends (even
one confined to a few long prompts, which the 90%-of-requests count lets miss) does not pass; and only if the
target holds in each third of the run by arrival, so a queue every request shares, growing slowly while the
longest budget hides the drain, does not pass either."""
import pytest

from asap.measure.buckets import min_bucket_attainment
from asap.measure.metrics import RequestResult
from asap.measure.sustain import RULE, by_arrival_third, drain, sustained, sustained_value
from asap.scheduler.request import Request
from asap.studies.skeptic import rate_at
from asap.studies.config import EngineConfig
from asap.studies.tune_tasks import CRITERIA, pass_values
from asap.workload.slo import SLO


def _run(late_by: float):
    """100 requests a second apart, budget 2 s, each served in 1 s; the long one (the 50th) is served
    `late_by` seconds after the last arrival."""
    out = [RequestResult(i, float(i), 100, 1.0, deadline_s=2.0) for i in range(100) if i != 50]
    out.append(RequestResult(50, 50.0, 90000, 99.0 - 50.0 + late_by, deadline_s=92.0))
    return out


def test_the_drain_is_measured_after_the_last_arrival_against_the_longest_budget():
    d = drain(_run(late_by=10.0))
    assert d == {"drain_s": pytest.approx(10.0), "max_budget_s": 92.0}
    assert sustained(_run(late_by=10.0)) and not sustained(_run(late_by=500.0))
    assert drain([RequestResult(0, 0.0, 10, None, error="x", deadline_s=1.0)]) == {"drain_s": None, "max_budget_s": None}
    assert not sustained([])


def test_the_sustained_criteria_zero_a_run_that_did_not_drain():
    ok, late = _run(10.0), _run(500.0)
    assert pass_values(ok, 0.99) == {"min_bucket_attainment": 1.0, "sustained_attainment": 0.99,
                                     "sustained_min_bucket_attainment": 1.0}
    # late: the long prompt missed (its bucket 0%), 99% of requests met, and the run did not drain in time
    assert pass_values(late, 0.99) == {"min_bucket_attainment": 0.0, "sustained_attainment": 0.0,
                                       "sustained_min_bucket_attainment": 0.0}
    assert set(CRITERIA) == {"requests", "every-bucket", "requests-sustained", "every-bucket-sustained"}


def _growing(n: int = 300):
    """n requests a second apart, budgets 2 s, the longest (one 60K prompt, the first) 62 s; from two thirds
    of the way TTFT grows with the arrival (a queue every request shares) past 2 s at 93%, so the last third
    misses a fifth while 93% meet overall and the run drains in 2.3 s."""
    out = [RequestResult(0, 0.0, 60000, 1.0, deadline_s=62.0)]
    out += [RequestResult(i, float(i), 100, 1.0 + 3.8 * max(0.0, i / n - 2 / 3), deadline_s=2.0)
            for i in range(1, n)]
    return out


def test_a_queue_every_request_shares_fails_on_its_last_third_though_it_drains_in_time():
    rs = _growing()
    first, middle, last = by_arrival_third(rs)
    assert first == middle == 1.0 and last < 0.9
    overall = sum(r.ttft <= r.deadline_s for r in rs) / len(rs)
    assert overall >= 0.9 and sustained(rs)           # what the drain alone would pass
    assert sustained_value(rs, overall) == last < 0.9
    assert pass_values(rs, overall)["sustained_attainment"] == last
    assert pass_values(rs, overall)["sustained_min_bucket_attainment"] == min(last, min_bucket_attainment(rs)) == last
    assert sustained_value(rs, None) == 0.0


def test_rate_searches_take_the_sustained_criteria():
    """rate_at (the headline's searches) measures the sustained values at every rate; where every run drains
    in time the two criteria find the same maximum."""
    reqs = SLO(0.05, 1e-5).apply([Request(i, 500 + 1500 * (i % 5), 0.004 * i) for i in range(300)])
    c, cache = EngineConfig("sync", 1, 4096), {}
    plain = rate_at(reqs, c, 8, "small-deepseek-v3", "h800", lo=50.0, tol=0.1, cache=cache)
    strict = rate_at(reqs, c, 8, "small-deepseek-v3", "h800", lo=50.0, tol=0.1, criterion="requests-sustained",
                     cache=cache)
    assert all("sustained_attainment" in m for m in cache.values())
    assert all(m["sustained_attainment"] == m["slo_attainment"] for m in cache.values())     # all drained
    assert strict["max_slo_rate"] == plain["max_slo_rate"]
    with pytest.raises(ValueError, match="criterion must be one of"):
        rate_at(reqs, c, 8, "small-deepseek-v3", "h800", lo=50.0, criterion="sustained")


def test_the_headline_records_its_rule_and_refuses_to_resume_across_rules(tmp_path):
    """A resume across search rules is refused, and the refusal names the rule each side has by its flags."""
    from asap.studies.headline import DEFAULT_SLO, SUSTAINED, run_headline, search_rule
    from asap.workload.slo import parse_slo
    earlier = {"slo": str(parse_slo(DEFAULT_SLO)), "model": "deepseek-v3", "hardware": "cloudmatrix384",
               "rows": [], "sustained": False}
    with pytest.raises(ValueError, match="sustained: no --sustained there, --sustained --no-vet here"):
        run_headline((8,), ("fixed-4k",), resume=earlier, sustained=True, out_dir=None, verbose=False)
    vetted = dict(earlier, sustained=search_rule(True, True))
    with pytest.raises(ValueError, match=r"sustained: --sustained \(--vet\) there, --sustained --no-vet here"):
        run_headline((8,), ("fixed-4k",), resume=vetted, sustained=True, out_dir=None, verbose=False)
    with pytest.raises(ValueError, match=r"hardware: cloudmatrix384 there, h800 here"):
        run_headline((8,), ("fixed-4k",), resume=vetted, hardware="h800", sustained=True, vet=True, out_dir=None,
                     verbose=False)
    drain_only = dict(earlier, sustained=True)        # recorded before the thirds joined the rule
    with pytest.raises(ValueError, match="an older rule no flag gives now"):
        run_headline((8,), ("fixed-4k",), resume=drain_only, sustained=True, out_dir=None, verbose=False)
    thirds = dict(earlier, sustained=RULE)            # recorded before tune confirmed maxima on longer samples
    with pytest.raises(ValueError, match="an older rule no flag gives now"):
        run_headline((8,), ("fixed-4k",), resume=thirds, sustained=True, out_dir=None, verbose=False)
    own_samples = dict(earlier, sustained=f"{RULE}; each maximum confirmed on 2x its requests")  # to 2026-12-05
    with pytest.raises(ValueError, match="an older rule no flag gives now"):
        run_headline((8,), ("fixed-4k",), resume=own_samples, sustained=True, out_dir=None, verbose=False)
    with pytest.raises(ValueError, match="no row for workload"):
        run_headline((8,), ("fixed-4k",), resume=dict(earlier, sustained=SUSTAINED), sustained=True, out_dir=None,
                     verbose=False)
    with pytest.raises(ValueError, match="no row for workload"):     # the same rule gets past that check
        run_headline((8,), ("fixed-4k",), resume=earlier, sustained=False, out_dir=None, verbose=False)
