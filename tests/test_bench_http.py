"""Promises of asap.bench.http_target.HttpTarget against a mocked OpenAI-compatible server."""
import json

import httpx

from asap.bench.http_target import HttpTarget
from asap.scheduler.request import Request


def test_posts_token_ids_with_max_tokens_1_and_maps_status_to_failure():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        bodies.append(body)
        if body["prompt"][0] == 0:
            return httpx.Response(503, text="overloaded")
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    target = HttpTarget("http://server:8000/", model="m", label="vllm", progress=False,
                        transport=httpx.MockTransport(handler))
    requests = [Request(0, 3, prompt=[5, 6, 7]), Request(1, 2, arrival=0.01, prompt=[0, 1])]
    results = target.run(requests)
    assert sorted(b["prompt"] for b in bodies) == [[0, 1], [5, 6, 7]]
    assert all(b["model"] == "m" and b["max_tokens"] == 1 for b in bodies)
    assert results[0].ok and results[0].ttft >= 0
    assert results[1].error.startswith("RuntimeError: HTTP 503") and "overloaded" in results[1].error


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
