"""Promises of `asap serve` (async engine) over real HTTP: OpenAI shapes, the first token and KV the
model computes, KV hand-off once (only when asked), health, models and Prometheus metrics."""
import json
import shutil
import struct
import time

import httpx
import pytest
import torch
from safetensors.torch import load

import asap
from asap.model.tokenizer import load_tokenizer, write_tokenizer
from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(180)
PROMPT = [7, 300, 12, 45, 99, 3, 250, 18, 64, 101, 5]


@pytest.fixture(scope="module")
def model_dir(tiny_dirs, tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny-dsv3"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], d)
    if write_tokenizer(d, 512) is None:
        pytest.skip("the tokenizers package is not installed")
    return d


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    args = [str(model_dir), "--engine", "async", "--served-model-name", "tiny", "--attention-workers", "1",
            "--expert-workers", "1", "--kv-ttl-s", "60"]
    with ServerProcess(args, tmp_path_factory.mktemp("log") / "server.log") as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            yield client


@pytest.fixture(scope="module")
def reference(model_dir):
    with asap.LLM(str(model_dir), engine="reference") as llm:
        yield llm.prefill([PROMPT])[0]


def test_completion_carries_the_models_first_token_and_usage(server, reference):
    r = server.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    assert choice["token_ids"] == [reference.first_token] and choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 1, "total_tokens": len(PROMPT) + 1}
    zero = server.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0}).json()  # prefill, no token
    assert zero["choices"][0]["token_ids"] == [] and zero["usage"]["completion_tokens"] == 0


def test_kv_handle_streams_the_models_cache_once(server, reference):
    kv = server.post("/v1/completions", json={"prompt": PROMPT, "kv_transfer_params": {"do_remote_decode": True}}
                     ).json()["kv_transfer_params"]
    assert kv["kv_format"] == "safetensors" and kv["kv_url"].endswith(f"/v1/kv/{kv['remote_request_id']}")
    r = server.get(kv["kv_url"])
    assert r.status_code == 200 and len(r.content) >= kv["num_bytes"]
    tensors = load(r.content)
    assert sorted(tensors) == sorted(f"layers.{i}.{n}" for i in range(3) for n in ("kv_latent", "k_rope"))
    for i, layer in enumerate(reference.kv):
        for name, t in layer.items():
            torch.testing.assert_close(tensors[f"layers.{i}.{name}"], t, rtol=1e-4, atol=1e-5)
    header_len = struct.unpack("<Q", r.content[:8])[0]
    meta = json.loads(r.content[8:8 + header_len])["__metadata__"]
    assert meta["layout"] == "mla" and meta["num_tokens"] == str(len(PROMPT)) and meta["num_layers"] == "3"
    again = server.get(kv["kv_url"])
    assert again.status_code == 404 and "already claimed" in again.json()["error"]["message"]
    assert kv["remote_request_id"] not in again.text                      # a handle is never echoed back


def test_string_prompts_are_tokenized_and_the_token_decoded(server, model_dir):
    body = server.post("/v1/completions", json={"prompt": "héllo"}).json()
    assert body["usage"]["prompt_tokens"] == len("héllo".encode()) and body["kv_transfer_params"] is None
    [choice] = body["choices"]
    assert choice["text"] == load_tokenizer(model_dir).decode(choice["token_ids"])


def test_sync_engine_serves_the_same_first_token(model_dir, reference, tmp_path):
    args = [str(model_dir), "--engine", "sync", "--devices", "2"]
    with ServerProcess(args, tmp_path / "server.log") as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": PROMPT, "temperature": 0}, timeout=60)
        assert httpx.get(srv.url + "/health").json()["engine"] == "sync"
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [reference.first_token]


def test_decode_requests_are_refused_with_a_reason(server):
    r = server.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 16})
    assert r.status_code == 400 and "decode runs elsewhere" in r.json()["error"]["message"]
    assert server.post("/v1/completions", json={"prompt": PROMPT, "model": "gpt-4"}).status_code == 404


def test_health_and_models(server):
    health = server.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert set(health.json()["workers"]) == {"attention0", "expert0"}
    assert all(w["alive"] and w["pid"] > 0 for w in health.json()["workers"].values())
    models = server.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert server.get("/v1/models/tiny").json()["id"] == "tiny"
    assert server.get("/v1/models/other").json()["error"]["code"] == 404
    assert server.get("/version").json()["version"] == asap.__version__


def test_metrics_count_outcomes_and_report_workers(server):
    def sample(text, name):
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))

    m = '{model_name="tiny"'
    before = server.get("/metrics").text
    server.post("/v1/completions", json={"prompt": PROMPT})
    server.post("/v1/completions", content=b"nope")
    after = server.get("/metrics").text
    end = time.monotonic() + 10
    while 'worker="expert0"' not in after and time.monotonic() < end:      # workers flush their spans periodically
        time.sleep(0.2)
        after = server.get("/metrics").text
    for name, delta in ((f'asap:requests_total{m},outcome="ok"}}', 1), (f'asap:requests_total{m},outcome="invalid"}}', 1),
                        (f'asap:request_success_total{{finished_reason="length",model_name="tiny"}}', 1),
                        (f"asap:prompt_tokens_total{m}}}", len(PROMPT)),
                        (f"asap:time_to_first_token_seconds_count{m}}}", 1),
                        (f"asap:e2e_request_latency_seconds_count{m}}}", 1),
                        (f"asap:request_queue_time_seconds_count{m}}}", 1)):
        assert sample(after, name) == sample(before, name) + delta, name
    for name in (f"asap:num_requests_running{m}}} 0.0", f"asap:num_requests_waiting{m}}} 0.0",
                 f"asap:healthy{m}}} 1.0", f'asap:worker_busy_fraction{m},worker="expert0"}}',
                 f'asap:worker_stall_fraction{m},worker="attention0"}}', f"asap:kv_store_bytes{m}}}"):
        assert name in after, name


def test_grafana_dashboard_only_uses_metrics_the_server_exports(server):
    import re
    from pathlib import Path

    import asap.server
    dashboard = json.loads((Path(asap.server.__file__).parent / "grafana.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"asap:[a-z0-9_]+", e)}
    exported = set(re.findall(r"^(asap:[a-z0-9_]+?)(?:_bucket|_sum|_count)?[{ ]", server.get("/metrics").text, re.M))
    assert len(used) >= 12 and used <= exported, used - exported
