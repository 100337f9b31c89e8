"""Parsing /v1/completions and /v1/chat/completions bodies into a Job: the prompts to prefill and
what to return. Runs in the server's thread pool (JSON parsing and tokenising never block the loop).

Completions `prompt`: a string, a list of token ids, or a batch (a list of strings or of id lists).
Chat `messages`: rendered with the model's chat template, then tokenised.
"""
from __future__ import annotations

from dataclasses import dataclass

from asap.server.chat import check_messages
from asap.server.params import Common, field, parse_common, parse_logprobs, refuse_unhonourable
from asap.server.protocol import ApiError, check_model, checked_ids, is_int, load_json, tokenize_text


@dataclass(frozen=True)
class Context:
    """What parsing needs from the server."""
    cfg: object                 # ModelConfig
    tokenizer: object | None
    model_name: str
    text_byte_cap: int
    max_batch: int
    defaults: dict              # generation_config.json sampling defaults
    chat_template: object | None = None


@dataclass
class Job:
    kind: str                   # "completion" | "chat"
    prompts: list[list[int]]
    texts: list[str | None]     # the prompt text when given as text (echo)
    common: Common
    echo: bool
    logprobs: int | None        # top-k logprobs to return (None: no logprobs)

    @property
    def prompt_logprobs(self) -> int | None:
        """What to ask the engine for: prompt logprobs only when they are echoed back."""
        return self.logprobs if self.echo and self.logprobs is not None else None


def _prompts(prompt, ctx: Context) -> tuple[list[list[int]], list[str | None]]:
    if prompt is None:
        raise ApiError(400, "missing `prompt`", param="prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(is_int(t) for t in prompt)):
        batch = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        batch = prompt
    else:
        raise ApiError(400, "`prompt` must be a string, a list of integer token ids, or a batch of those",
                       param="prompt")
    if len(batch) > ctx.max_batch:
        raise ApiError(400, f"a batch of {len(batch)} prompts; at most {ctx.max_batch} per request", param="prompt")
    ids, texts = [], []
    for i, p in enumerate(batch):
        if isinstance(p, str):
            ids.append(checked_ids(tokenize_text(p, ctx.tokenizer, ctx.text_byte_cap), ctx.cfg))
            texts.append(p)
        elif isinstance(p, list) and all(is_int(t) for t in p):
            ids.append(checked_ids(p, ctx.cfg))
            texts.append(None)
        else:
            raise ApiError(400, f"prompt {i} of the batch must be a string or a list of integer token ids",
                           param="prompt")
    return ids, texts


def parse_completion(body: bytes, ctx: Context) -> Job:
    req = load_json(body)
    check_model(req, ctx.model_name)
    common = parse_common(req, ctx.defaults)
    echo = field(req, "echo", bool, False)
    logprobs = parse_logprobs(req, "logprobs")
    refuse_unhonourable(req, {"prompt_logprobs": None})
    prompts, texts = _prompts(req.get("prompt"), ctx)
    if common.keep_kv and len(prompts) > 1:
        raise ApiError(400, "kv_transfer_params (do_remote_decode) needs a single prompt per request",
                       param="kv_transfer_params")
    return Job("completion", prompts, texts, common, echo, logprobs)


def parse_chat(body: bytes, ctx: Context) -> Job:
    req = load_json(body)
    check_model(req, ctx.model_name)
    refuse_unhonourable(req, {"echo": False, "prompt_logprobs": None, "continue_final_message": False})
    common = parse_common(req, ctx.defaults, ("max_tokens", "max_completion_tokens"))
    logprobs = parse_logprobs(req, "top_logprobs", kind=bool)
    messages = check_messages(req.get("messages"))
    add_generation_prompt = field(req, "add_generation_prompt", bool, True)
    kwargs = req.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise ApiError(400, "`chat_template_kwargs` must be an object of named values", param="chat_template_kwargs")
    if ctx.chat_template is None:
        raise ApiError(400, "this model has no chat template (tokenizer_config.json `chat_template`); "
                            "use /v1/completions", param="messages")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("messages", "add_generation_prompt")}
    text = ctx.chat_template.render(messages, add_generation_prompt, kwargs)
    ids = checked_ids(tokenize_text(text, ctx.tokenizer, ctx.text_byte_cap, "messages", False), ctx.cfg, "messages")
    return Job("chat", [ids], [None], common, False, logprobs)
