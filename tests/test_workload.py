"""Promises of asap.workload: arrival statistics, lengths, trace parsing, composition."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from asap.workload import (Constant, Fixed, FromTrace, Gamma, LogNormal, Poisson, Uniform, Workload,
                           read_azure, read_mooncake, read_trace)

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_excerpt.jsonl"
AZURE = DATA / "azure_excerpt.csv"
REAL_TRACE = Path("/work/shared/traces/mooncake_conversation.jsonl")


def rng(seed=0):
    return np.random.default_rng(seed)


# ---- arrivals ---------------------------------------------------------------
def test_poisson_empirical_rate_matches():
    t = Poisson(rate=20.0).times(20_000, rng())
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(20.0, rel=0.03)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv_match(cv):
    gaps = np.diff(Gamma(rate=10.0, cv=cv).times(50_000, rng(1)))
    assert 1 / gaps.mean() == pytest.approx(10.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_constant_is_evenly_spaced():
    np.testing.assert_allclose(Constant(rate=4.0).times(5, rng()), [0, 0.25, 0.5, 0.75, 1.0])


def test_arrivals_are_reproducible_by_seed():
    p = Poisson(rate=3.0)
    assert np.array_equal(p.times(50, rng(7)), p.times(50, rng(7)))
    assert not np.array_equal(p.times(50, rng(7)), p.times(50, rng(8)))


@pytest.mark.parametrize("make, match", [
    (lambda: Poisson(-1.0), "rate"), (lambda: Poisson(0.0), "rate"), (lambda: Constant(float("inf")), "rate"),
    (lambda: Gamma(1.0, 0.0), "cv"), (lambda: Gamma(1.0, -2.0), "cv"), (lambda: Gamma(-1.0, 1.0), "rate"),
])
def test_bad_arrival_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ---- lengths ----------------------------------------------------------------
def test_length_distributions_respect_their_parameters():
    assert np.all(Fixed(128).sample(10, rng()) == 128)
    u = Uniform(10, 20).sample(5000, rng())
    assert u.min() == 10 and u.max() == 20
    ln = LogNormal(mean=2000, sigma=0.8).sample(100_000, rng())
    assert ln.min() >= 1 and ln.mean() == pytest.approx(2000, rel=0.03)
    ft = FromTrace((5, 7, 9)).sample(1000, rng())
    assert set(ft.tolist()) == {5, 7, 9}


@pytest.mark.parametrize("make", [lambda: Fixed(0), lambda: Uniform(5, 4), lambda: Uniform(0, 4),
                                  lambda: LogNormal(0.5, 1.0), lambda: LogNormal(100, -1), lambda: FromTrace(())])
def test_bad_length_parameters_raise(make):
    with pytest.raises(ValueError):
        make()


# ---- traces -----------------------------------------------------------------
def test_mooncake_excerpt_parses_sorted_relative_seconds():
    tr = read_mooncake(MOONCAKE)
    np.testing.assert_allclose(tr.arrivals, [0, 0, 1.0, 1.5, 4.0])
    assert tr.input_lengths.tolist() == [6758, 7322, 512, 2290, 12035]
    assert tr.output_lengths.tolist() == [500, 490, 3, 316, 0]


def test_azure_excerpt_parses_datetimes_to_relative_seconds():
    tr = read_azure(AZURE)
    np.testing.assert_allclose(tr.arrivals, [0, 0.5, 4.314579, 4.31941], atol=1e-6)
    assert tr.input_lengths.tolist() == [374, 91, 396, 879]
    assert tr.output_lengths.tolist() == [44, 0, 109, 28]
    assert len(read_trace(AZURE)) == 4 and len(read_trace(MOONCAKE)) == 5


@pytest.mark.parametrize("bad_line, match", [
    ('{"timestamp": 5, "input_length": 10', "malformed JSON"),
    ('{"timestamp": 5, "output_length": 1}', "input_length"),
    ('{"timestamp": 5, "input_length": 0, "output_length": 1}', "input_length must be >= 1"),
    ('{"timestamp": "x", "input_length": 3, "output_length": 1}', "timestamp"),
])
def test_malformed_mooncake_line_names_its_line(tmp_path, bad_line, match):
    path = tmp_path / "t.jsonl"
    path.write_text(MOONCAKE.read_text() + bad_line + "\n")
    with pytest.raises(ValueError, match=f"t.jsonl:7: .*{match}"):
        read_mooncake(path)


@pytest.mark.parametrize("bad_row, match", [
    ("yesterday,10,2", "TIMESTAMP"), ("2023-11-16 18:15:52,ten,2", "ContextTokens"), ("2023-11-16 18:15:52,10", "fields"),
])
def test_malformed_azure_row_names_its_line(tmp_path, bad_row, match):
    path = tmp_path / "t.csv"
    path.write_text(AZURE.read_text() + bad_row + "\n")
    with pytest.raises(ValueError, match=f"t.csv:6: .*{match}"):
        read_azure(path)


def test_trace_file_problems_raise(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        read_trace(tmp_path / "missing.jsonl")
    (tmp_path / "h.csv").write_text("time,tokens\n1,2\n")
    with pytest.raises(ValueError, match="header lacks"):
        read_azure(tmp_path / "h.csv")
    (tmp_path / "t.txt").write_text("")
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(tmp_path / "t.txt")


# ---- composition ------------------------------------------------------------
def synthetic(**kw):
    return Workload(**{"arrivals": Poisson(5.0), "lengths": Uniform(16, 64), "num_requests": 200, **kw})


def test_trace_replayed_as_is():
    reqs = Workload(trace=MOONCAKE, with_prompts=False).build()
    assert [r.id for r in reqs] == list(range(5))
    assert [r.arrival for r in reqs] == [0, 0, 1.0, 1.5, 4.0]
    assert [r.num_tokens for r in reqs] == [6758, 7322, 512, 2290, 12035]
    assert reqs[0].meta["output_length"] == 500 and reqs[0].prompt is None and reqs[0].deadline is None


def test_rate_override_gives_requested_mean_rate():
    for w in (Workload(trace=MOONCAKE, rate=2.0), synthetic(rate=50.0)):
        t = np.array([r.arrival for r in w.build()])
        assert t[0] == 0 and (len(t) - 1) / t[-1] == pytest.approx(w.rate)


def test_time_scale_stretches_arrivals():
    base = [r.arrival for r in Workload(trace=MOONCAKE).build()]
    slow = [r.arrival for r in Workload(trace=MOONCAKE, time_scale=2.0).build()]
    np.testing.assert_allclose(slow, np.array(base) * 2)


def test_limit_length_scale_and_clip():
    reqs = Workload(trace=MOONCAKE, num_requests=3, length_scale=0.5, min_tokens=300, max_tokens=3000).build()
    assert [r.num_tokens for r in reqs] == [3000, 3000, 300]


def test_a_looped_trace_repeats_its_own_arrival_pattern_without_its_block_hashes():
    once = Workload(trace=MOONCAKE, with_prompts=False).build()
    m = len(once)
    assert len(Workload(trace=MOONCAKE, num_requests=m + 5, with_prompts=False).build()) == m   # no loop: capped
    looped = Workload(trace=MOONCAKE, num_requests=2 * m + 1, with_prompts=False, loop=True).build()
    assert len(looped) == 2 * m + 1 and [r.id for r in looped] == list(range(2 * m + 1))
    t = np.array([r.arrival for r in once])
    period = (t[-1] - t[0]) * m / (m - 1)                  # the span plus one mean gap
    np.testing.assert_allclose([r.arrival for r in looped[m:2 * m]], t + period)
    assert looped[2 * m].arrival == pytest.approx(t[0] + 2 * period)
    assert [r.num_tokens for r in looped[m:2 * m]] == [r.num_tokens for r in once]
    assert [r.hash_ids for r in looped[:m]] == [r.hash_ids for r in once] and any(r.hash_ids for r in once)
    assert all(r.hash_ids == () for r in looped[m:])       # a repeat is not the same prompt to a prefix cache
    gaps = np.diff([r.arrival for r in looped])
    assert (gaps >= 0).all()


def test_slo_sets_deadlines():
    from asap.workload.slo import SLO
    for r in Workload(trace=MOONCAKE, slo=SLO(2.0)).build():
        assert r.deadline == pytest.approx(r.arrival + 2.0)
    for r in Workload(trace=MOONCAKE, slo=SLO(0.0, 1e-3)).build():
        assert r.deadline == pytest.approx(r.arrival + 1e-3 * r.num_tokens)
    # both: the sum, a base every prompt has plus the per-token time a long prefill needs
    reqs = Workload(trace=MOONCAKE, slo=SLO(5.0, 1e-3)).build()
    for r in reqs:
        assert r.deadline == pytest.approx(r.arrival + 5.0 + 1e-3 * r.num_tokens)
    assert all(r.deadline is None for r in Workload(trace=MOONCAKE).build())


def test_prompts_are_deterministic_per_seed():
    a, b, c = synthetic(seed=1).build(), synthetic(seed=1).build(), synthetic(seed=2).build()
    assert all(x.prompt == y.prompt and x.arrival == y.arrival for x, y in zip(a, b))
    assert [x.prompt for x in a] != [z.prompt for z in c]
    assert all(len(x.prompt) == x.num_tokens and max(x.prompt) < 1000
               for x in synthetic(vocab_size=1000).build())
    # a request's prompt depends on (seed, id) only, not on how many requests are built
    assert synthetic(seed=1, num_requests=5).build()[3].prompt == a[3].prompt


def test_trace_lengths_with_synthetic_arrivals():
    reqs = Workload(trace=MOONCAKE, arrivals=Constant(10.0)).build()
    assert [r.arrival for r in reqs] == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    assert reqs[-1].num_tokens == 12035


@pytest.mark.parametrize("kw, match", [
    (dict(arrivals=Poisson(1.0)), "without a trace"),
    (dict(trace=MOONCAKE, rate=-1.0), "rate"),
    (dict(trace=MOONCAKE, rate=1.0, time_scale=2.0), "either rate or time_scale"),
    (dict(trace=MOONCAKE, slo=2.0), "slo must be an asap.workload.slo.SLO"),
    (dict(trace=MOONCAKE, min_tokens=10, max_tokens=5), "max_tokens"),
    (dict(trace=MOONCAKE, num_requests=0), "num_requests"),
    (dict(trace=MOONCAKE, length_scale=0), "length_scale"),
])
def test_bad_workload_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        Workload(**kw)


def test_missing_trace_file_raises_on_build():
    with pytest.raises(ValueError, match="not found"):
        Workload(trace="/nonexistent/trace.jsonl").build()


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="shared Mooncake trace not present")
def test_real_mooncake_trace_loads_and_rescales():
    tr = read_trace(REAL_TRACE)
    assert len(tr) == 12031 and tr.input_lengths.mean() == pytest.approx(12035, rel=0.01)
    reqs = replace(Workload(trace=REAL_TRACE, num_requests=500, with_prompts=False), rate=3.0).build()
    assert (len(reqs) - 1) / reqs[-1].arrival == pytest.approx(3.0)


def test_slo_specs_as_peers_write_them_and_the_same_deadlines_for_every_engine():
    from asap.scheduler.request import Request
    from asap.workload.slo import SLO, parse_slo
    assert parse_slo("ttft:5000") == SLO(5.0) == parse_slo("5s") == parse_slo("5000ms")
    slo = parse_slo("2s+1ms/tok")
    assert slo.budget(4000) == pytest.approx(6.0) and slo.scaled(0.5).budget(4000) == pytest.approx(3.0)
    reqs = slo.apply([Request(0, 1000, arrival=3.0), Request(1, 9000, arrival=4.0)])
    assert [r.deadline for r in reqs] == pytest.approx([6.0, 15.0])
    for bad in ("5", "2s+3s", "fast", "ttft:x", "0s", "5x"):
        with pytest.raises(ValueError, match="SLO"):
            parse_slo(bad)                     # 5x: only where the command resolves it (relative=True)
    from asap.workload.slo import IdleMultiple
    assert parse_slo("5x", relative=True) == IdleMultiple(5.0) and parse_slo("2s", relative=True) == SLO(2.0)
    for bad in ("0x", "x", "-1x"):
        with pytest.raises(ValueError, match="SLO|multiple"):
            parse_slo(bad, relative=True)


def test_named_workloads_and_unknown_names():
    from asap.workload.presets import workload_requests
    fixed = workload_requests("fixed-2k", 50)
    assert len(fixed) == 50 and {r.num_tokens for r in fixed} == {2048} and fixed[-1].arrival > 0
    assert all(r.deadline is None for r in fixed)
    with pytest.raises(ValueError, match="unknown workload"):
        workload_requests("nope", 10)
