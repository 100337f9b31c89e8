"""Promises of the request parsers: good bodies parse to what the client asked for; every bad one is a
4xx that says what is wrong (naming the field a prefill cannot honour); no-ops are accepted."""
import json

import pytest

from asap.config import ModelConfig
from asap.model.tokenizer import TextTokenizer, load_tokenizer, write_tokenizer
from asap.server.chat import ChatTemplate
from asap.server.protocol import ApiError
from asap.server.requests import Context, parse_chat, parse_completion
from asap.server.tokens import text_byte_cap

MODEL = "m"
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"


@pytest.fixture(scope="module")
def cfg(tiny_dirs):
    return ModelConfig.from_dir(tiny_dirs["tiny-deepseek-v3"])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    if write_tokenizer(d, 512) is None:
        pytest.skip("the tokenizers package is not installed")
    return load_tokenizer(d)


def ctx(cfg, tokenizer=None, template=None, defaults=None):
    chat = ChatTemplate(TextTokenizer(tokenizer._tok, chat_template=template)) if template else None
    return Context(cfg, tokenizer, MODEL, text_byte_cap(tokenizer, cfg), 8, defaults or {}, chat)


def parse(cfg, body, tokenizer=None, **kw):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_completion(raw, ctx(cfg, tokenizer, **kw))


def test_token_ids_parse_with_prefill_defaults_and_no_ops_accepted(cfg):
    job = parse(cfg, {"prompt": [1, 2, 3], "model": MODEL, "stream": False, "n": 1, "stop": ["x"],
                      "presence_penalty": 1.0, "ignore_eos": True, "user": "u", "min_tokens": 1})
    assert (job.prompts, job.common.max_tokens, job.common.keep_kv, job.echo, job.logprobs) == \
        ([[1, 2, 3]], 1, False, False, None)
    assert job.common.sampling.temperature == 1.0 and not job.common.stream     # vLLM's defaults
    assert parse(cfg, {"prompt": [[4, 5]], "max_tokens": 0}).prompts == [[4, 5]]


def test_batches_sampling_streaming_logprobs_and_kv_transfer(cfg, tok):
    job = parse(cfg, {"prompt": ["hi", [7, 8]], "n": 3, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 1,
                      "stream": True, "stream_options": {"include_usage": True}, "echo": True, "logprobs": 2}, tok)
    assert job.prompts == [[104, 105], [7, 8]] and job.texts == ["hi", None] and job.common.n == 3
    s = job.common.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.5, 0.9, 5, 1)
    assert job.common.stream and job.common.include_usage and job.prompt_logprobs == 2
    assert parse(cfg, {"prompt": [1], "logprobs": 2}).prompt_logprobs is None      # only echoed prompts need them
    assert parse(cfg, {"prompt": [1], "kv_transfer_params": {"do_remote_decode": True}}).common.keep_kv
    assert parse(cfg, {"prompt": [1]}, defaults={"temperature": 0.0}).common.sampling.greedy   # generation_config


def test_chat_renders_the_template_then_tokenises(cfg, tok):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "logprobs": True,
            "top_logprobs": 3, "max_completion_tokens": 1}
    job = parse_chat(json.dumps(body).encode(), ctx(cfg, tok, TEMPLATE))
    assert job.prompts == [list(b"<user>hi<a>")] and job.logprobs == 3 and job.kind == "chat"
    with pytest.raises(ApiError, match="no chat template"):
        parse_chat(json.dumps(body).encode(), ctx(cfg, tok))
    with pytest.raises(ApiError, match="tools"):
        parse_chat(json.dumps({**body, "tools": [{"type": "function"}]}).encode(), ctx(cfg, tok, TEMPLATE))


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    (b"[" * 100_000, 400, "not valid JSON"),
    ([1, 2], 400, "JSON object"),
    ({}, 400, "missing `prompt`"),
    ({"prompt": None}, 400, "missing `prompt`"),
    ({"prompt": []}, 400, "empty prompt"),
    ({"prompt": [1, 512]}, 400, "outside the vocabulary"),
    ({"prompt": [-1]}, 400, "outside the vocabulary"),
    ({"prompt": [2**80]}, 400, "integers"),
    ({"prompt": [1.0, 2]}, 400, "token ids"),
    ({"prompt": [True, 2]}, 400, "token ids"),
    ({"prompt": {"a": 1}}, 400, "token ids"),
    ({"prompt": 7}, 400, "token ids"),
    ({"prompt": [1] * 4097}, 400, "max_position_embeddings"),
    ({"prompt": [[1]] * 9}, 400, "at most 8 per request"),
    ({"prompt": [[1], 2]}, 400, "token ids"),
    ({"prompt": "text"}, 400, "no tokenizer"),
    ({"prompt": [1], "max_tokens": 16}, 400, "decode runs elsewhere"),
    ({"prompt": [1], "max_tokens": -1}, 400, "non-negative integer"),
    ({"prompt": [1], "max_tokens": "1"}, 400, "non-negative integer"),
    ({"prompt": [1], "max_tokens": True}, 400, "non-negative integer"),
    ({"prompt": [1], "stream": "yes"}, 400, "`stream`"),
    ({"prompt": [1], "stream_options": {"include_usage": True}}, 400, "needs `stream: true`"),
    ({"prompt": [1], "n": 0}, 400, "`n` must be"),
    ({"prompt": [1], "logprobs": 21}, 400, "`logprobs` must be"),
    ({"prompt": [1], "temperature": -1}, 400, "`temperature`"),
    ({"prompt": [1], "top_p": 0}, 400, "`top_p`"),
    ({"prompt": [1], "top_k": 1.5}, 400, "`top_k`"),
    ({"prompt": [1], "seed": "s"}, 400, "`seed`"),
    ({"prompt": [1], "logit_bias": [1]}, 400, "`logit_bias`"),
    ({"prompt": [1], "min_tokens": 2}, 400, "min_tokens"),
    ({"prompt": [1], "best_of": 2}, 400, "not supported by a prefill server: best_of"),
    ({"prompt": [1], "suffix": "x", "response_format": {"type": "json_object"}}, 400, "response_format, suffix"),
    ({"prompt": [1], "kv_transfer_params": {"do_remote_prefill": True}}, 400, "prefill side"),
    ({"prompt": [1], "kv_transfer_params": 3}, 400, "must be an object"),
    ({"prompt": [[1], [2]], "kv_transfer_params": {"do_remote_decode": True}}, 400, "single prompt"),
    ({"prompt": [1], "model": 3}, 400, "`model` must be a string"),
    ({"prompt": [1], "model": "other" * 1000}, 404, "not served here"),
])
def test_bad_bodies_are_4xx_with_a_reason(cfg, body, status, words):
    with pytest.raises(ApiError) as e:
        parse(cfg, body)
    assert e.value.status == status and words in e.value.message
    assert e.value.body()["error"]["message"] == e.value.message and len(e.value.message) < 300


@pytest.mark.parametrize("text", ["\ud800", "ok\udfff", "a\ud83d"])
def test_lone_surrogates_are_refused_before_the_tokenizer(cfg, tok, text):
    with pytest.raises(ApiError, match="lone surrogate") as e:
        parse(cfg, {"prompt": text}, tok)
    assert e.value.status == 400


def test_text_over_the_byte_cap_is_refused_without_tokenising(cfg, tok):
    class Counting:
        def __init__(self):
            self.calls, self._tok = 0, tok._tok

        def encode(self, text, add_special_tokens=True):
            self.calls += 1
            return tok.encode(text, add_special_tokens)

    counting = Counting()
    cap = text_byte_cap(counting, cfg)
    longest = max(len(t.encode()) for t in tok._tok.get_vocab(with_added_tokens=True))
    assert cap == cfg.max_position_embeddings * longest          # no longer text can fit in the positions
    with pytest.raises(ApiError, match="bytes of text"):
        parse_completion(json.dumps({"prompt": "x" * (cap + 1)}).encode(), ctx(cfg, counting))
    assert counting.calls == 0
    fits = "x" * cfg.max_position_embeddings                     # one byte per token: exactly fits
    assert parse_completion(json.dumps({"prompt": fits}).encode(), ctx(cfg, counting)).prompts[0] == list(fits.encode())
