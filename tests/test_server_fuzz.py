"""Promise: no request body, however malformed, gets a 5xx or takes the server down; every refusal is
a 4xx with an OpenAI-style JSON error, and every stream ends with [DONE]. Unicode edge cases (lone
surrogates, noncharacters, invalid UTF-8, BOMs, huge combining runs) included, on every text field.
(Reference engine: the parsing path is the same for all engines.)"""
import asyncio
import collections
import json
import random
import shutil

import httpx
import pytest

from asap.model.tokenizer import FILE
from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(180)
NUM_BODIES = 1000
VOCAB = 512


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny-dsv3"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], d)
    (d / FILE).unlink(missing_ok=True)          # no tokenizer: string prompts must be refused
    args = [str(d), "--engine", "reference", "--served-model-name", "tiny", "--max-body-kb", "64"]
    with ServerProcess(args, tmp_path_factory.mktemp("log") / "server.log") as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            yield srv, client


def rand_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, VOCAB - 1, VOCAB, 2**31, 2**63, 2**70, -2**70, rng.randrange(-10**6, 10**6)])
    if kind == 3:
        return rng.choice([0.0, 1.5, -2.0, 1e308, float("nan"), float("inf")])
    if kind in (4, 5):
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(12)))
    if kind in (6, 7):
        return [rand_json(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {str(rand_json(rng, 4)): rand_json(rng, depth + 1)
            for _ in range(rng.randrange(5))}


def rand_prompt(rng: random.Random):
    ids = [rng.randrange(VOCAB) for _ in range(rng.choice([0, 1, 3, 17, 64, 4097]))]
    mutation = rng.randrange(6)
    if ids and mutation == 1:
        ids[rng.randrange(len(ids))] = rand_json(rng)
    elif ids and mutation == 2:
        ids[rng.randrange(len(ids))] = rng.choice([-1, VOCAB, 2**64, 1.0, True, "3", None])
    elif mutation == 3:
        return rng.choice([[ids], [ids, ids], "some text", ["text"], {"ids": ids}, rand_json(rng)])
    return ids


def rand_body(rng: random.Random) -> bytes:
    kind = rng.randrange(10)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 1:
        return json.dumps(rand_json(rng)).encode()
    if kind == 2:
        return b"[" * rng.choice([10, 1000, 50_000]) + b"]" * rng.randrange(3)
    body = {"prompt": rand_prompt(rng)}
    for field in ("max_tokens", "model", "stream", "n", "return_kv", "temperature", "echo", "logprobs", "top_p",
                  "top_k", "seed", "stream_options", "kv_transfer_params", "logit_bias", "best_of", "stop"):
        if rng.random() < 0.07:
            body[field] = rng.choice([rand_json(rng), 0, 1, 2, "tiny", True, False, {"include_usage": True},
                                      {"do_remote_decode": True}, {"5": 3.0}])
    raw = json.dumps(body).encode()
    if kind == 3:
        raw = raw[:rng.randrange(len(raw) + 1)]        # truncated
    return raw


def test_random_bodies_never_get_a_5xx_and_the_server_survives(server):
    srv, client = server
    rng = random.Random(1234)
    cases = [(rand_body(rng), rng.choice(["application/json", "text/plain", "application/octet-stream"]))
             for _ in range(NUM_BODIES)]
    responses = asyncio.run(post_all(srv.url, cases, concurrency=16))   # concurrent: fast on a busy machine
    statuses = collections.Counter(status for status, _ in responses)
    for (body, _), (status, payload) in zip(cases, responses):
        assert status < 500, (body[:200], payload)
        if status == 200:
            assert all(t in range(VOCAB) for c in payload["choices"] for t in c["token_ids"])
        else:
            error = payload["error"]
            assert isinstance(error["message"], str) and error["message"] and error["code"] == status
    assert statuses.total() == NUM_BODIES and statuses[200] > 50 and statuses[400] > 500
    assert srv.proc.poll() is None and client.get("/health").status_code == 200
    assert client.post("/v1/completions", json={"prompt": [1, 2, 3]}).status_code == 200


async def post_all(url, cases, concurrency):
    limit = asyncio.Semaphore(concurrency)

    async def post(client, body, content_type):
        async with limit:
            r = await client.post("/v1/completions", content=body, headers={"content-type": content_type})
            return r.status_code, parse(r)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(*(post(client, body, ct) for body, ct in cases))


def test_string_prompt_without_a_tokenizer_and_oversized_bodies_are_4xx(server):
    _, client = server
    r = client.post("/v1/completions", json={"prompt": "hello"})
    assert r.status_code == 400 and "no tokenizer" in r.json()["error"]["message"]
    r = client.post("/v1/completions", content=b"[" + b"1," * 40_000 + b"1]")
    assert r.status_code == 413
    assert client.get("/v1/kv/kv-does-not-exist").status_code == 404
    assert client.get("/no/such/route").json()["error"]["code"] == 404


def parse(r: httpx.Response) -> dict:
    """A JSON body, or a stream's chunks merged into one body (an error event stays an error)."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return r.json()
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", r.text[-200:]
    chunks = [json.loads(e) for e in events[:-1]]
    errors = [c for c in chunks if "error" in c]
    if errors:
        return {"error": {**errors[0]["error"], "code": 200}}
    return {"choices": [c for chunk in chunks for c in chunk["choices"]]}


UNICODE = ['"\\ud800"', '"\\udfff"', '"ok\\ud83d"', '"\\ud83d\\ude00"', '"\\udc00\\ud800"', '"\\u0000"',
           '"\\ufeffbom"', '"\\uffff\\ufffe"', '"\\U0010FFFF"', '"\\uZZZZ"', '"\\x41"', '"tab\\ttab"',
           '"\\u202eevil"', '"\U0001F468\u200d\U0001F469\u200d\U0001F467"', '"' + "e\u0301" * 3000 + '"',
           '"' + "\U0001F600" * 20000 + '"', '"\u4e2d\u6587"', '"\U0010ffff"']
RAW = [b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"', b'"\xff"', b'"\x00"', b'"a\x80b"']


def unicode_bodies() -> list[tuple[str, bytes]]:
    values = [u.encode("utf-8", "surrogatepass") for u in UNICODE] + RAW
    out = []
    for v in values:
        out += [("/v1/completions", b'{"prompt": ' + v + b'}'),
                ("/v1/completions", b'{"prompt": [' + v + b'], "echo": true, "logprobs": 1}'),
                ("/v1/completions", b'{"prompt": [1, 2], "model": ' + v + b'}'),
                ("/v1/completions", b'{"prompt": [1, 2], "stop": [' + v + b'], "user": ' + v + b'}'),
                ("/v1/completions", b'{"prompt": ' + v + b', "stream": true}'),
                ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ' + v + b'}]}'),
                ("/v1/chat/completions", b'{"messages": [{"role": ' + v + b', "content": "x"}], "stream": true}'),
                ("/tokenize", b'{"prompt": ' + v + b'}'),
                ("/detokenize", b'{"tokens": [' + v + b']}')]
    out += [("/v1/completions", b'\xef\xbb\xbf{"prompt": [1]}'), ("/v1/completions", b'\xff\xfe{\x00}\x00')]
    return out


@pytest.fixture(scope="module")
def text_server(tiny_dirs, tmp_path_factory):
    args = [str(tiny_dirs["tiny-deepseek-v3"]), "--engine", "reference", "--max-body-kb", "256"]
    with ServerProcess(args, tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


def test_unicode_edge_cases_never_get_a_5xx(text_server):
    cases = unicode_bodies()

    async def run():
        async with httpx.AsyncClient(base_url=text_server.url, timeout=60) as client:
            return [await client.post(path, content=body, headers={"content-type": "application/json"})
                    for path, body in cases]

    responses = asyncio.run(run())
    for (path, body), r in zip(cases, responses):
        assert r.status_code < 500, (path, body[:80], r.text[:300])
        payload = parse(r)
        if "error" in payload:
            assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]
    lone = [r for (path, body), r in zip(cases, responses)
            if path == "/v1/completions" and body == b'{"prompt": "\\ud800"}']
    assert lone[0].status_code == 400 and "lone surrogate" in lone[0].json()["error"]["message"]
    assert httpx.get(text_server.url + "/health").status_code == 200
