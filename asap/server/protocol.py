"""The wire format shared by every endpoint: the OpenAI error shape, safe JSON, and field checks.

Every problem raises ApiError with a 4xx status and a message that says what to fix; a message never
echoes client text beyond a short, escaped excerpt.
"""
from __future__ import annotations

import json
import math

from starlette.responses import JSONResponse

from asap.engine.validate import check_prompt


class ApiError(Exception):
    """An HTTP error response; `outcome` is how asap:requests_total counts it (see metrics.OUTCOMES)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None, outcome: str = "invalid"):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = status, message, kind, param, headers
        self.outcome = outcome

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class SafeJSONResponse(JSONResponse):
    """ASCII-escaped JSON: a lone surrogate in a decoded token or a message can never fail the encoding."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def excerpt(value, limit: int = 40) -> str:
    """A short, escaped rendering of client input for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def finite(x: float) -> float:
    """vLLM's convention for a log-probability of -inf: -9999.0 (JSON has no infinities)."""
    return x if math.isfinite(x) else -9999.0


def load_json(body: bytes) -> dict:
    try:
        req = json.loads(body)
    except (ValueError, RecursionError):       # ValueError covers bad JSON and bad UTF-8
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(req, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(req).__name__}")
    return req


def is_int(x) -> bool:
    return type(x) is int                     # bool is an int subclass; JSON true is not a token id


def check_text(text: str, param: str) -> str:
    """Reject text that is not valid Unicode (a lone surrogate such as "\\ud800" from a JSON escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"`{param}` is not valid Unicode: lone surrogate {excerpt(e.object[e.start:e.end])} "
                            f"at character {e.start}", param=param) from None
    return text


def check_model(req: dict, model_name: str) -> None:
    model = req.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "`model` must be a string", param="model")
    if model and model != model_name:
        raise ApiError(404, f"model {excerpt(model)} is not served here; this server serves {model_name!r}",
                       kind="not_found_error", param="model")


def tokenize_text(text: str, tokenizer, byte_cap: int, param: str = "prompt",
                  add_special_tokens: bool = True) -> list[int]:
    """Text -> token ids; the size is checked BEFORE tokenising (a text over `byte_cap` bytes cannot fit).
    Special tokens (BOS, as the tokenizer config says) are added to a prompt, not to a rendered chat."""
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer: send `prompt` as a list of token ids", param=param)
    check_text(text, param)
    size = len(text.encode("utf-8"))
    if size > byte_cap:
        raise ApiError(400, f"`{param}` is {size} bytes of text: more than can fit in the model's "
                            f"max_position_embeddings (at most {byte_cap} bytes)", param=param)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def checked_ids(ids, cfg, param: str = "prompt") -> list[int]:
    try:
        return check_prompt(cfg, ids)
    except ValueError as e:
        raise ApiError(400, str(e).removeprefix("prompt 0: "), param=param) from None
