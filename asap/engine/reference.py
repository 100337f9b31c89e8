"""The reference engine: one process, the whole model, the stage functions composed in order.

It is the exactness baseline the async and sync engines are checked against.
Requests submitted together are prefilled as one packed batch.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

import torch

from asap.engine.errors import EngineClosed
from asap.engine.output import PrefillOutput, PromptLogprobs
from asap.model.batch import Batch, Chunk, KVCache
from asap.model.loader import load_attention_side, load_expert_shard, runtime_dtype
from asap.model.stages import forward, last_logits, prompt_logprobs


def run_batch(side, shards, prompts: dict[int, list[int]], dtype, device,
              logprobs_k: dict[int, int] | None = None) -> dict[int, PrefillOutput]:
    """Prefill whole prompts as one packed batch -> outputs by request id (with prompt logprobs for
    the ids in `logprobs_k`: id -> top-k)."""
    kv = KVCache(side.cfg, dtype, device)
    chunks = [Chunk(rid, 0, len(p)) for rid, p in prompts.items()]
    for c in chunks:
        kv.allocate(c.request_id, c.num_tokens)
    batch = Batch.build(chunks, device)
    ids = torch.tensor([t for p in prompts.values() for t in p], dtype=torch.long, device=device)
    with torch.inference_mode():
        h = forward(side, shards, ids, batch, kv)
        logits = last_logits(side, h, [batch.offsets[i + 1] - 1 for i in range(len(chunks))])
        logprobs = {c.request_id: _prompt_logprobs(side, h, batch.offsets[i], prompts[c.request_id], k)
                    for i, c in enumerate(chunks) if (k := (logprobs_k or {}).get(c.request_id)) is not None}
    return {c.request_id: PrefillOutput(int(logits[i].argmax()), logits[i].cpu(), kv.pop(c.request_id),
                                        c.num_tokens, c.request_id, prompt_logprobs=logprobs.get(c.request_id))
            for i, c in enumerate(chunks)}


def _prompt_logprobs(side, h, start: int, prompt: list[int], k: int) -> PromptLogprobs:
    rows = list(range(start, start + len(prompt) - 1))
    return PromptLogprobs(*prompt_logprobs(side, h, rows, torch.tensor(prompt[1:], dtype=torch.long), k))


class ReferenceEngine:
    """dtype None: the checkpoint's torch_dtype. A broken model directory raises ModelLoadError (one line)."""

    def __init__(self, model_dir, dtype=None, device="cpu"):
        self.side = load_attention_side(model_dir, dtype, device)
        self.cfg = self.side.cfg
        self.dtype, self.device = runtime_dtype(self.cfg, dtype), device
        self.shards = [load_expert_shard(model_dir, range(self.cfg.num_experts), self.dtype, device)]
        self._closed = False
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="asap-reference", daemon=True)
        self._thread.start()

    def submit(self, request_id: int, prompt: list[int], deadline: float | None = None,
               prompt_logprobs: int | None = None) -> Future:
        if self._closed:
            raise EngineClosed()
        fut: Future = Future()
        self._queue.put((request_id, prompt, fut, prompt_logprobs))
        return fut

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            pending = [item]
            while not self._queue.empty():
                nxt = self._queue.get()
                if nxt is None:
                    self._queue.put(None)
                    break
                pending.append(nxt)
            pending = [p for p in pending if not p[2].cancelled()]    # cancelled by the caller: not run
            if not pending:
                continue
            try:
                outs = run_batch(self.side, self.shards, {rid: p for rid, p, _, _ in pending}, self.dtype,
                                 self.device, {rid: k for rid, _, _, k in pending if k is not None})
                for rid, _, fut, _ in pending:
                    if not fut.cancelled():
                        fut.set_result(outs[rid])
            except Exception as e:  # noqa: BLE001 - the error belongs to the callers' futures
                for _, _, fut, _ in pending:
                    if not fut.cancelled():
                        fut.set_exception(e)

    def healthy(self) -> bool:
        if self._closed:
            raise EngineClosed()
        return self._thread.is_alive()

    def close(self) -> None:
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        while not self._queue.empty():          # submitted while closing: fail them rather than leave them waiting
            item = self._queue.get()
            if item is not None:
                item[2].set_exception(EngineClosed())
