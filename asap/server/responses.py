"""Response bodies in OpenAI's shapes (as vLLM fills them): completions, chat, their stream chunks, logprobs.

A Choice is what one prompt x one sample produced; the bodies only arrange choices.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from asap.server.protocol import ApiError, dumps, finite

# Response-size estimate, in JSON bytes (checked against --max-response-mb before any work; the encoded
# body is checked again after). A token's text is taken as TOKEN_JSON bytes: a typical BPE token is 3-5
# characters, "token_id:N" without a tokenizer at most 15 (+ quotes); the encoded check catches a longer average.
TOKEN_JSON = 17
CHOICE_JSON = 300                       # id, index, finish_reason, an empty logprobs, ...
LOGPROB_JSON = 24                       # a float as JSON, its separator


@dataclass
class TokenLogprob:
    token: int
    logprob: float | None               # None: the first prompt token (nothing before it)
    top: list[tuple[int, float]]        # the k most likely tokens at this position


@dataclass
class Choice:
    index: int
    token_ids: list[int]                # the generated token ([] with max_tokens=0)
    text: str                           # its text (completions with echo: prompt text first)
    logprobs: list[TokenLogprob] | None  # echoed prompt tokens first, then the generated one
    prompt_token_ids: list[int] | None = None


def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token]) if tokenizer is not None else f"token_id:{token}"


def generated_logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    lp = torch.log_softmax(logits.float(), dim=-1)
    top = lp.topk(k) if k else None
    return TokenLogprob(token, float(lp[token]), list(zip(top.indices.tolist(), top.values.tolist())) if top else [])


def prompt_logprobs(prompt: list[int], plp) -> list[TokenLogprob]:
    """The echoed prompt's logprobs from the engine's PromptLogprobs (position 0 has none)."""
    out = [TokenLogprob(prompt[0], None, [])]
    lps, ids, tops = plp.token_logprobs.tolist(), plp.top_ids.tolist(), plp.top_logprobs.tolist()
    for i, token in enumerate(prompt[1:]):
        out.append(TokenLogprob(token, lps[i], list(zip(ids[i], tops[i]))))
    return out


def completion_logprobs(entries: list[TokenLogprob], tokenizer) -> dict:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs (the token itself included), text_offset."""
    tokens, offsets, offset = [], [], 0
    for e in entries:
        text = token_text(tokenizer, e.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    tops = []
    for e in entries:
        if e.logprob is None:
            tops.append(None)
            continue
        top = {token_text(tokenizer, t): finite(lp) for t, lp in e.top}
        top.setdefault(token_text(tokenizer, e.token), finite(e.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [None if e.logprob is None else finite(e.logprob) for e in entries],
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries: list[TokenLogprob], tokenizer) -> dict:
    def one(token, lp):
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": finite(lp), "bytes": list(text.encode("utf-8", "surrogatepass"))}
    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries]}


def estimated_bytes(job) -> int:
    """The answer's size before it is built: prompts x n choices, each with its echo and logprobs."""
    k = job.logprobs
    total = 0
    for prompt, text in zip(job.prompts, job.texts):
        one = CHOICE_JSON + TOKEN_JSON
        positions = 1 if job.common.max_tokens else 0
        if job.echo:
            one += len(dumps(text)) if text is not None else TOKEN_JSON * len(prompt)
            positions += len(prompt)
        if k is not None:               # a token, its logprob, its offset, then k + 1 (token, logprob) pairs
            one += positions * (TOKEN_JSON + 2 * LOGPROB_JSON + (k + 1) * (TOKEN_JSON + LOGPROB_JSON))
        total += job.common.n * one
    return total


def too_big(num_bytes: int, limit_mb: float, measured: bool = False) -> ApiError:
    return ApiError(400, f"the response would be {'' if measured else 'about '}{num_bytes / 2**20:.1f} MB, over "
                         f"--max-response-mb={limit_mb:g}: ask for fewer choices (n), fewer logprobs, no echo, "
                         "or fewer prompts per request", param="n")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _completion_choice(c: Choice, tokenizer) -> dict:
    body = {"index": c.index, "text": c.text, "token_ids": c.token_ids,
            "logprobs": None if c.logprobs is None else completion_logprobs(c.logprobs, tokenizer),
            "finish_reason": "length", "stop_reason": None}
    if c.prompt_token_ids is not None:
        body["prompt_token_ids"] = c.prompt_token_ids
    return body


def _chat_choice(c: Choice, tokenizer, delta: bool) -> dict:
    message = {"role": "assistant", "content": c.text}
    body = {"index": c.index, "delta" if delta else "message": message,
            "logprobs": None if c.logprobs is None else chat_logprobs(c.logprobs, tokenizer),
            "finish_reason": "length", "stop_reason": None}
    if not delta:
        body["token_ids"] = c.token_ids
    return body


def body(kind: str, rid: str, model: str, choices: list[Choice], tokenizer, use: dict | None,
         kv_transfer_params: dict | None) -> dict:
    """The whole (non-streamed) response; kind is "completion" or "chat"."""
    made = [_completion_choice(c, tokenizer) if kind == "completion" else _chat_choice(c, tokenizer, False)
            for c in sorted(choices, key=lambda c: c.index)]
    return {"id": rid, "object": "text_completion" if kind == "completion" else "chat.completion",
            "created": int(time.time()), "model": model, "choices": made, "usage": use,
            "kv_transfer_params": kv_transfer_params}


def encode_body(kind: str, rid: str, model: str, choices: list[Choice], tokenizer, use: dict | None,
                kv_transfer_params: dict | None) -> bytes:
    """body(...) as JSON bytes, one choice at a time: no single json.dumps call holds the GIL for the whole
    answer (the event loop's thread gets it between choices), and only one choice's dicts exist at once."""
    head = dumps(body(kind, rid, model, [], tokenizer, use, kv_transfer_params))
    before, after = head.split('"choices":[]', 1)      # the one top-level key; strings in it are escaped
    parts = [before, '"choices":[']
    for i, c in enumerate(sorted(choices, key=lambda c: c.index)):
        made = _completion_choice(c, tokenizer) if kind == "completion" else _chat_choice(c, tokenizer, False)
        parts += ["," if i else "", dumps(made)]
    return "".join(parts + ["]", after]).encode()


def chunk(kind: str, rid: str, model: str, choices: list[Choice], tokenizer, use: dict | None,
          with_usage: bool, kv_transfer_params: dict | None = None) -> dict:
    """One stream chunk: one choice's token, or (choices=[]) the final usage chunk. The last chunk before
    [DONE] carries kv_transfer_params when the request kept its KV (as vLLM streams the hand-off)."""
    made = [_completion_choice(c, tokenizer) if kind == "completion" else _chat_choice(c, tokenizer, True)
            for c in choices]
    out = {"id": rid, "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
           "created": int(time.time()), "model": model, "choices": made}
    if with_usage:
        out["usage"] = use
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    return out
