"""What a worker computes with: the real model stages.

Emulated compute (asap.workers.emulation.compute.EmulatedCompute) exposes the
same methods, so the async loop, the sync loop and the reference engine never
know which one they drive.
"""
from __future__ import annotations

import json
import multiprocessing.util
import os
import time

import torch

from asap.comm.streams import to_device
from asap.config import ModelConfig
from asap.model import stages
from asap.model.batch import Batch, KVCache
from asap.model.loader import load_attention_side, load_expert_shard
from asap.model.moe import combine, expert_stage


class RealCompute:
    emulated = False

    def __init__(self, model_dir, expert_ids=None, attention: bool = True, dtype=torch.float32, device="cpu"):
        self.dtype, self.device = dtype, torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)     # before any weight is loaded: kernels and allocations go here
        self.side = load_attention_side(model_dir, dtype, device) if attention else None
        self.shard = load_expert_shard(model_dir, expert_ids, dtype, device) if expert_ids is not None else None
        self.cfg: ModelConfig = self.side.cfg if self.side else ModelConfig.from_dir(model_dir)
        if os.environ.get("ASAP_WORKER_REPORT"):      # benchmarks/gpu_check.py: where each worker really ran
            self.report(os.environ["ASAP_WORKER_REPORT"])
            multiprocessing.util.Finalize(None, self.report, (os.environ["ASAP_WORKER_REPORT"],), exitpriority=1)

    def report(self, folder: str) -> None:
        """Write <folder>/<pid>.json: the device its weights are on and its peak device memory so far."""
        w = self.side.embed if self.side else next(iter(self.shard.gate_up.values()), None)
        cuda = self.device.type == "cuda"
        info = {"pid": os.getpid(), "roles": ["attention"] * bool(self.side) + ["experts"] * bool(self.shard),
                "device": str(self.device), "weights_on": str(w.device) if w is not None else None,
                "peak_bytes": torch.cuda.max_memory_allocated(self.device) if cuda else None}
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump(info, f)

    def new_kv(self) -> KVCache:
        return KVCache(self.cfg, self.dtype, self.device)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return stages.embed(self.side, token_ids.to(self.device))

    def attention_stage(self, layer: int, h, batch: Batch, kv: KVCache) -> stages.StageOut:
        return stages.attention_stage(self.side, layer, h, batch, kv)

    def experts(self, layer: int, x, topk_ids, topk_weights):
        # The comm boundary: shm hands over CPU tensors; this is their one move to the weights' device, on
        # the communication stream (asap.comm.streams), the compute stream ordered after it.
        d = self.device
        return expert_stage(self.shard, layer, to_device(x, d, self.dtype), to_device(topk_ids, d),
                            to_device(topk_weights, d))

    def combine(self, residual, partials):
        return combine(residual, [to_device(p, residual.device, residual.dtype) for p in partials])

    def logits(self, h, rows: list[int]) -> torch.Tensor:
        return stages.last_logits(self.side, h, rows)

    def inputs_ready(self, t: float | None) -> None:
        """Emulated compute's hint (asap.workers.emulation.clock); real kernels start when they really can."""

    def done_at(self) -> float:
        return time.monotonic()

    def synchronize(self) -> None:
        """Wait for the kernels this worker queued on its compute stream; nothing to wait for on a CPU.
        Not device-wide: communication in flight on other streams (NCCL, asap.comm.streams) is not waited
        for. The step loop does not call it on a GPU: attention is timed with events
        (asap.workers.timing); its being set tells the span recorder it is on a GPU (asap.workers.main)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
