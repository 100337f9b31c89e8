"""The OpenAI-style wire format of /v1/completions: request parsing and the response body.

Request: {"prompt": str | [int, ...] (or a batch of one: [str] / [[int, ...]]),
          "max_tokens": 0 | 1 (default 1), "model": str (optional, must match),
          "stream": false (optional), "n": 1 (optional),
          "return_kv": bool (ASAP extension, default true)}; other fields are ignored.
Every problem raises ApiError with a 4xx status and a message that says what to fix.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from asap.engine.validate import check_prompt


class ApiError(Exception):
    """An HTTP error response; `outcome` is how asap_requests_total counts it (see metrics.OUTCOMES)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None, outcome: str = "invalid"):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = status, message, kind, param, headers
        self.outcome = outcome

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class CompletionRequest:
    prompt_ids: list[int]
    max_tokens: int
    return_kv: bool


def _is_int(x) -> bool:
    return type(x) is int                     # bool is an int subclass; JSON true is not a token id


def _prompt_ids(prompt, cfg, tokenizer) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                    # OpenAI's batch form, with one prompt
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ApiError(400, "this model has no tokenizer: send `prompt` as a list of token ids", param="prompt")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        ids = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, f"send one prompt per request (got a batch of {len(prompt)})", param="prompt")
    else:
        raise ApiError(400, "`prompt` must be a string or a list of integer token ids", param="prompt")
    try:
        return check_prompt(cfg, ids)
    except ValueError as e:
        raise ApiError(400, str(e).removeprefix("prompt 0: "), param="prompt") from None


def parse_completion(body: bytes, cfg, tokenizer, model_name: str) -> CompletionRequest:
    try:
        req = json.loads(body)
    except (ValueError, RecursionError):       # ValueError covers bad JSON and bad UTF-8
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(req, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(req).__name__}")
    model = req.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "`model` must be a string", param="model")
    if model and model != model_name:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {model_name!r}",
                       kind="not_found_error", param="model")
    if req.get("stream") is not None and req["stream"] is not False:
        raise ApiError(400, "streaming is not supported: a prefill returns one token", param="stream")
    if req.get("n") is not None and not (_is_int(req["n"]) and req["n"] == 1):
        raise ApiError(400, "`n` must be 1", param="n")
    max_tokens = req.get("max_tokens", 1)
    max_tokens = 1 if max_tokens is None else max_tokens
    if not _is_int(max_tokens) or max_tokens < 0:
        raise ApiError(400, "`max_tokens` must be a non-negative integer", param="max_tokens")
    if max_tokens > 1:
        raise ApiError(400, f"max_tokens={max_tokens}: this server runs prefill only (max_tokens 0 or 1 returns "
                            "the first token); decode runs elsewhere, from the KV cache behind the `kv` handle",
                       param="max_tokens")
    return_kv = req.get("return_kv", True)
    if not isinstance(return_kv, bool):
        raise ApiError(400, "`return_kv` must be true or false", param="return_kv")
    if "prompt" not in req or req["prompt"] is None:
        raise ApiError(400, "missing `prompt`", param="prompt")
    return CompletionRequest(_prompt_ids(req["prompt"], cfg, tokenizer), max_tokens, return_kv)


def completion_body(completion_id: str, model: str, prompt_tokens: int, first_token: int, text: str,
                    kv: dict | None) -> dict:
    return {
        "id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "token_ids": [first_token], "logprobs": None,
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1},
        "kv": kv,
    }
