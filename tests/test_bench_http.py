"""Promises of asap.bench.http_target.HttpTarget against mocked OpenAI-compatible servers: it sends what
`vllm bench serve` sends, takes TTFT at the first streamed chunk, and keeps every failure's reason."""
import asyncio
import json

import httpx
import pytest

from asap.bench.http_target import HttpTarget
from asap.scheduler.request import Request


def sse(*chunks, done=True) -> bytes:
    events = [f"data: {json.dumps(c)}\n\n" for c in chunks] + (["data: [DONE]\n\n"] if done else [])
    return "".join(events).encode()


CHOICE = {"choices": [{"index": 0, "text": "", "finish_reason": None}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def test_streams_token_ids_as_vllm_bench_does_and_maps_status_to_failure():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        bodies.append(body)
        if body["prompt"][0] == 0:
            return httpx.Response(503, json={"error": {"message": "overloaded", "type": "server_error"}})
        return httpx.Response(200, content=sse(CHOICE, USAGE), headers={"content-type": "text/event-stream"})

    target = HttpTarget("http://server:8000/", model="m", label="vllm", progress=False, ignore_eos=True,
                        transport=httpx.MockTransport(handler))
    requests = [Request(0, 3, prompt=[5, 6, 7]), Request(1, 2, arrival=0.01, prompt=[0, 1])]
    results = target.run(requests)
    assert sorted(b["prompt"] for b in bodies) == [[0, 1], [5, 6, 7]]
    for b in bodies:
        assert b == {"model": "m", "prompt": b["prompt"], "max_tokens": 1, "stream": True,
                     "stream_options": {"include_usage": True}, "ignore_eos": True}
    assert results[0].ok and 0 <= results[0].ttft <= results[0].e2el and results[0].output_tokens == 1
    assert results[1].error == "RuntimeError: HTTP 503: overloaded"


def test_ttft_is_the_first_chunk_not_the_end_of_the_stream():
    async def body():
        yield sse(CHOICE, done=False)
        await asyncio.sleep(0.4)                 # the rest of the response comes much later
        yield sse(USAGE)

    def handler(request):
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    [r] = HttpTarget("http://h", "m", progress=False, transport=httpx.MockTransport(handler)).run(
        [Request(0, 3, prompt=[1, 2, 3])])
    assert r.ok and r.ttft < 0.2 and r.e2el >= 0.4


@pytest.mark.parametrize("content, reason", [
    (sse({"error": {"message": "worker died", "type": "server_error"}}), "error in stream: worker died"),
    (sse(USAGE), "without any chunk carrying choices"),
    (b"data: {not json\n\n", "malformed SSE chunk"),
])
def test_stream_failures_keep_their_reason(content, reason):
    [r] = HttpTarget("http://h", "m", progress=False,
                     transport=httpx.MockTransport(lambda q: httpx.Response(200, content=content))).run(
        [Request(0, 1, prompt=[1])])
    assert not r.ok and reason in r.error


def test_non_streaming_mode_posts_plain_requests():
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    [r] = HttpTarget("http://h", "m", progress=False, stream=False, transport=httpx.MockTransport(handler)).run(
        [Request(0, 1, prompt=[1])])
    assert r.ok and seen[0]["stream"] is False and "stream_options" not in seen[0]


def test_max_concurrency_bounds_requests_in_flight():
    live, peak = [0], [0]

    async def body():
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        await asyncio.sleep(0.05)
        live[0] -= 1
        yield sse(CHOICE, USAGE)

    target = HttpTarget("http://h", "m", progress=False, max_concurrency=2, transport=httpx.MockTransport(
        lambda q: httpx.Response(200, content=body())))
    results = target.run([Request(i, 1, prompt=[1]) for i in range(6)])      # all arrive at 0
    assert all(r.ok for r in results) and peak[0] == 2


def test_requests_without_prompt_fail_clearly_and_full_url_is_kept():
    target = HttpTarget("http://h/v1/completions", "m", progress=False,
                        transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    assert target.url == "http://h/v1/completions"
    [result] = target.run([Request(0, 4)])
    assert "with_prompts=True" in result.error


def test_connection_errors_are_failures():
    def handler(request):
        raise httpx.ConnectError("refused")

    [result] = HttpTarget("http://h", "m", progress=False, transport=httpx.MockTransport(handler)).run(
        [Request(0, 1, prompt=[1])])
    assert result.error == "ConnectError: refused" and result.ttft is None


def models(card: dict, tokens=None):
    """A mock server: /v1/models lists `card`; /tokenize answers `tokens` (None: 400, no tokenizer)."""
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [card]})
        if request.url.path == "/tokenize" and tokens is not None:
            return httpx.Response(200, json={"count": len(tokens), "max_model_len": 64, "tokens": tokens})
        return httpx.Response(400, json={"error": {"message": "this model has no tokenizer"}})
    return httpx.MockTransport(handler)


def test_the_served_model_is_found_here_when_it_is_a_preset_of_the_same_context_length():
    from asap.bench.served_model import discover
    from asap.bench.targets import model_config
    cfg = model_config("tiny-deepseek-v3")
    m = discover("http://h:8000/v1/completions", transport=models(
        {"id": "tiny-deepseek-v3", "root": "tiny-deepseek-v3", "max_model_len": cfg.max_position_embeddings}))
    assert (m.name, m.local, m.vocab_size, m.max_position) == ("tiny-deepseek-v3", "tiny-deepseek-v3",
                                                               cfg.vocab_size, cfg.max_position_embeddings)


def test_an_unknown_served_model_uses_the_servers_tokenizer_or_asks_for_model():
    from asap.bench.served_model import discover
    card = {"id": "my-llm", "root": "my-llm", "max_model_len": 64}
    m = discover("http://h", transport=models(card, tokens=[1, 300, 17]))
    assert (m.name, m.local, m.vocab_size, m.max_position) == ("my-llm", None, 301, 64)
    with pytest.raises(ValueError, match="pass --model"):
        discover("http://h", transport=models(card))                      # no tokenizer: nothing to build on
    # a preset name whose context length differs from the server's is not taken for the server's model
    with pytest.raises(ValueError, match="pass --model"):
        discover("http://h", transport=models({"id": "tiny-deepseek-v3", "max_model_len": 7}))
    with pytest.raises(ValueError, match="no OpenAI model list"):
        discover("http://h", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"data": []})))


def test_random_output_len_is_the_max_tokens_sent():
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=sse(CHOICE, USAGE))

    HttpTarget("http://h", "m", progress=False, max_tokens=0, transport=httpx.MockTransport(handler)).run(
        [Request(0, 1, prompt=[1])])
    assert seen[0]["max_tokens"] == 0
