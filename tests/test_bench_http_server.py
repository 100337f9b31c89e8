"""`asap bench --target http` against a real `asap serve`: vLLM's flags, streaming TTFT, vLLM's result keys in
the saved JSON, a wrong served model name reported with its reason and a non-zero exit (not a silent 0/N),
and without --model the server's own model (vLLM's rule)."""
import json
import shutil

import pytest

from asap.cli import main
from asap.model.tokenizer import write_tokenizer
from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server_url(tiny_dirs, tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny-dsv3"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], d)
    write_tokenizer(d, 512)
    args = [str(d), "--engine", "reference", "--served-model-name", "served-tiny"]
    with ServerProcess(args, tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv.url, d


def test_vllm_flags_stream_and_save_vllm_keys(server_url, tmp_path, capsys):
    url, model_dir = server_url
    argv = ["bench", "--target", "http", "--base-url", url, "--served-model-name", "served-tiny",
            "--model", str(model_dir), "--dataset-name", "random", "--random-input-len", "24",
            "--random-range-ratio", "0.5", "--num-prompts", "8", "--request-rate", "40", "--burstiness", "2",
            "--max-concurrency", "4", "--goodput", "ttft:30000", "--percentile-metrics", "ttft,e2el",
            "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(tmp_path),
            "--result-filename", "r.json", "--no-progress"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["completed"] == 8 and doc["failed"] == 0 and doc["num_prompts"] == 8
    assert doc["request_rate"] == 40 and doc["burstiness"] == 2 and doc["max_concurrency"] == 4
    assert doc["served_model_name"] == "served-tiny"
    assert doc["total_input_tokens"] == sum(doc["input_lens"]) and all(12 <= n <= 36 for n in doc["input_lens"])
    assert doc["request_goodput"] == pytest.approx(8 / doc["duration"]) and doc["slo_attainment"] == 1.0
    for m in ("ttft", "e2el"):
        for k in ("mean", "median", "std", "p50", "p90", "p99"):
            assert doc[f"{k}_{m}_ms"] is not None, (k, m)
    assert 0 < doc["mean_ttft_ms"] <= doc["mean_e2el_ms"]
    assert "completed" in capsys.readouterr().out


def test_a_wrong_served_model_name_fails_with_its_reason(server_url, tmp_path, capsys):
    url, model_dir = server_url
    out = tmp_path / "all.json"
    assert main(["bench", "--target", "http", "--base-url", url, "--model", str(model_dir),
                 "--dataset-name", "random", "--random-input-len", "8", "--num-prompts", "3",
                 "--json", str(out), "--no-progress"]) == 1                   # failed requests: non-zero exit
    err = capsys.readouterr().err
    [run] = json.loads(out.read_text())["runs"]
    assert run["completed"] == 0 and run["failed"] == 3
    assert "HTTP 404" in err and "served-tiny" in err and "(3x)" in err, err
    assert "3 of 3 requests failed" in err


def test_without_model_the_model_and_token_ids_come_from_the_server(server_url, tmp_path, capsys):
    url, _ = server_url
    host, port = url.removeprefix("http://").rsplit(":", 1)
    out = tmp_path / "all.json"
    assert main(["bench", "--target", "http", "--backend", "vllm", "--host", host, "--port", port,
                 "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "0",
                 "--num-prompts", "4", "--json", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    [run] = json.loads(out.read_text())["runs"]
    assert run["completed"] == 4 and run["failed"] == 0
    # served under a name that is no preset or directory here: its /tokenize bounds the ids
    assert "served-tiny" in captured.err and "/tokenize" in captured.err


def test_sharegpt_text_is_tokenized_by_the_server_when_no_model_is_given(server_url, tmp_path, capsys):
    url, _ = server_url
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"tell me about prefill number {i}, "
                                                                                   "please, in a few words"},
                                                   {"from": "gpt", "value": "ok"}]} for i in range(3)]))
    out = tmp_path / "all.json"
    assert main(["bench", "--target", "http", "--base-url", url, "--dataset-name", "sharegpt", "--dataset-path",
                 str(data), "--num-prompts", "3", "--json", str(out), "--no-progress"]) == 0
    [run] = json.loads(out.read_text())["runs"]
    assert run["completed"] == 3 and run["failed"] == 0 and run["total_input_tokens"] >= 3 * 4
