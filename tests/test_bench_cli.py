"""Promises of `asap bench`: flags map onto the workload and engine config, bad input is a clear error,
and a run accounts for every request of every target in its table, JSON and plots."""
import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from asap.bench.cli import build_workload, parse_lengths, register, runtime_from_args
from asap.measure.metrics import SUMMARY_KEYS
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
                 "--slo", "10ms/tok", "--num-requests", "4")
    w = build_workload(args, vocab_size=512, max_position=4096)
    reqs = w.build()
    assert len(reqs) == 4 and max(r.num_tokens for r in reqs) <= 4096     # clipped to the model's limit
    assert reqs[0].num_tokens == 3379
    assert all(r.deadline - r.arrival == pytest.approx(0.01 * r.num_tokens) for r in reqs)
    assert all(max(r.prompt) < 512 for r in reqs)
    synthetic = build_workload(parse("--trace", "none", "--arrivals", "poisson", "--rate", "3", "--lengths",
                                     "fixed:10", "--num-requests", "7"), 512, 4096).build()
    assert len(synthetic) == 7 and {r.num_tokens for r in synthetic} == {10}
    with pytest.raises(ValueError, match="needs --request-rate"):
        build_workload(parse("--arrivals", "poisson"), 512, 4096)
    with pytest.raises(ValueError, match="--dataset-path none"):
        build_workload(parse("--trace", "none", "--arrivals", "poisson", "--rate", "1"), 512, 4096)


def test_bad_invocations_are_clear_errors(capsys):
    assert main(["bench", "--find-max-rate", "--target", "sim-async", "--model", "tiny-deepseek-v3"]) == 2
    assert "needs an SLO" in capsys.readouterr().err
    for server_flag in (["--base-url", "http://127.0.0.1:1"], ["--port", "8001"], ["--backend", "vllm"]):
        assert main(["bench", "--target", "sim-async", "--model", "tiny-deepseek-v3", *server_flag]) == 2
        assert "add --target http" in capsys.readouterr().err, server_flag     # never silently ignored
    assert main(["bench", "--target", "http", "--base-url", "http://127.0.0.1:1", "--port", "1"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["bench", "--target", "http", "--model", "tiny-deepseek-v3", "--random-output-len", "4"]) == 2
    assert "--dataset-name random" in capsys.readouterr().err
    # no --model: the model comes from the server, and a server that cannot be asked is a clear error
    assert main(["bench", "--target", "http", "--base-url", "http://127.0.0.1:1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:1/v1/models" in err and "--model" in err
    assert main(["bench", "--target", "sim-async", "--model", "tiny-deepseek-v3", "--trace", "/nonexistent.jsonl"]) == 2
    assert "not found" in capsys.readouterr().err


def test_simulated_rate_search_is_labelled_and_plotted(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--target", "sim-async", "--target", "sim-sync", "--model", "tiny-deepseek-v3",
                 "--trace", "none", "--arrivals", "poisson", "--rate", "20", "--lengths", "uniform:16:256",
                 "--num-requests", "40", "--slo", "50ms", "--find-max-rate", "--max-iters", "6",
                 "--json", str(out), "--plot", str(tmp_path / "plots")]) == 0
    stdout = capsys.readouterr().out
    assert "SIMULATED" in stdout and "max_slo_rate" in stdout
    runs = json.loads(out.read_text())["runs"]
    assert [r["target"] for r in runs] == ["sim-async", "sim-sync"]
    for r in runs:
        assert "SIMULATED" in r["label"] and r["search"]["points"]
        # A maximum only from a valid search; otherwise a lower bound and the reason, never a made-up maximum.
        if r["search"]["valid"]:
            assert r["max_slo_rate"] > 0
        else:
            assert r["max_slo_rate"] is None and r["slo_rate_lower_bound"] is not None and r["search"]["reason"]
        assert r["num_requests"] == 40
    assert (tmp_path / "plots" / "attainment_vs_rate.png").is_file()
    assert (tmp_path / "plots" / "ttft_cdf.png").is_file()


def test_async_and_sync_end_to_end_account_for_every_request(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "tiny-deepseek-v3", "--target", "async", "--target", "sync",
                 "--trace", str(MOONCAKE), "--rate", "5", "--length-scale", "0.01", "--min-tokens", "4",
                 "--slo", "30s", "--json", str(out), "--plot", str(tmp_path / "plots"), "--no-progress",
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


# ---- vllm bench serve's flags ----

def test_vllm_spellings_are_aliases_of_the_old_ones():
    new = parse("--num-prompts", "7", "--request-rate", "2.5", "--dataset-path", str(MOONCAKE), "--base-url", "http://h")
    old = parse("--num-requests", "7", "--rate", "2.5", "--trace", str(MOONCAKE), "--url", "http://h")
    for key in ("num_requests", "rate", "dataset_path", "url"):
        assert getattr(new, key) == getattr(old, key), key


def test_random_dataset_is_vllms_uniform_range_sent_all_at_once_by_default():
    w = build_workload(parse("--dataset-name", "random", "--random-input-len", "100", "--random-range-ratio", "0.2",
                             "--num-prompts", "200"), vocab_size=512, max_position=4096)
    reqs = w.build()
    lengths = [r.num_tokens for r in reqs]
    assert len(reqs) == 200 and min(lengths) >= 80 and max(lengths) <= 120 and len(set(lengths)) > 20
    assert {r.arrival for r in reqs} == {0.0}                    # --request-rate inf, vLLM's default
    fixed = build_workload(parse("--dataset-name", "random", "--random-input-len", "64", "--num-prompts", "5",
                                 "--request-rate", "4"), 512, 4096).build()
    assert {r.num_tokens for r in fixed} == {64} and fixed[-1].arrival == pytest.approx(1.0)   # (N-1) / rate


def test_burstiness_is_gamma_arrivals_of_that_shape():
    def gaps(*flags):
        reqs = build_workload(parse("--dataset-name", "random", "--random-input-len", "8", "--num-prompts", "4000",
                                    "--request-rate", "10", *flags), 512, 4096).build()
        g = np.diff([r.arrival for r in reqs])
        return g.std() / g.mean()
    assert gaps() == pytest.approx(1.0, abs=0.1)                               # Poisson
    assert gaps("--burstiness", "0.25") == pytest.approx(2.0, abs=0.25)        # cv = 1 / sqrt(B)


def test_goodput_ttft_is_the_slo_and_must_agree_with_slo():
    from asap.workload.slo import SLO
    w = build_workload(parse("--trace", str(MOONCAKE), "--goodput", "ttft:1500"), 512, 1 << 20)
    assert w.slo == SLO(1.5) and all(r.deadline - r.arrival == pytest.approx(1.5) for r in w.build())
    same = build_workload(parse("--trace", str(MOONCAKE), "--goodput", "ttft:1500", "--slo", "1500ms"), 512, 1 << 20)
    assert same.slo == w.slo
    with pytest.raises(ValueError, match="disagree"):
        build_workload(parse("--trace", str(MOONCAKE), "--goodput", "ttft:1500", "--slo", "2s"), 512, 4096)


def test_bench_slo_is_the_one_syntax_a_sum_of_its_parts():
    w = build_workload(parse("--trace", str(MOONCAKE), "--slo", "2s+1ms/tok", "--num-requests", "4"), 512, 1 << 20)
    assert all(r.deadline - r.arrival == pytest.approx(2.0 + 1e-3 * r.num_tokens) for r in w.build())


def test_sharegpt_prompts_are_the_first_turns_tokenized(tmp_path):
    from asap.model.materialize import resolve_model
    from asap.model.tokenizer import load_tokenizer, write_tokenizer
    model = tmp_path / "m"
    shutil.copytree(resolve_model("tiny-deepseek-v3"), model)
    if write_tokenizer(model, 512) is None:
        pytest.skip("the tokenizers package is not installed")
    data = [{"conversations": [{"from": "human", "value": f"question number {i}?"}, {"from": "gpt", "value": "a"}]}
            for i in range(5)] + [{"conversations": [{"from": "human", "value": "alone"}]}, {"id": "no turns"}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    args = parse("--dataset-name", "sharegpt", "--dataset-path", str(path), "--model", str(model),
                 "--num-prompts", "3", "--request-rate", "2")
    reqs = build_workload(args, 512, 4096).build()
    tok = load_tokenizer(model)
    texts = {tok.decode(r.prompt) for r in reqs}
    assert len(reqs) == 3 and texts <= {f"question number {i}?" for i in range(5)} and len(texts) == 3
    with pytest.raises(ValueError, match="needs --dataset-path"):
        build_workload(parse("--dataset-name", "sharegpt"), 512, 4096)


def test_bad_vllm_flags_are_clear_errors(capsys):
    for argv, text in ((["--dataset-name", "azure"], "needs --dataset-path"),
                       (["--goodput", "ttft"], "--goodput"),
                       (["--metric-percentiles", "150"], "--metric-percentiles"),
                       (["--max-concurrency", "0"], "--max-concurrency"),
                       (["--dataset-name", "random", "--request-rate", "inf", "--burstiness", "2"], "inf"),
                       (["--result-filename", "x.json"], "needs --save-result")):
        assert main(["bench", "--target", "sim-async", "--model", "tiny-deepseek-v3", *argv]) == 2, argv
        assert text in capsys.readouterr().err, argv


def test_save_result_writes_one_vllm_style_file_per_run(tmp_path, capsys):
    assert main(["bench", "--target", "sim-async", "--target", "sim-sync", "--model", "tiny-deepseek-v3",
                 "--dataset-name", "random", "--random-input-len", "32", "--num-prompts", "20", "--request-rate", "5",
                 "--goodput", "ttft:1000", "--save-result", "--result-dir", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2 and all("-5qps-tiny-deepseek-v3-" in f.name for f in files)
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["completed"] + doc["failed"] == doc["num_prompts"] == 20
        assert {"date", "backend", "model_id", "request_rate", "burstiness", "duration", "request_throughput",
                "request_goodput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
                "slo_attainment", "ttft_p90_ms"} <= set(doc)
    assert "median_ttft_ms" in capsys.readouterr().out
