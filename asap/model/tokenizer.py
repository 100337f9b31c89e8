"""Tokenizers as Hugging Face loads them, and a byte-level one for the presets.

A model directory's `tokenizer.json` (the `tokenizers` format) is read together
with `tokenizer_config.json`: `bos_token`/`eos_token` and the other special
tokens, `added_tokens_decoder`, and the `chat_template` (or a
`chat_template.jinja` file), rendered with jinja2 as transformers renders it.
`encode` adds the special tokens the tokenizer.json post-processor adds
(DeepSeek's BOS), exactly as transformers 5's `AutoTokenizer(...)(text)["input_ids"]`
does. Like transformers 5, which drops `add_bos_token`/`add_eos_token` from
tokenizer_config.json whenever a tokenizer.json is present, the post-processor
alone decides; `add_bos_token` here reports what it does.

Presets have random weights, so any tokenizer is as good as another; theirs is
byte-level, with token id == byte value (0..255), `<|endoftext|>` = 256 and
reserved special tokens for the rest of the vocabulary, so every UTF-8 string
round-trips and every id decodes. The optional `tokenizers` package is needed:
without it a model still serves token-id prompts.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from asap.model.errors import ModelLoadError

EOS = "<|endoftext|>"
FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# The presets' chat template (ChatML, as Qwen's).
PRESET_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable-character table (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_tokenizer(model_dir: str | Path, vocab_size: int) -> Path | None:
    """Write a byte-level `tokenizer.json` covering all vocab_size ids (+ `tokenizer_config.json`) into
    model_dir; returns its path, or None without `tokenizers`."""
    if vocab_size < 257:
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= 257, got {vocab_size}")
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        return None
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(_byte_symbols())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ([EOS, "<|im_start|>", "<|im_end|>"] + [f"<|reserved_{i}|>" for i in range(vocab_size - 259)])
    specials = specials[:vocab_size - 256]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    path = Path(model_dir) / FILE
    tok.save(str(path))
    (Path(model_dir) / CONFIG_FILE).write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOS, "pad_token": EOS,
        "add_bos_token": False, "add_eos_token": False, "chat_template": PRESET_CHAT_TEMPLATE,
        "model_max_length": 1 << 20}, indent=1))
    return path


def _content(token) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


class TextTokenizer:
    """What the server needs (encode, decode, chat templates), whatever library sits underneath."""

    def __init__(self, tok, config: dict | None = None, chat_template: str | None = None, source=""):
        self._tok, self.config, self.source = tok, config or {}, source
        c = self.config
        self.bos_token, self.eos_token = _content(c.get("bos_token")), _content(c.get("eos_token"))
        self.special_tokens = {k: _content(c.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                               if _content(c.get(k)) is not None}
        self._add_specials()
        plain = tok.encode("", add_special_tokens=True).ids
        self.add_bos_token = self.bos_token_id is not None and plain[:1] == [self.bos_token_id]
        self.add_eos_token = self.eos_token_id is not None and plain[-1:] == [self.eos_token_id]
        self.chat_template = chat_template if chat_template is not None else self._config_template()
        self._compiled = None

    @property
    def bos_token_id(self) -> int | None:
        return self._tok.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.token_to_id(self.eos_token) if self.eos_token else None

    def _add_specials(self):
        from tokenizers import AddedToken
        decoder = self.config.get("added_tokens_decoder") or {}
        extra = [AddedToken(v["content"], special=bool(v.get("special", True)), normalized=bool(v.get("normalized")),
                            lstrip=bool(v.get("lstrip")), rstrip=bool(v.get("rstrip")), single_word=bool(v.get("single_word")))
                 for _, v in sorted(decoder.items(), key=lambda kv: int(kv[0])) if isinstance(v, dict) and "content" in v
                 and self._tok.token_to_id(v["content"]) is None]
        extra += [AddedToken(t, special=True, normalized=False) for t in self.special_tokens.values()
                  if self._tok.token_to_id(t) is None and t not in {e.content for e in extra}]
        if extra:
            self._tok.add_special_tokens(extra)

    def _config_template(self) -> str | None:
        t = self.config.get("chat_template")
        if isinstance(t, list):                    # named templates: transformers uses "default"
            named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
            t = named.get("default")
        return t if isinstance(t, str) else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text is not valid Unicode (it has a lone surrogate)") from None
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, tokenize: bool = False,
                            **kwargs):
        """Render `messages` with the model's chat template as transformers does (jinja2, sandboxed);
        tokenize=True returns ids (the template writes BOS itself, so no special tokens are added).
        A message the template refuses (its raise_exception) is a ValueError."""
        if self.chat_template is None:
            raise ValueError("this model's tokenizer has no chat_template")
        if self._compiled is None:
            self._compiled = _compile(self.chat_template)
        import jinja2
        try:
            text = self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **{**self.special_tokens, **kwargs})
        except jinja2.TemplateError as e:       # raise_exception() in the template, or a template bug
            raise ValueError(f"chat template: {e}") from None
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _compile(template: str):
    """transformers' _compile_jinja_template environment (without its assistant-mask extension)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(template)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(path, f"invalid JSON: {getattr(e, 'msg', None) or e}") from None
    except OSError as e:
        raise ModelLoadError(path, f"cannot read: {e.strerror}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(path, f"expected a JSON object, got {type(data).__name__}")
    return data


def load_tokenizer(model_dir: str | Path) -> TextTokenizer | None:
    """The model dir's tokenizer, or None when it has no `tokenizer.json` or `tokenizers` is not installed.
    A damaged tokenizer file is a ModelLoadError naming it."""
    d = Path(model_dir)
    path = d / FILE
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a bad file
        raise ModelLoadError(path, f"not a valid tokenizers file: {str(e).splitlines()[0] if str(e) else e!r}") \
            from None
    cfg_path = d / CONFIG_FILE
    config = _read_json(cfg_path) if cfg_path.is_file() else {}
    template = (d / TEMPLATE_FILE).read_text() if (d / TEMPLATE_FILE).is_file() else None
    try:
        return TextTokenizer(tok, config, template, d)
    except (TypeError, ValueError, KeyError) as e:
        raise ModelLoadError(cfg_path, f"cannot apply tokenizer_config.json: {e}") from None
