"""`asap.LLM`: the one entry point for every engine.

    with asap.LLM("tiny-deepseek-v3", engine="reference") as llm:
        out = llm.prefill([[1, 2, 3], [4, 5]])
"""
from __future__ import annotations

import itertools
from concurrent.futures import Future

import torch

from asap.engine.errors import EngineClosed
from asap.engine.output import PrefillOutput
from asap.engine.validate import check_prompt
from asap.model.materialize import resolve_model

ENGINES = ("reference", "async", "sync")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPES = ("auto", *_DTYPES)     # vLLM's --dtype: auto = the checkpoint's torch_dtype (float32 when it names none)
_ALIASES = {"float": "float32", "half": "float16"}     # vLLM's spellings


def parse_dtype(dtype) -> torch.dtype | None:
    """"auto"/None -> None (the engine takes the checkpoint's torch_dtype); a name or torch.dtype -> torch.dtype."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if isinstance(dtype, str) and _ALIASES.get(dtype, dtype) in _DTYPES:
        return _DTYPES[_ALIASES.get(dtype, dtype)]
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _make_engine(name: str, model_dir, dtype, device, **kw):
    if name == "reference":
        from asap.engine.reference import ReferenceEngine
        return ReferenceEngine(model_dir, dtype, device, **kw)
    if name in ("async", "sync"):
        from asap.engine.runtime import RuntimeEngine
        return RuntimeEngine(model_dir, mode=name, dtype=dtype, device=device, **kw)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")


class LLM:
    """dtype "auto" (default, as vLLM): the checkpoint's torch_dtype, float32 when config.json names none
    (the presets are float32). Unlike vLLM, whose auto runs a float32 checkpoint in float16 on a GPU, a float32
    checkpoint stays float32: it is the exactness baseline. On CPU bfloat16 is correct but slow; pass
    dtype="float32" to override.
    The dtype the engine runs in is `llm.dtype`."""

    def __init__(self, model: str = "tiny-deepseek-v3", engine: str = "reference", dtype: str | None = "auto",
                 device: str = "cpu", **engine_kwargs):
        asked = parse_dtype(dtype)
        emulated = engine_kwargs.get("compute") == "emulated" or \
            getattr(engine_kwargs.get("runtime"), "compute", None) == "emulated"
        self.model_dir = resolve_model(model, config_only=emulated)
        self.emulated = emulated
        self.engine_name = engine
        self._ids = itertools.count()
        self.engine = _make_engine(engine, self.model_dir, asked, torch.device(device), **engine_kwargs)
        self.cfg, self.dtype = self.engine.cfg, self.engine.dtype

    def submit(self, prompt=None, deadline: float | None = None, *, num_tokens: int | None = None,
               prompt_logprobs: int | None = None) -> Future:
        """Queue one prompt; the future resolves to a PrefillOutput or raises its error.
        deadline: absolute TTFT deadline on time.monotonic(). With emulated compute a prompt
        may be given by its length alone (num_tokens). prompt_logprobs=k: also return every prompt
        token's logprob and the top-k there (PrefillOutput.prompt_logprobs; real compute only).
        future.cancel() aborts the request (a client that hung up): it is dropped before its next chunk."""
        self._open()
        if prompt is None:
            if not self.emulated:
                raise ValueError("a prompt (token ids) is required unless compute='emulated'")
            if not isinstance(num_tokens, int) or not 0 < num_tokens <= self.cfg.max_position_embeddings:
                raise ValueError(f"num_tokens must be in 1..{self.cfg.max_position_embeddings}, got {num_tokens!r}")
            return self.engine.submit(next(self._ids), None, deadline, num_tokens=num_tokens)
        ids = check_prompt(self.cfg, prompt)
        if prompt_logprobs is None:
            return self.engine.submit(next(self._ids), ids, deadline)
        if type(prompt_logprobs) is not int or not 0 <= prompt_logprobs <= self.cfg.vocab_size:
            raise ValueError(f"prompt_logprobs must be an int in 0..{self.cfg.vocab_size}, got {prompt_logprobs!r}")
        return self.engine.submit(next(self._ids), ids, deadline, prompt_logprobs=prompt_logprobs)

    def prefill(self, prompts) -> list[PrefillOutput]:
        """Prefill a batch of prompts. Every prompt is checked before any runs: a bad one raises
        ValueError naming it, and nothing is queued."""
        self._open()
        checked = [check_prompt(self.cfg, p, i) for i, p in enumerate(prompts)]
        futures = [self.engine.submit(next(self._ids), p, None) for p in checked]
        return [f.result() for f in futures]

    def healthy(self) -> bool:
        return self._open().healthy()

    def _open(self):
        """The engine, or EngineClosed (a RuntimeError: "engine is closed") once close() has run."""
        if self.engine is None:
            raise EngineClosed()
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
