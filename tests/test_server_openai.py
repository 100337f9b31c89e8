"""Promises of `asap serve` (async engine) to the official `openai` client: completions (a string, ids,
a batch, streaming, echo + logprobs, n, temperature with a seed) and chat answer with what the model
computes, in OpenAI's shapes; vLLM's bench payload streams and its first chunk gives the TTFT; every
error body has OpenAI's shape; --api-key guards everything but /health."""
import json
import time

import httpx
import pytest
import torch

import asap
from asap.model.tokenizer import load_tokenizer
from asap.server.process import ServerProcess

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(240)
IDS = [7, 300, 12, 45, 99, 3, 250, 18, 64, 101, 5]
TEXT = "The quick brown fox"


@pytest.fixture(scope="module")
def model_dir(tiny_dirs):
    d = tiny_dirs["tiny-deepseek-v3"]
    if load_tokenizer(d) is None or load_tokenizer(d).chat_template is None:
        pytest.skip("the preset has no tokenizer with a chat template")
    return d


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    args = [str(model_dir), "--engine", "async", "--served-model-name", "tiny", "--attention-workers", "1",
            "--expert-workers", "1"]
    with ServerProcess(args, tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def ref(model_dir):
    """The reference engine's answers: first-token logits and prompt logprobs."""
    tok = load_tokenizer(model_dir)
    with asap.LLM(str(model_dir), engine="reference") as llm:
        def run(ids, k=None):
            return llm.submit(ids, prompt_logprobs=k).result()
        yield tok, run


def test_string_ids_and_batch_prompts_give_the_models_greedy_first_tokens(client, ref):
    tok, run = ref
    text_ids = tok.encode(TEXT)
    r = client.completions.create(model="tiny", prompt=TEXT, max_tokens=1, temperature=0)
    assert r.object == "text_completion" and r.model == "tiny" and r.usage.prompt_tokens == len(text_ids)
    assert r.choices[0].text == tok.decode([run(text_ids).first_token]) and r.choices[0].finish_reason == "length"
    r = client.completions.create(model="tiny", prompt=IDS, max_tokens=1, temperature=0)
    assert r.choices[0].model_extra["token_ids"] == [run(IDS).first_token]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(IDS), 1, len(IDS) + 1)
    batch = [IDS, IDS[:4], [9, 8, 7]]
    r = client.completions.create(model="tiny", prompt=batch, max_tokens=1, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in r.choices] == [[run(p).first_token] for p in batch]
    assert r.usage.prompt_tokens == sum(map(len, batch)) and r.usage.completion_tokens == 3


def test_streaming_sends_one_chunk_per_choice_then_usage(client, ref):
    _, run = ref
    chunks = list(client.completions.create(model="tiny", prompt=[IDS, IDS[:5]], max_tokens=1, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    tokens = {c.choices[0].index: c.choices[0].model_extra["token_ids"] for c in chunks if c.choices}
    assert tokens == {0: [run(IDS).first_token], 1: [run(IDS[:5]).first_token]}
    assert all(c.usage is None for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(IDS) + 5


def test_echo_logprobs_are_the_models_prompt_logprobs(client, ref):
    tok, run = ref
    out = run(IDS, 2)
    r = client.completions.create(model="tiny", prompt=IDS, max_tokens=1, echo=True, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(IDS) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    torch.testing.assert_close(torch.tensor(lp.token_logprobs[1:len(IDS)]), out.prompt_logprobs.token_logprobs,
                               rtol=1e-4, atol=1e-4)
    last = torch.log_softmax(out.logits, -1)
    assert abs(lp.token_logprobs[-1] - float(last.max())) < 1e-4                 # the greedy generated token
    top1 = tok.decode([int(out.prompt_logprobs.top_ids[0, 0])])
    assert abs(lp.top_logprobs[1][top1] - float(out.prompt_logprobs.top_logprobs[0, 0])) < 1e-4
    assert r.choices[0].text == tok.decode(IDS) + tok.decode([out.first_token])
    assert lp.text_offset[1] == len(tok.decode(IDS[:1]))
    zero = client.completions.create(model="tiny", prompt=IDS, max_tokens=0, echo=True, logprobs=0)
    assert len(zero.choices[0].logprobs.tokens) == len(IDS) and zero.usage.completion_tokens == 0


def test_n_samples_and_a_seed_reproduces_them(client):
    kw = dict(model="tiny", prompt=IDS, max_tokens=1, n=8, temperature=1.5, top_p=0.95, seed=1234)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    ids_a = [c.model_extra["token_ids"][0] for c in a.choices]
    assert len(ids_a) == 8 and ids_a == [c.model_extra["token_ids"][0] for c in b.choices]
    assert len(set(ids_a)) > 1                                  # sampled, not greedy: a random preset is flat
    c = client.completions.create(**{**kw, "seed": 99})
    assert [x.model_extra["token_ids"][0] for x in c.choices] != ids_a


def test_chat_uses_the_chat_template(client, ref, model_dir):
    tok, run = ref
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0, logprobs=True,
                                       top_logprobs=2)
    assert r.object == "chat.completion" and r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == tok.decode([run(ids).first_token])
    assert len(r.choices[0].logprobs.content) == 1 and len(r.choices[0].logprobs.content[0].top_logprobs) == 2
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.content == r.choices[0].message.content and chunks[-1].usage.prompt_tokens == len(ids)


def test_vllm_bench_payload_streams_and_the_first_chunk_gives_the_ttft(server):
    """Exactly what `vllm bench serve` (openai-completions backend) posts, timed the way it times TTFT."""
    def metric(name):
        text = httpx.get(server.url + "/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))

    payload = {"model": "tiny", "prompt": [(3 * i) % 500 for i in range(2000)], "temperature": 0.0,
               "max_tokens": 1, "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
               "ignore_eos": True}
    before_sum = metric("asap:time_to_first_token_seconds_sum")
    start, ttft, chunks = time.perf_counter(), None, []
    with httpx.stream("POST", server.url + "/v1/completions", json=payload, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            data = json.loads(line[len("data: "):])
            if data["choices"] and ttft is None:
                ttft = time.perf_counter() - start
            chunks.append(data)
        latency = time.perf_counter() - start
    server_ttft = metric("asap:time_to_first_token_seconds_sum") - before_sum
    assert len(chunks) == 2 and chunks[0]["choices"][0]["token_ids"] and chunks[1]["usage"]["completion_tokens"] == 1
    assert server_ttft <= ttft <= server_ttft + 0.5, (ttft, server_ttft)      # the chunk leaves at the first token
    assert ttft <= latency


def test_every_error_has_openais_shape(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=IDS, max_tokens=16)
    assert e.value.status_code == 400 and "decode runs elsewhere" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=IDS)
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model="tiny", prompt=IDS, best_of=2)
    bad = [("POST", "/v1/completions", b"{"), ("POST", "/v1/completions", b'{"prompt": "\\ud800"}'),
           ("POST", "/v1/chat/completions", b'{"messages": []}'), ("POST", "/tokenize", b'{"prompt": 3}'),
           ("POST", "/detokenize", b'{"tokens": [1e9]}'), ("GET", "/v1/kv/kv-nope", b""),
           ("GET", "/nope", b""), ("DELETE", "/v1/completions", b""), ("GET", "/v1/models/other", b"")]
    for method, path, body in bad:
        r = httpx.request(method, server.url + path, content=body, timeout=30)
        error = r.json()["error"]
        assert 400 <= r.status_code < 500 and error["code"] == r.status_code, (path, r.text)
        assert isinstance(error["message"], str) and error["message"] and "type" in error and "param" in error


def test_api_key_guards_every_endpoint_but_health(model_dir, tmp_path):
    with ServerProcess([str(model_dir), "--engine", "reference", "--api-key", "s3cret"], tmp_path / "s.log") as srv:
        assert httpx.get(srv.url + "/health").status_code == 200
        for method, path in (("GET", "/metrics"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("GET", "/v1/kv/kv-x"), ("POST", "/tokenize"), ("GET", "/version")):
            r = httpx.request(method, srv.url + path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", path
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model=str(model_dir), prompt=IDS, max_tokens=1).usage.prompt_tokens == len(IDS)


def test_a_batchs_short_prompt_streams_before_its_long_one_finishes(model_dir, tmp_path):
    """Prompts of a batch are prefilled concurrently (two replicas here) and each choice's chunk leaves
    the moment its first token exists: the short prompt's chunk does not wait for the long one."""
    args = [str(model_dir), "--engine", "async", "--attention-workers", "2", "--expert-workers", "1"]
    long_prompt = [(7 * i) % 500 for i in range(4000)]
    with ServerProcess(args, tmp_path / "server.log") as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        client.completions.create(model=str(model_dir), prompt=[IDS, IDS], max_tokens=1)          # warm-up
        start, arrivals = time.perf_counter(), []
        for chunk in client.completions.create(model=str(model_dir), prompt=[long_prompt, IDS[:3]], max_tokens=1,
                                               stream=True):
            arrivals.append((chunk.choices[0].index, time.perf_counter() - start))
    assert [i for i, _ in arrivals] == [1, 0], arrivals
    assert arrivals[0][1] < 0.5 * arrivals[1][1], arrivals
