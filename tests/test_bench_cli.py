"""Promises of `asap bench`: flags map onto the workload and engine config, bad input is a clear error,
and a run accounts for every request of every target in its table, JSON and plots."""
import argparse
import json
from pathlib import Path

import pytest

from asap.bench.cli import build_workload, parse_lengths, register, runtime_from_args
from asap.bench.metrics import SUMMARY_KEYS
from asap.cli import main
from asap.workload import Fixed, LogNormal, Uniform

MOONCAKE = Path(__file__).parent / "data" / "mooncake_excerpt.jsonl"    # 5 requests


def parse(*argv):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_flags_reach_the_engine_config_and_sync_gets_a_plus_e_devices():
    args = parse("--target", "sync", "--target", "async", "--attention-workers", "2", "--expert-workers", "3",
                 "--compute", "emulated", "--no-adaptive-depth")
    assert args.target == ["sync", "async"]
    rt = runtime_from_args(args)
    assert (rt.attention_workers, rt.expert_workers, rt.devices, rt.compute) == (2, 3, 5, "emulated")
    assert runtime_from_args(parse("--devices", "4")).devices == 4
    with pytest.raises(SystemExit):
        parse("--target", "vllm")


def test_lengths_specs():
    assert parse_lengths("trace") is None
    assert parse_lengths("fixed:128") == Fixed(128)
    assert parse_lengths("uniform:8:64") == Uniform(8, 64)
    assert parse_lengths("lognormal:700:1.5") == LogNormal(700.0, 1.5)
    for bad in ("fixed", "uniform:8", "zipf:3", "fixed:x", "uniform:9:3"):
        with pytest.raises(ValueError, match="--lengths"):
            parse_lengths(bad)


def test_workload_flags():
    args = parse("--trace", str(MOONCAKE), "--rate", "2", "--length-scale", "0.5", "--max-tokens", "100000",
                 "--slo-per-token-ms", "10", "--num-requests", "4")
    w = build_workload(args, vocab_size=512, max_position=4096)
    reqs = w.build()
    assert len(reqs) == 4 and max(r.num_tokens for r in reqs) <= 4096     # clipped to the model's limit
    assert reqs[0].num_tokens == 3379
    assert all(r.deadline - r.arrival == pytest.approx(0.01 * r.num_tokens) for r in reqs)
    assert all(max(r.prompt) < 512 for r in reqs)
    synthetic = build_workload(parse("--trace", "none", "--arrivals", "poisson", "--rate", "3", "--lengths",
                                     "fixed:10", "--num-requests", "7"), 512, 4096).build()
    assert len(synthetic) == 7 and {r.num_tokens for r in synthetic} == {10}
    with pytest.raises(ValueError, match="needs --rate"):
        build_workload(parse("--arrivals", "poisson"), 512, 4096)
    with pytest.raises(ValueError, match="--trace none"):
        build_workload(parse("--trace", "none", "--arrivals", "poisson", "--rate", "1"), 512, 4096)


def test_bad_invocations_are_clear_errors(capsys):
    assert main(["bench", "--find-max-rate", "--target", "sim-async", "--model", "tiny-deepseek-v3"]) == 2
    assert "needs an SLO" in capsys.readouterr().err
    assert main(["bench", "--target", "http", "--model", "tiny-deepseek-v3", "--trace", str(MOONCAKE),
                 "--no-progress"]) == 2
    assert "needs --url" in capsys.readouterr().err
    assert main(["bench", "--target", "sim-async", "--model", "tiny-deepseek-v3", "--trace", "/nonexistent.jsonl"]) == 2
    assert "not found" in capsys.readouterr().err


def test_simulated_rate_search_is_labelled_and_plotted(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--target", "sim-async", "--target", "sim-sync", "--model", "tiny-deepseek-v3",
                 "--trace", "none", "--arrivals", "poisson", "--rate", "20", "--lengths", "uniform:16:256",
                 "--num-requests", "40", "--slo-ttft-s", "0.05", "--find-max-rate", "--max-iters", "6",
                 "--json", str(out), "--plot", str(tmp_path / "plots")]) == 0
    stdout = capsys.readouterr().out
    assert "SIMULATED" in stdout and "max_slo_rate" in stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["target"] for r in runs] == ["sim-async", "sim-sync"]
    for r in runs:
        assert "SIMULATED" in r["label"] and r["max_slo_rate"] is not None and r["search"]["points"]
        assert r["num_requests"] == 40
    assert (tmp_path / "plots" / "attainment_vs_rate.png").is_file()
    assert (tmp_path / "plots" / "ttft_cdf.png").is_file()


def test_async_and_sync_end_to_end_account_for_every_request(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "tiny-deepseek-v3", "--target", "async", "--target", "sync",
                 "--trace", str(MOONCAKE), "--rate", "5", "--length-scale", "0.01", "--min-tokens", "4",
                 "--slo-ttft-s", "30", "--json", str(out), "--plot", str(tmp_path / "plots"), "--no-progress",
                 "--token-budget", "256"]) == 0
    stdout = capsys.readouterr().out
    header = stdout.splitlines()[1].split()
    assert header == ["label", "async", "sync"]
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == ["async", "sync"]
    for r in runs:
        assert set(SUMMARY_KEYS) <= set(r)
        assert {"target", "rate", "slo", "workers", "wall_s", "startup_s", "num_tokens"} <= set(r)
        assert r["num_requests"] == 5 and r["num_failed"] == 0 and r["num_slo_met"] == 5
        assert r["num_tokens"] == sum(max(4, round(n * 0.01)) for n in (6758, 7322, 512, 2290, 12035))
        for fractions in r["workers"].values():
            assert sum(fractions.values()) == pytest.approx(1.0, abs=0.15)
    assert set(runs[0]["workers"]) == {"attention0", "expert0"}
    assert set(runs[1]["workers"]) == {"rank0", "rank1"}
    assert "attention0" in stdout and "rank1" in stdout
    plots = tmp_path / "plots"
    for name in ("ttft_cdf.png", "timeline_async.png", "timeline_sync.png", "trace_sync.json"):
        assert (plots / name).is_file(), name
