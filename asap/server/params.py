"""Request parameters shared by /v1/completions and /v1/chat/completions: what a prefill can honour,
what is a no-op for a single token (accepted), and what it cannot honour (400 naming the field).

Defaults follow vLLM: temperature 1.0, top_p 1.0, top_k off, unless the model dir's
generation_config.json sets them. Unknown fields are ignored, as vLLM does.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from asap.server.protocol import ApiError, is_int

MAX_LOGPROBS = 20                       # vLLM's default --max-logprobs
MAX_N = 128
# Sampling runs in float32: a positive value below its smallest normal number (top_p 1e-300, min_p 1e-45)
# would round to 0 there or lose all precision, and empty the distribution. Refused with a 400 instead.
FLOAT32_TINY = 1.1754943508222875e-38

# No-ops when at most one token is generated (the stop condition is the token budget itself).
NO_OPS = ("stop", "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
          "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "user",
          "length_penalty", "return_token_ids", "priority", "request_id", "service_tier", "store", "metadata")
# Fields a prefill cannot honour: a non-default value gets a 400 that names them.
REFUSED = {"best_of": 1, "suffix": None, "bad_words": None, "allowed_token_ids": None, "guided_json": None,
           "guided_regex": None, "guided_choice": None, "guided_grammar": None, "structured_outputs": None,
           "response_format": None, "tools": None, "tool_choice": None, "functions": None, "function_call": None,
           "prompt_embeds": None, "lora_request": None, "truncate_prompt_tokens": None, "chat_template": None,
           "audio": None, "modalities": None, "prediction": None, "parallel_tool_calls": None}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 (or -1): off
    min_p: float = 0.0
    seed: int | None = None
    logit_bias: dict | None = None      # {token id: bias}

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


@dataclass(frozen=True)
class Common:
    max_tokens: int                     # 0: no token generated; 1: the first token
    n: int
    stream: bool
    include_usage: bool
    sampling: Sampling
    keep_kv: bool                       # kv_transfer_params.do_remote_decode (or the legacy return_kv)


def generation_defaults(model_dir) -> dict:
    """temperature / top_p / top_k from the model's generation_config.json, when it has one."""
    path = Path(model_dir) / "generation_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: cfg[k] for k in ("temperature", "top_p", "top_k") if isinstance(cfg, dict) and k in cfg}


def field(req, name, kind, default, check=None, why=""):
    """req[name] checked to be of `kind` (int, float or bool; JSON true is no int) and to pass `check`;
    missing or null -> default; else a 400 saying what `name` must be."""
    value = req.get(name)
    if value is None:
        return default
    ok = is_int(value) if kind is int else (isinstance(value, bool) if kind is bool else
                                           (is_int(value) or (type(value) is float and math.isfinite(value))))
    if not ok or (check is not None and not check(value)):
        raise ApiError(400, f"`{name}` must be {why or kind.__name__}", param=name)
    return value


def refuse_unhonourable(req: dict, extra: dict | None = None) -> None:
    refused = {**REFUSED, **(extra or {})}
    bad = [k for k, default in refused.items() if k in req and req[k] is not None and req[k] != default
           and req[k] != [] and req[k] != {}]
    if bad:
        raise ApiError(400, f"not supported by a prefill server: {', '.join(sorted(bad))}", param=sorted(bad)[0])


def parse_sampling(req: dict, defaults: dict) -> Sampling:
    t = field(req, "temperature", float, defaults.get("temperature", 1.0), lambda v: 0 <= v <= 100, "a number >= 0")
    top_p = field(req, "top_p", float, defaults.get("top_p", 1.0), lambda v: FLOAT32_TINY <= v <= 1,
                  f"a number in [{FLOAT32_TINY:.4g}, 1] (float32)")
    top_k = field(req, "top_k", int, defaults.get("top_k", 0), lambda v: v >= -1, "-1, 0 (off) or a positive int")
    min_p = field(req, "min_p", float, 0.0, lambda v: v == 0 or FLOAT32_TINY <= v <= 1,
                  f"0 or a number in [{FLOAT32_TINY:.4g}, 1] (float32)")
    seed = field(req, "seed", int, None, lambda v: -2**63 <= v < 2**64, "a 64-bit integer")
    bias = req.get("logit_bias")
    if bias is not None:
        try:
            bias = {int(k): float(v) for k, v in bias.items()}
            if any(type(v) not in (int, float) for v in req["logit_bias"].values()):
                raise TypeError
            if not all(math.isfinite(v) for v in bias.values()):     # JSON parsing accepts NaN and Infinity
                raise ValueError
        except (AttributeError, TypeError, ValueError, OverflowError):
            raise ApiError(400, "`logit_bias` must map token ids to finite numbers", param="logit_bias") from None
    return Sampling(float(t), float(top_p), max(int(top_k), 0), float(min_p), seed, bias or None)


def parse_common(req: dict, defaults: dict, max_tokens_names=("max_tokens",)) -> Common:
    refuse_unhonourable(req)
    max_tokens = 1
    for name in max_tokens_names:
        max_tokens = field(req, name, int, max_tokens, lambda v: v >= 0, "a non-negative integer")
    if max_tokens > 1:
        raise ApiError(400, f"max_tokens={max_tokens}: this server runs prefill only (max_tokens 0 or 1); decode "
                            "runs elsewhere, from the KV cache that kv_transfer_params hands off",
                       param=max_tokens_names[-1])
    min_tokens = field(req, "min_tokens", int, 0, lambda v: v >= 0, "a non-negative integer")
    if min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens={min_tokens} is more than max_tokens={max_tokens}", param="min_tokens")
    n = field(req, "n", int, 1, lambda v: 1 <= v <= MAX_N, f"an integer in 1..{MAX_N}")
    stream = field(req, "stream", bool, False)
    options = req.get("stream_options")
    if options is not None and not stream:
        raise ApiError(400, "`stream_options` needs `stream: true`", param="stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "`stream_options` must be an object", param="stream_options")
    include_usage = field(options or {}, "include_usage", bool, False)
    field(options or {}, "continuous_usage_stats", bool, False)
    return Common(max_tokens, n, stream, include_usage, parse_sampling(req, defaults), _keep_kv(req))


def _keep_kv(req: dict) -> bool:
    params = req.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ApiError(400, "`kv_transfer_params` must be an object", param="kv_transfer_params")
    do_remote_decode = field(params or {}, "do_remote_decode", bool, False)
    if (params or {}).get("do_remote_prefill"):
        raise ApiError(400, "kv_transfer_params.do_remote_prefill: this server is the prefill side; it does not "
                            "pull KV from elsewhere", param="kv_transfer_params")
    return do_remote_decode or field(req, "return_kv", bool, False)


def parse_logprobs(req: dict, name: str, kind=int) -> int | None:
    """Completions: logprobs=k (int). Chat: logprobs=true + top_logprobs=k."""
    if kind is int:
        return field(req, name, int, None, lambda v: 0 <= v <= MAX_LOGPROBS, f"an integer in 0..{MAX_LOGPROBS}")
    if not field(req, "logprobs", bool, False):
        if req.get("top_logprobs"):
            raise ApiError(400, "`top_logprobs` needs `logprobs: true`", param="top_logprobs")
        return None
    return field(req, "top_logprobs", int, 0, lambda v: 0 <= v <= MAX_LOGPROBS, f"an integer in 0..{MAX_LOGPROBS}")
