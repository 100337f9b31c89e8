"""Promises of asap.measure.metrics.summarize."""
import numpy as np
import pytest

from asap.measure.metrics import SUMMARY_KEYS, RequestResult, summarize
from asap.scheduler.request import Request


def ok(i, ttft, arrival=0.0, tokens=100, budget=None):
    return RequestResult(i, arrival, tokens, ttft, None, budget)


def failed(i, arrival=0.0, tokens=100, budget=None):
    return RequestResult(i, arrival, tokens, None, "RuntimeError: boom", budget)


def test_percentiles_match_numpy():
    ttfts = np.random.default_rng(0).exponential(0.5, size=1000)
    s = summarize([ok(i, t, arrival=i * 0.01) for i, t in enumerate(ttfts)])
    ms = ttfts * 1000
    assert s["ttft_mean_ms"] == pytest.approx(ms.mean())
    for p in (50, 90, 99):
        assert s[f"ttft_p{p}_ms"] == pytest.approx(np.percentile(ms, p))
    assert s["ttft_max_ms"] == pytest.approx(ms.max())
    assert set(SUMMARY_KEYS) == set(s)


def test_failures_count_as_misses_and_stay_in_denominator():
    results = [ok(0, 0.1), ok(1, 0.5), ok(2, 3.0), failed(3)]
    s = summarize(results, slo=1.0, duration=2.0)
    assert s["num_requests"] == 4 and s["num_failed"] == 1
    assert s["num_slo_met"] == 2 and s["slo_attainment"] == 0.5
    assert s["goodput"] == pytest.approx(1.0)                   # 2 met / 2 s
    assert s["request_throughput"] == pytest.approx(1.5)        # 3 succeeded / 2 s
    assert s["input_token_throughput"] == pytest.approx(150.0)
    assert s["ttft_p50_ms"] == pytest.approx(500.0)             # failures excluded from latency stats


def test_per_request_budget_wins_over_default_slo():
    results = [ok(0, 0.5, budget=0.4), ok(1, 0.5, budget=0.6), ok(2, 0.5)]
    assert summarize(results, slo=1.0)["num_slo_met"] == 2
    with pytest.raises(ValueError, match="no TTFT SLO"):
        summarize(results)


def test_no_slo_means_no_attainment_and_all_failed_has_no_latency():
    s = summarize([ok(0, 0.1)])
    assert s["slo_attainment"] is None and s["goodput"] is None
    s = summarize([failed(0), failed(1)], slo=1.0, duration=1.0)
    assert s["slo_attainment"] == 0.0 and s["ttft_p50_ms"] is None and s["request_throughput"] == 0.0


def test_duration_defaults_to_first_arrival_to_last_completion():
    s = summarize([ok(0, 0.5, arrival=1.0), ok(1, 2.0, arrival=2.0), failed(2, arrival=5.0)])
    assert s["duration_s"] == pytest.approx(4.0)


def test_result_of_request_carries_relative_budget():
    r = RequestResult.of(Request(7, 10, arrival=3.0, deadline=5.5), ttft=1.0)
    assert (r.request_id, r.num_tokens, r.arrival, r.deadline_s, r.ok) == (7, 10, 3.0, 2.5, True)


def test_bad_summary_arguments_raise():
    with pytest.raises(ValueError, match="slo"):
        summarize([ok(0, 0.1)], slo=0)
    with pytest.raises(ValueError, match="duration"):
        summarize([ok(0, 0.1)], duration=-1)


# ---- vLLM's result keys ----

from asap.measure.metrics import parse_goodput, parse_metrics, parse_percentiles, vllm_metrics  # noqa: E402


def test_vllm_keys_match_vllms_definitions():
    results = [RequestResult(i, 0.1 * i, 100 + i, 0.1 * (i + 1), None, 0.25, e2el=0.2 * (i + 1)) for i in range(4)]
    results.append(RequestResult(4, 0.5, 50, None, "RuntimeError: boom", 0.25))
    s = summarize(results)
    v = vllm_metrics(results, s, metrics=["ttft", "e2el", "tpot"], percentiles=[50, 99.9], goodput={})
    assert (v["completed"], v["failed"], v["duration"]) == (4, 1, s["duration_s"])
    assert v["total_input_tokens"] == 100 + 101 + 102 + 103 and v["total_output_tokens"] == 4
    assert v["request_throughput"] == pytest.approx(4 / s["duration_s"])
    assert v["request_goodput"] == pytest.approx(2 / s["duration_s"])       # TTFT 0.1, 0.2 within 0.25
    assert v["mean_ttft_ms"] == pytest.approx(250) and v["median_ttft_ms"] == pytest.approx(250)
    assert v["std_ttft_ms"] == pytest.approx(np.std([100, 200, 300, 400]))
    assert v["p50_ttft_ms"] == pytest.approx(250) and "p99.9_ttft_ms" in v
    assert v["mean_e2el_ms"] == pytest.approx(500)
    assert v["mean_tpot_ms"] == 0.0          # one token: vLLM reports 0
    assert v["errors"][4] == "RuntimeError: boom" and v["ttfts"][4] is None and len(v["input_lens"]) == 5
    e2el_bound = vllm_metrics(results, s, goodput={"e2el": 0.5})            # also within 500 ms end to end
    assert e2el_bound["request_goodput"] == pytest.approx(2 / s["duration_s"])
    tight = vllm_metrics(results, s, goodput={"e2el": 0.3})
    assert tight["request_goodput"] == pytest.approx(1 / s["duration_s"])
    assert vllm_metrics(results[:4], summarize([RequestResult(i, 0, 1, 0.1) for i in range(2)]))["request_goodput"] \
        is None                              # no SLO at all


def test_vllm_flag_values_are_checked():
    assert parse_goodput(["ttft:500", "e2el:2000"]) == {"ttft": 0.5, "e2el": 2.0}
    assert parse_percentiles("50,90,99.9") == [50.0, 90.0, 99.9]
    assert parse_metrics("ttft,e2el") == ["ttft", "e2el"]
    for bad in (["ttft"], ["ttft:x"], ["latency:5"], ["ttft:-1"]):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput(bad)
    for bad in ("", "0", "101", "a,b"):
        with pytest.raises(ValueError, match="--metric-percentiles"):
            parse_percentiles(bad)
    with pytest.raises(ValueError, match="--percentile-metrics"):
        parse_metrics("ttft,latency")
