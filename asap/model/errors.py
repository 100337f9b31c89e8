"""The one error a broken model directory raises: one line naming the file and the field or tensor.

Every loading path (config.json, safetensors shards and index, tokenizer files)
raises ModelLoadError, so `asap serve` and every engine report the same single
line whatever went wrong. It is a ValueError: a bad model is bad input.
"""
from __future__ import annotations


class ModelLoadError(ValueError):
    def __init__(self, source, message: str):
        self.source, self.detail = str(source), message
        super().__init__(f"{source}: {message}" if source else message)


def describe(value) -> str:
    """A short, one-line rendering of a config value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
