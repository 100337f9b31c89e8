"""Promises of issue 27 end to end (tiny-deepseek-v3, async engine 1+1, real HTTP): a cancelled request
is dropped by its replica before its chunks are scheduled; clients that hang up free their slots and are
counted `aborted`; /health answers while a big answer is built; a streamed KV hand-off pulls with the
official client's chunks; asap.kv.pull sends the API key only to the server it is told to trust.
No timing is asserted beyond generous bounds (the test machine may be loaded)."""
import asyncio
import http.server
import threading
import time

import httpx
import pytest

import asap
import asap.kv
from asap.server.process import ServerProcess
from asap.workers.messages import Started

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(300)
KEY = "k-27"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = [(7 * i) % 500 for i in range(4000)]


@pytest.mark.parametrize("engine,layout", [("async", {"attention_workers": 1, "expert_workers": 1}),
                                           ("sync", {"devices": 1})])
def test_a_cancelled_request_never_gets_a_chunk_scheduled(engine, layout):
    with asap.LLM("tiny-deepseek-v3", engine=engine, token_budget=64, **layout) as llm:
        started, handle = [], llm.engine._handle

        def spy(msg):                       # every message the engine gets from its workers passes here
            if isinstance(msg, Started):
                started.append(msg.request_id)
            handle(msg)
        llm.engine._handle = spy
        first = llm.submit(LONG[:2048])     # 32 steps at 64 tokens: the rest wait behind it (FCFS), long enough
                                            # for the cancels below to reach the replica first on a loaded machine
        rest = [llm.submit(LONG[:512]) for _ in range(6)]
        assert all(f.cancel() for f in rest)
        first.result(timeout=120)
        assert llm.submit([1, 2, 3]).result(timeout=120).first_token >= 0     # the engine is free again
        time.sleep(0.5)                     # any Started for a cancelled request would have come by now
        assert len(started) == 2 and llm.engine.num_aborted == 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["tiny-deepseek-v3", "--engine", "async", "--attention-workers", "1", "--expert-workers", "1",
            "--api-key", KEY, "--max-pending", "64"]
    with ServerProcess(args, tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def _metric(srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers=AUTH, timeout=30).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


def test_clients_that_hang_up_free_their_slots_and_are_counted_aborted(server):
    aborted, ok = ('asap:requests_total{model_name="tiny-deepseek-v3",outcome="%s"}' % o for o in ("aborted", "ok"))
    before = _metric(server, aborted), _metric(server, ok)

    async def hang_up(stream: bool):
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            try:
                await client.post("/v1/completions", json={"prompt": LONG, "stream": stream}, timeout=0.3)
            except httpx.TimeoutException:
                pass                        # the client gives up and closes its connection

    async def go():
        await asyncio.gather(*(hang_up(stream=i % 2 == 1) for i in range(12)))
    asyncio.run(go())
    end = time.monotonic() + 120
    while (pending := httpx.get(server.url + "/health", headers=AUTH, timeout=30).json()["pending"]) and \
            time.monotonic() < end:
        time.sleep(0.2)
    assert pending == 0
    after = _metric(server, aborted), _metric(server, ok)
    # every hang-up is accounted for: aborted, or ok where a quiet machine answered it within the 0.3 s
    num_aborted, num_ok = after[0] - before[0], after[1] - before[1]
    assert num_aborted + num_ok == 12 and num_aborted >= 6
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2, 3]}, headers=AUTH, timeout=120)
    assert r.status_code == 200


def test_health_answers_while_a_big_answer_is_built(server):
    req = {"prompt": LONG[:2000], "echo": True, "logprobs": 20, "n": 16}    # about 10 MB of JSON
    latencies, result = [], {}

    def big():
        t0 = time.monotonic()
        result["r"] = httpx.post(server.url + "/v1/completions", json=req, headers=AUTH, timeout=240)
        result["s"] = time.monotonic() - t0
    thread = threading.Thread(target=big)
    thread.start()
    while thread.is_alive():
        t0 = time.monotonic()
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        latencies.append(time.monotonic() - t0)
        time.sleep(0.05)
    thread.join()
    print(f"{len(result['r'].content) / 2**20:.1f} MB answer in {result['s']:.1f}s; /health max {max(latencies):.3f}s "
          f"over {len(latencies)} probes")
    assert result["r"].status_code == 200 and len(result["r"].content) > 4 << 20
    assert len(latencies) >= 3 and max(latencies) < max(1.0, result["s"] / 3), (max(latencies), result["s"])


def test_a_streamed_kv_hand_off_is_in_the_official_clients_last_chunk_and_pulls(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
    chunks = list(client.completions.create(model="tiny-deepseek-v3", prompt=[5, 6, 7, 8, 9], max_tokens=1,
                                            stream=True, extra_body={"kv_transfer_params": {"do_remote_decode": True}}))
    params = (chunks[-1].model_extra or {}).get("kv_transfer_params")
    assert params and not any((c.model_extra or {}).get("kv_transfer_params") for c in chunks[:-1])
    kv = asap.kv.pull(params, base_url=server.url, api_key=KEY)
    assert kv.num_tokens == 5 and len(kv.layers) == 3


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):
        _Recorder.seen.append(dict(self.headers))
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_kv_pull_sends_the_key_only_to_the_server_it_was_told_to_trust(server, monkeypatch):
    other = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        forged = {"kv_url": f"http://127.0.0.1:{other.server_port}/v1/kv/kv-abc", "remote_request_id": "kv-abc"}
        monkeypatch.setenv("ASAP_API_KEY", KEY)
        with pytest.raises(RuntimeError, match="404"):
            asap.kv.pull(forged)                        # the URL from the response: fetched without the key
        with pytest.raises(ValueError, match="base_url"):
            asap.kv.pull(forged, api_key=KEY)           # a key for an origin nobody named: refused outright
        assert _Recorder.seen and not any("Authorization" in h or "authorization" in h for h in _Recorder.seen)
        with pytest.raises(RuntimeError, match="404"):  # with base_url the key goes there, and only there
            asap.kv.pull(forged, base_url=server.url)
        assert len(_Recorder.seen) == 1
        with pytest.raises(ValueError, match="not a KV handle"):
            asap.kv.pull({"remote_request_id": "../v1/completions"}, base_url=server.url)
    finally:
        other.shutdown()
