"""Promises of issue 27 against a scripted engine (in-process ASGI, no workers): bounded responses, sized
before any work; a client that hangs up cancels the engine's work and is counted `aborted`; sampling
values that would empty the distribution are 400, never a 500; KV URLs never come from the Host header;
the KV hand-off rides on a stream's last chunk; expired KV is swept by a timer; a KV pull that stalls is
abandoned; /health without the key shows only its status; no API docs by default; `bearer` in any case."""
import asyncio
import json
import math
from concurrent.futures import Future
from types import SimpleNamespace

import httpx
import pytest
import torch

from asap.config import ModelConfig
from asap.engine.output import PrefillOutput, PromptLogprobs
from asap.server import responses as R
from asap.server.app import create_app
from asap.server.config import ServerConfig
from asap.server.params import Sampling
from asap.server.sampling import sample
from asap.server.service import PrefillService
from asap.server.streams import SlowClient, Stream

pytestmark = pytest.mark.timeout(120)
KEY = "sekrit"


class InstantLLM:
    """Answers every prompt at once (prompt logprobs too, when asked), or never (hold=True)."""
    engine_name = "instant"

    def __init__(self, cfg, hold=False, logits=None):
        self.cfg, self.engine, self.hold, self.logits, self.futures = cfg, SimpleNamespace(), hold, logits, []

    def healthy(self):
        return True

    def submit(self, ids, prompt_logprobs=None):
        fut = Future()
        self.futures.append(fut)
        if not self.hold:
            logits = self.logits if self.logits is not None else torch.randn(self.cfg.vocab_size)
            plp = None
            if prompt_logprobs is not None:
                t, k = len(ids) - 1, prompt_logprobs
                plp = PromptLogprobs(-torch.rand(t) * 9, torch.randint(0, self.cfg.vocab_size, (t, k)),
                                     -torch.rand(t, k) * 9)
            kv = [{"kv_latent": torch.randn(len(ids), 4), "k_rope": torch.randn(len(ids), 2)}]
            fut.set_result(PrefillOutput(int(logits.argmax()), logits, kv, len(ids), prompt_logprobs=plp))
        return fut


@pytest.fixture(scope="module")
def cfg(tiny_dirs):
    return ModelConfig.from_dir(tiny_dirs["tiny-deepseek-v3"])


def call(app, method, path, body=None, headers=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.request(method, path, content=body if isinstance(body, bytes) else None,
                                        json=None if isinstance(body, bytes) else body, headers=headers)
    return asyncio.run(go())


def metric(app, name: str) -> float:
    text = call(app, "GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


# ---- point 1: bounded responses ---------------------------------------------------------------------

def test_an_answer_over_max_response_mb_is_a_400_naming_the_limit_before_any_work(cfg):
    llm = InstantLLM(cfg)
    app = create_app(llm, ServerConfig(max_response_mb=1), "m")
    r = call(app, "POST", "/v1/completions", {"prompt": list(range(500)) * 8, "echo": True, "logprobs": 20,
                                              "n": 128})
    assert r.status_code == 400 and "--max-response-mb=1" in r.json()["error"]["message"]
    assert llm.futures == []                                 # refused before anything reached the engine


@pytest.mark.parametrize("req", [{"prompt": list(range(300)), "echo": True, "logprobs": 20, "n": 3},
                                 {"prompt": [list(range(50)), list(range(90))], "logprobs": 5, "n": 7},
                                 {"prompt": list(range(200)), "echo": True, "n": 4, "max_tokens": 0}])
def test_the_size_estimate_bounds_the_answer_it_sizes(cfg, req):
    app = create_app(InstantLLM(cfg), ServerConfig(), "m")
    job = app.state.service._parse("completion", json.dumps(req).encode())
    r = call(app, "POST", "/v1/completions", req)
    assert r.status_code == 200 and len(r.content) <= R.estimated_bytes(job)


def test_an_answer_bigger_than_estimated_is_still_refused_once_encoded(cfg, monkeypatch):
    monkeypatch.setattr(R, "estimated_bytes", lambda job: 0)
    app = create_app(InstantLLM(cfg), ServerConfig(max_response_mb=0.01), "m")
    r = call(app, "POST", "/v1/completions", {"prompt": list(range(300)), "echo": True, "logprobs": 20})
    assert r.status_code == 400 and "--max-response-mb=0.01" in r.json()["error"]["message"]


# ---- point 2: a client that hangs up ------------------------------------------------------------------

def _hang_up_after(app, body: dict, seconds: float):
    """Raw ASGI: send the request, then disconnect `seconds` later; the client never reads an answer."""
    async def go():
        sent = asyncio.Event()
        messages = iter([{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}])

        async def receive():
            try:
                return next(messages)
            except StopIteration:
                await asyncio.sleep(seconds)
                return {"type": "http.disconnect"}

        async def send(message):
            sent.set()
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("t", 80), "state": {}}
        await asyncio.wait_for(app(scope, receive, send), 30)
    asyncio.run(go())


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_cancels_the_engines_work_and_is_counted_aborted(cfg, stream):
    llm = InstantLLM(cfg, hold=True)                        # the engine never answers by itself
    app = create_app(llm, ServerConfig(max_pending=2, request_timeout_s=60), "m")
    _hang_up_after(app, {"prompt": [1, 2, 3], "stream": stream}, 0.3)
    assert len(llm.futures) == 1 and llm.futures[0].cancelled()
    assert app.state.service.admission.num_pending == 0     # its slot is free again
    counts = {o: metric(app, f'asap:requests_total{{model_name="m",outcome="{o}"}}') for o in ("aborted", "failed", "ok")}
    assert counts == {"aborted": 1, "failed": 0, "ok": 0}
    assert metric(app, 'asap:request_success_total{finished_reason="abort"') == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_at_once_leaves_no_work_and_is_counted_once(cfg, stream):
    llm = InstantLLM(cfg, hold=True)
    app = create_app(llm, ServerConfig(max_pending=2, request_timeout_s=60), "m")
    for _ in range(5):                  # whichever stage the disconnect lands in: parsing, submitted, streaming
        _hang_up_after(app, {"prompt": [1, 2, 3], "stream": stream}, 0.0)
    assert all(f.cancelled() for f in llm.futures) and app.state.service.admission.num_pending == 0
    assert metric(app, 'asap:requests_total{model_name="m",outcome="aborted"}') == 5


def test_a_stream_dropped_before_its_first_byte_still_cancels_and_counts(cfg):
    llm = InstantLLM(cfg, hold=True)
    app = create_app(llm, ServerConfig(), "m")

    async def go():
        chunks, closed = await app.state.service.handle("completion", b'{"prompt": [1, 2], "stream": true}')
        closed()                        # what streams.Stream calls, even when the stream never started
    asyncio.run(go())
    assert llm.futures[0].cancelled() and app.state.service.admission.num_pending == 0
    assert metric(app, 'asap:requests_total{model_name="m",outcome="aborted"}') == 1


# ---- point 4: sampling values --------------------------------------------------------------------------

@pytest.mark.parametrize("body,param", [
    (b'{"prompt": [1, 2], "top_p": 1e-300}', "top_p"),
    (b'{"prompt": [1, 2], "min_p": 1e-300}', "min_p"),
    (b'{"prompt": [1, 2], "top_p": NaN}', "top_p"),
    (b'{"prompt": [1, 2], "temperature": NaN}', "temperature"),
    (b'{"prompt": [1, 2], "temperature": Infinity}', "temperature"),
    (b'{"prompt": [1, 2], "logit_bias": {"5": NaN}}', "logit_bias"),
    (b'{"prompt": [1, 2], "logit_bias": {"5": -Infinity}}', "logit_bias"),
    (b'{"prompt": [1, 2], "logit_bias": {"5": 1e400}}', "logit_bias"),
])
def test_non_finite_and_underflowing_sampling_values_are_400(cfg, body, param):
    llm = InstantLLM(cfg)
    r = call(create_app(llm, ServerConfig(), "m"), "POST", "/v1/completions", body,
             headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param and llm.futures == []


@pytest.mark.parametrize("logits", [torch.full((512,), float("nan")), torch.full((512,), -float("inf")),
                                    torch.tensor([0.0, float("nan")] * 256)])
def test_sampling_never_raises_whatever_the_logits(logits):
    for params in (Sampling(), Sampling(top_p=2e-38), Sampling(min_p=1.0), Sampling(top_k=1, temperature=50)):
        tokens = sample(logits, params, 4)
        assert len(tokens) == 4 and all(0 <= t < 512 for t in tokens)


def test_the_smallest_accepted_top_p_still_samples(cfg):
    logits = torch.randn(cfg.vocab_size)
    r = call(create_app(InstantLLM(cfg, logits=logits), ServerConfig(), "m"), "POST", "/v1/completions",
             {"prompt": [1, 2], "top_p": 1.2e-38, "n": 3})
    assert r.status_code == 200 and [c["token_ids"] for c in r.json()["choices"]] == [[int(logits.argmax())]] * 3


# ---- points 3, 5, 6: KV hand-off ------------------------------------------------------------------------

def test_kv_url_comes_from_public_url_never_from_the_host_header(cfg):
    app = create_app(InstantLLM(cfg), ServerConfig(public_url="http://prefill.internal:8123"), "m")
    r = call(app, "POST", "/v1/completions", {"prompt": [1, 2, 3], "kv_transfer_params": {"do_remote_decode": True}},
             headers={"Host": "evil.example:6666"})
    kv = r.json()["kv_transfer_params"]
    assert kv["kv_url"].startswith("http://prefill.internal:8123/v1/kv/kv-")
    assert (kv["remote_host"], kv["remote_port"]) == ("prefill.internal", 8123)
    default = create_app(InstantLLM(cfg), ServerConfig(host="10.1.2.3", port=9000), "m")
    kv = call(default, "POST", "/v1/completions", {"prompt": [1, 2], "kv_transfer_params": {"do_remote_decode": True}},
              headers={"Host": "evil.example"}).json()["kv_transfer_params"]
    assert kv["kv_url"].startswith("http://10.1.2.3:9000/v1/kv/")


def test_no_redirect_echoes_the_host_header(cfg):
    app = create_app(InstantLLM(cfg), ServerConfig(), "m")
    for path in ("/health/", "/v1/completions/", "/metrics/"):
        r = call(app, "GET", path, headers={"Host": "evil.example"})
        assert r.status_code == 404 and "evil" not in json.dumps(dict(r.headers)) + r.text


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_hands_off_the_kv_in_its_last_chunk(cfg, include_usage):
    app = create_app(InstantLLM(cfg), ServerConfig(), "m")
    req = {"prompt": [1, 2, 3, 4], "n": 2, "stream": True, "kv_transfer_params": {"do_remote_decode": True}}
    if include_usage:
        req["stream_options"] = {"include_usage": True}
    r = call(app, "POST", "/v1/completions", req)
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [("kv_transfer_params" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    kv = chunks[-1]["kv_transfer_params"]
    assert kv["num_tokens"] == 4 and app.state.service.kv_store.num_stored == 1
    pulled = call(app, "GET", "/v1/kv/" + kv["remote_request_id"])
    assert pulled.status_code == 200 and len(pulled.content) == int(pulled.headers["content-length"])


def test_expired_kv_is_swept_by_the_timer_without_anything_touching_the_store(cfg):
    service = PrefillService(InstantLLM(cfg), ServerConfig(kv_ttl_s=0.1), "m")

    async def go():
        service.kv_store.put({"layers.0.k": torch.zeros(100)}, {})
        sweeper = asyncio.get_running_loop().create_task(service.sweep_kv())
        deadline = asyncio.get_running_loop().time() + 20
        while len(service.kv_store._entries) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)                      # waits only: no put, take or sweep from here
        sweeper.cancel()
    asyncio.run(go())
    assert service.kv_store.num_bytes == 0 and service.kv_store.num_evicted["ttl"] == 1


def test_a_kv_pull_that_stops_reading_is_abandoned_and_its_cache_freed(cfg):
    service = PrefillService(InstantLLM(cfg), ServerConfig(kv_write_timeout_s=0.2), "m")
    handle = service.kv_store.put({"layers.0.k": torch.zeros(1 << 19)}, {})    # 2 MiB: three pieces
    stream = service.claim_kv(handle)
    assert isinstance(stream, Stream) and service.kv_store.num_bytes == 2 << 20   # counted while being read
    got = []

    async def go():
        async def receive():
            await asyncio.sleep(3600)                       # the client never hangs up...

        async def send(message):                            # ...and stops reading after the first piece
            if got:
                await asyncio.sleep(3600)
            got.append(message)
        with pytest.raises(SlowClient):
            await asyncio.wait_for(stream(None, receive, send), 30)
    asyncio.run(go())
    assert got[0]["type"] == "http.response.start" and service.kv_store.num_bytes == 0


# ---- point 8: minor ---------------------------------------------------------------------------------------

def test_health_without_the_key_shows_only_its_status(cfg):
    app = create_app(InstantLLM(cfg), ServerConfig(api_key=KEY), "m")
    assert call(app, "GET", "/health").json() == {"status": "ok"}
    full = call(app, "GET", "/health", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert full["status"] == "ok" and "workers" in full and "pending" in full


def test_the_auth_scheme_is_case_insensitive_and_the_key_is_not(cfg):
    app = create_app(InstantLLM(cfg), ServerConfig(api_key=KEY), "m")
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert call(app, "GET", "/v1/models", headers={"Authorization": f"{scheme} {KEY}"}).status_code == 200
    for header in (f"Bearer {KEY.upper()}", f"Basic {KEY}", KEY, "Bearer"):
        assert call(app, "GET", "/v1/models", headers={"Authorization": header}).status_code == 401


def test_api_docs_are_off_unless_enabled(cfg):
    off = create_app(InstantLLM(cfg), ServerConfig(), "m")
    assert all(call(off, "GET", p).status_code == 404 for p in ("/docs", "/redoc", "/openapi.json"))
    on = create_app(InstantLLM(cfg), ServerConfig(enable_docs=True), "m")
    assert call(on, "GET", "/openapi.json").status_code == 200 and call(on, "GET", "/docs").status_code == 200


def test_bad_public_urls_are_refused_at_start():
    for bad in ("prefill:8000", "ftp://x", "http://"):
        with pytest.raises(ValueError, match="public_url"):
            ServerConfig(public_url=bad)
    assert math.isfinite(ServerConfig().max_response_mb)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_the_answer_encoded_choice_by_choice_is_the_same_json(kind):
    choices = [R.Choice(i, [i + 3], f"t{i} \"quoted\" \ud800", [R.TokenLogprob(5, -0.5, [(5, -0.5), (6, -1.5)])])
               for i in (2, 0, 1)]
    whole = R.body(kind, "id-1", 'model "choices":[]', choices, None, R.usage(3, 3), {"kv_url": "u"})
    assert json.loads(R.encode_body(kind, "id-1", 'model "choices":[]', choices, None, R.usage(3, 3),
                                    {"kv_url": "u"})) == json.loads(json.dumps(whole))
