"""Promise: no request body, however malformed, gets a 5xx or takes the server down; every refusal is
a 4xx with an OpenAI-style JSON error. (Reference engine: the parsing path is the same for all engines.)"""
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
    for field in ("max_tokens", "model", "stream", "n", "return_kv", "temperature"):
        if rng.random() < 0.3:
            body[field] = rng.choice([rand_json(rng), 0, 1, 2, "tiny", True, False])
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
            assert payload["choices"][0]["token_ids"][0] in range(VOCAB)
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
            return r.status_code, r.json()

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
