"""Promises of asap.measure.rate_search.find_max_rate, on synthetic measure functions."""
import pytest

from asap.measure.rate_search import find_max_rate


def step(threshold):
    """Attainment 1.0 up to `threshold` req/s, 0.0 above; counts calls."""
    calls = []

    def measure(rate):
        calls.append(rate)
        return {"slo_attainment": 1.0 if rate <= threshold else 0.0}
    return measure, calls


@pytest.mark.parametrize("threshold, lo", [(13.7, 1.0), (0.3, 1.0), (100.0, 100.0), (1.0, 0.25)])
def test_converges_within_tolerance_and_reports_all_points(threshold, lo):
    measure, calls = step(threshold)
    out = find_max_rate(measure, target=0.9, lo=lo, tol=0.02, max_iters=40)
    assert out["converged"] and out["tolerance"] == 0.02
    assert out["max_slo_rate"] <= threshold
    assert (threshold - out["max_slo_rate"]) <= 0.02 * out["max_slo_rate"]
    assert [p[0] for p in out["points"]] == calls
    assert all(s["slo_attainment"] == (1.0 if r <= threshold else 0.0) for r, s in out["points"])


def test_smooth_monotone_measure_and_given_hi():
    # attainment falls linearly from 1 at rate 0 to 0 at rate 20: crosses 0.9 at rate 2
    out = find_max_rate(lambda r: {"slo_attainment": max(0.0, 1 - r / 20)}, lo=0.5, hi=8.0, tol=0.01)
    assert out["max_slo_rate"] == pytest.approx(2.0, rel=0.01) and out["max_slo_rate"] <= 2.0


def test_deterministic():
    a = find_max_rate(step(7.3)[0], tol=0.01)
    b = find_max_rate(step(7.3)[0], tol=0.01)
    assert a == b


def test_max_iters_bounds_measurements():
    measure, calls = step(1e9)
    out = find_max_rate(measure, max_iters=5)
    assert len(calls) == 5 and not out["converged"] and out["max_slo_rate"] == 16.0   # 1, 2, 4, 8, 16 all passed
    measure, calls = step(-1)             # never passes
    out = find_max_rate(measure, max_iters=6)
    assert len(calls) == 6 and out["max_slo_rate"] == 0.0


@pytest.mark.parametrize("kw, match", [(dict(target=0), "target"), (dict(lo=0), "lo"), (dict(lo=2, hi=1), "hi"),
                                       (dict(tol=0), "tol"), (dict(max_iters=1), "max_iters")])
def test_bad_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        find_max_rate(step(1)[0], **kw)


def test_missing_attainment_raises():
    with pytest.raises(ValueError, match="slo_attainment"):
        find_max_rate(lambda r: {"slo_attainment": None})
