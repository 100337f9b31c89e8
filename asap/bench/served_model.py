"""What `asap bench --target http` learns from the server when no --model is given, as `vllm bench serve` does.

vLLM's bench takes the first model of `GET /v1/models` and its tokenizer. ASAP builds its workload from a
vocabulary size and a context length, so it needs a bit more:

1. `GET /v1/models`: the served name (`id`), `root` and `max_model_len`.
2. The model's config here: `root` or `id` as a preset name or a local HF directory (what `asap serve MODEL`
   serves without --served-model-name), kept only if its context length agrees with the server's.
3. Else the server's `POST /tokenize`: the largest token id it returns for a sample text bounds the ids the
   random prompts may use (every id below it exists, since a vocabulary is 0..V-1), and ShareGPT text is
   tokenized by the server itself.

Neither: a clear error asking for --model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

# Many scripts, so the tokenizer returns ids from across its vocabulary (not only ASCII's low ids).
SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog. 0123456789 Zwölf Boxkämpfer jagen Viktor quer "
               "über den großen Sylter Deich. Съешь же ещё этих мягких французских булок. 敏捷的棕色狐狸跳过了"
               "懒狗。いろはにほへと ちりぬるを。 다람쥐 헌 쳇바퀴에 타고파. Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. "
               "def f(x): return {'a': [1, 2.5e-3]} # ✓ → ∑ ∞ 🙂")


@dataclass(frozen=True)
class ServedModel:
    name: str                   # what requests send as `model`
    local: str | None           # preset or directory whose config matches the server's, if any
    vocab_size: int             # token ids of random prompts are drawn below this
    max_position: int
    source: str                 # how the above were found, printed with the results


class ServerTokenizer:
    """`encode(text)` through the server's /tokenize (for ShareGPT prompts)."""

    def __init__(self, base_url: str, model: str, transport: httpx.BaseTransport | None = None):
        self.url, self.model, self.transport = base_url.rstrip("/") + "/tokenize", model, transport

    def encode(self, text: str) -> list[int]:
        with httpx.Client(timeout=30.0, transport=self.transport) as c:
            r = c.post(self.url, json={"model": self.model, "prompt": text})
        if not r.is_success:
            raise ValueError(f"POST {self.url} answered HTTP {r.status_code}: {r.text[:200]}")
        return list(r.json()["tokens"])


def server_base(url: str) -> str:
    """The server root of a --base-url that may name an endpoint (…/v1/completions)."""
    url = url.rstrip("/")
    for tail in ("/v1/completions", "/v1/chat/completions", "/completions", "/v1"):
        url = url.removesuffix(tail)
    return url


def _local_config(spec: str):
    from asap.bench.targets import model_config
    from asap.model.presets import PRESETS
    if spec in PRESETS or (Path(spec) / "config.json").is_file():
        return model_config(spec)
    return None


def _json(client: httpx.Client, method: str, url: str, **kw):
    """The JSON body of a 2xx answer, or None (a server without the route, or without a tokenizer)."""
    try:
        r = client.request(method, url, **kw)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {url} ({type(e).__name__}: {e}); is the server up? Or pass --model") \
            from None
    try:
        return r.json() if r.is_success else None
    except ValueError:
        return None


def discover(base_url: str, served_model_name: str | None = None,
             transport: httpx.BaseTransport | None = None) -> ServedModel:
    base = server_base(base_url)
    with httpx.Client(timeout=30.0, transport=transport) as c:
        listing = _json(c, "GET", base + "/v1/models")
        cards = listing.get("data") if isinstance(listing, dict) else None
        if not (isinstance(cards, list) and cards and all(isinstance(m, dict) and "id" in m for m in cards)):
            raise ValueError(f"GET {base}/v1/models gave no OpenAI model list; pass --model")
        card = next((m for m in cards if m["id"] == served_model_name), cards[0])
        name, max_len = served_model_name or card["id"], card.get("max_model_len")
        for spec in dict.fromkeys(x for x in (card.get("root"), card["id"]) if isinstance(x, str)):
            cfg = _local_config(spec)
            if cfg is not None and max_len in (None, cfg.max_position_embeddings):
                return ServedModel(name, spec, cfg.vocab_size, cfg.max_position_embeddings,
                                   f"{spec} (from the server's /v1/models; its config found here)")
        tok = _json(c, "POST", base + "/tokenize", json={"model": name, "prompt": SAMPLE_TEXT})
    tokens = tok.get("tokens") if isinstance(tok, dict) else None
    if not (isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens)
            and isinstance(max_len, int)):
        raise ValueError(f"the server's model {name!r} is neither a preset nor a directory here, and the server "
                         f"gives no /tokenize and max_model_len to build prompts from: pass --model (the preset "
                         f"or HF directory the server runs)")
    return ServedModel(name, None, max(tokens) + 1, max_len,
                       f"{name} (from the server's /v1/models; token ids below {max(tokens) + 1}, the largest its "
                       f"/tokenize returned for a sample text)")
