"""A tiny byte-level tokenizer for preset models, and loading any model dir's tokenizer.

Presets have random weights, so any tokenizer is as good as another; the
byte-level one has token id == byte value (0..255) plus `<|endoftext|>` = 256,
so every UTF-8 string round-trips. It is written as a standard `tokenizer.json`
(Hugging Face `tokenizers` format), which real checkpoints also ship.
Both functions need the optional `tokenizers` package and quietly do nothing
without it: a model without a tokenizer still serves token-id prompts.
"""
from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"
FILE = "tokenizer.json"


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
    """Write a byte-level `tokenizer.json` into model_dir; returns its path, or None without `tokenizers`."""
    if vocab_size < 257:
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= 257, got {vocab_size}")
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        return None
    tok = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(_byte_symbols())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    path = Path(model_dir) / FILE
    tok.save(str(path))
    return path


class TextTokenizer:
    """The two calls the server needs, whatever library sits underneath."""

    def __init__(self, tok):
        self._tok = tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def load_tokenizer(model_dir: str | Path) -> TextTokenizer | None:
    """The model dir's `tokenizer.json`, or None when it has none or `tokenizers` is not installed."""
    path = Path(model_dir) / FILE
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return TextTokenizer(Tokenizer.from_file(str(path)))
