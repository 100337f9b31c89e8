"""Attainment per prompt-length bucket: a request-count SLO must not hide a length class that misses."""
import pytest

from asap.measure.buckets import BUCKETS, bucket_of, by_length, format_buckets, min_bucket_attainment
from asap.measure.metrics import RequestResult


def _r(i, tokens, ttft, budget=2.0, error=None):
    return RequestResult(i, 0.0, tokens, None if error else ttft, error, budget)


def test_buckets_split_at_4k_16k_64k_and_count_failures_as_misses():
    assert [bucket_of(n) for n in (1, 4095, 4096, 16383, 16384, 65535, 65536, 10 ** 6)] == \
        ["<4K", "<4K", "4-16K", "4-16K", "16-64K", "16-64K", ">64K", ">64K"]
    results = [_r(0, 1000, 0.5), _r(1, 2000, 3.0), _r(2, 8000, 1.0), _r(3, 100000, 9.0),
               _r(4, 100000, 1.0, error="boom")]
    b = by_length(results)
    assert list(b) == [label for label, _, _ in BUCKETS]
    assert b["<4K"]["num_requests"] == 2 and b["<4K"]["slo_attainment"] == 0.5
    assert b["4-16K"]["slo_attainment"] == 1.0 and b["16-64K"]["slo_attainment"] is None
    assert b[">64K"]["num_requests"] == 2 and b[">64K"]["slo_attainment"] == 0.0
    assert sum(x["share_of_tokens"] for x in b.values()) == pytest.approx(1.0)
    assert b[">64K"]["share_of_tokens"] == pytest.approx(200000 / 211000)
    # 3 of 5 requests within SLO overall (60%), but one whole bucket misses: the every-bucket value is 0
    assert min_bucket_attainment(results) == 0.0
    assert "16-64K - (n=0)" in format_buckets(b) and "<4K 50% (n=2)" in format_buckets(b)


def test_a_default_slo_covers_results_without_their_own_budget():
    results = [_r(0, 1000, 0.5, budget=None), _r(1, 5000, 1.5, budget=None)]
    assert min_bucket_attainment(results, slo=1.0) == 0.0
    assert by_length(results, slo=2.0)["4-16K"]["slo_attainment"] == 1.0
    with pytest.raises(ValueError, match="budget"):
        by_length(results)
