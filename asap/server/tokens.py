"""/tokenize and /detokenize (as vLLM offers them), and the byte cap that bounds text before tokenising.

The cap: a text of B bytes needs at least B / (longest token in bytes) tokens, so a text longer than
max_position_embeddings x longest-token bytes cannot fit and is refused without being tokenised.
"""
from __future__ import annotations

from asap.server.chat import check_messages
from asap.server.params import field
from asap.server.protocol import ApiError, check_model, checked_ids, is_int, load_json, tokenize_text

MIN_TOKEN_BYTES = 4          # an unknown character (one <unk> token) can be up to 4 UTF-8 bytes


def max_token_bytes(tokenizer) -> int:
    """The longest vocabulary entry in UTF-8 bytes (an upper bound on the text one token covers)."""
    inner = getattr(tokenizer, "_tok", tokenizer)
    vocab = getattr(inner, "get_vocab", None)
    try:
        entries = vocab(with_added_tokens=True) if vocab is not None else {}
    except TypeError:
        entries = vocab()
    return max([MIN_TOKEN_BYTES, *(len(t.encode("utf-8", "surrogatepass")) for t in entries)])


def text_byte_cap(tokenizer, cfg) -> int:
    return cfg.max_position_embeddings * (max_token_bytes(tokenizer) if tokenizer is not None else MIN_TOKEN_BYTES)


def tokenize(body: bytes, ctx) -> dict:
    req = load_json(body)
    check_model(req, ctx.model_name)
    if "messages" in req:
        if ctx.chat_template is None:
            raise ApiError(400, "this model has no chat template", param="messages")
        text = ctx.chat_template.render(check_messages(req["messages"]),
                                        field(req, "add_generation_prompt", bool, True), {})
        param = "messages"
    else:
        text, param = req.get("prompt"), "prompt"
        if not isinstance(text, str):
            raise ApiError(400, "`prompt` must be a string (or send `messages`)", param="prompt")
    ids = tokenize_text(text, ctx.tokenizer, ctx.text_byte_cap, param,
                        field(req, "add_special_tokens", bool, param == "prompt"))
    return {"count": len(ids), "max_model_len": ctx.cfg.max_position_embeddings, "tokens": ids}


def detokenize(body: bytes, ctx) -> dict:
    req = load_json(body)
    check_model(req, ctx.model_name)
    ids = req.get("tokens")
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise ApiError(400, "`tokens` must be a list of integer token ids", param="tokens")
    if ctx.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", param="tokens")
    if ids:
        checked_ids(ids, ctx.cfg, "tokens")
    return {"prompt": ctx.tokenizer.decode(ids)}
