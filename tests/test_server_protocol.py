"""Promises of the /v1/completions parser: good bodies parse, every bad one is a 4xx saying what is wrong."""
import json

import pytest

from asap.config import ModelConfig
from asap.model.tokenizer import load_tokenizer, write_tokenizer
from asap.server.protocol import ApiError, completion_body, parse_completion

MODEL = "m"


@pytest.fixture(scope="module")
def cfg(tiny_dirs):
    return ModelConfig.from_dir(tiny_dirs["tiny-deepseek-v3"])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    if write_tokenizer(d, 512) is None:
        pytest.skip("the tokenizers package is not installed")
    return load_tokenizer(d)


def parse(cfg, body, tokenizer=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_completion(raw, cfg, tokenizer, MODEL)


def test_token_ids_parse_with_prefill_only_defaults(cfg):
    req = parse(cfg, {"prompt": [1, 2, 3], "model": MODEL, "stream": False, "n": 1, "temperature": 0.7})
    assert (req.prompt_ids, req.max_tokens, req.return_kv) == ([1, 2, 3], 1, True)
    assert parse(cfg, {"prompt": [[4, 5]], "max_tokens": 0, "return_kv": False}).prompt_ids == [4, 5]


def test_string_prompts_use_the_tokenizer(cfg, tok):
    assert parse(cfg, {"prompt": "héllo"}, tok).prompt_ids == list("héllo".encode())
    assert parse(cfg, {"prompt": ["hi"]}, tok).prompt_ids == [104, 105]


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
    ({"prompt": [1.0, 2]}, 400, "integer token ids"),
    ({"prompt": [True, 2]}, 400, "integer token ids"),
    ({"prompt": {"a": 1}}, 400, "integer token ids"),
    ({"prompt": 7}, 400, "integer token ids"),
    ({"prompt": [1] * 4097}, 400, "max_position_embeddings"),
    ({"prompt": [[1], [2]]}, 400, "one prompt per request"),
    ({"prompt": "text"}, 400, "no tokenizer"),
    ({"prompt": [1], "max_tokens": 16}, 400, "decode runs elsewhere"),
    ({"prompt": [1], "max_tokens": -1}, 400, "non-negative integer"),
    ({"prompt": [1], "max_tokens": "1"}, 400, "non-negative integer"),
    ({"prompt": [1], "max_tokens": True}, 400, "non-negative integer"),
    ({"prompt": [1], "stream": True}, 400, "streaming"),
    ({"prompt": [1], "n": 2}, 400, "`n` must be 1"),
    ({"prompt": [1], "return_kv": "yes"}, 400, "return_kv"),
    ({"prompt": [1], "model": 3}, 400, "`model` must be a string"),
    ({"prompt": [1], "model": "other"}, 404, "not served here"),
])
def test_bad_bodies_are_4xx_with_a_reason(cfg, body, status, words):
    with pytest.raises(ApiError) as e:
        parse(cfg, body)
    assert e.value.status == status and words in e.value.message
    assert e.value.body()["error"]["message"] == e.value.message


def test_response_is_openai_shaped():
    body = completion_body("cmpl-1", MODEL, 3, 42, "*", {"id": "kv-1"})
    assert body["object"] == "text_completion" and body["model"] == MODEL and body["kv"] == {"id": "kv-1"}
    assert body["choices"] == [{"index": 0, "text": "*", "token_ids": [42], "logprobs": None,
                                "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
