"""Emulated compute: the real model stages' interface, each stage a wait whose length comes from a per-op
cost table (asap.workers.costs.CostTable: the simulator's cost model), with tensors shrunk to a small hidden
size; processes, messages, scheduling and queues stay real. Ops chain on a device clock
(asap.workers.emulation.clock), as on a GPU stream.
"""
from __future__ import annotations

import torch

from asap.config import ModelConfig
from asap.model import stages
from asap.model.batch import Batch
from asap.model.moe import combine
from asap.workers.emulation.clock import DeviceClock


class EmulatedCompute:
    """Waits instead of computing. `cost` answers per-op seconds (asap.workers.costs.CostTable)."""
    emulated = True

    def __init__(self, cfg: ModelConfig, cost, hidden: int = 16, dilation: float = 1.0, seed: int = 0,
                 dtype=torch.float32, device="cpu", clock: DeviceClock | None = None):
        """clock: the device's stream; a co-located worker's shares its device (asap.workers.emulation.shared_device)."""
        self.cfg, self.cost, self.hidden, self.dilation = cfg, cost, hidden, dilation
        self.dtype, self.device = dtype, torch.device(device)
        self.clock = clock or DeviceClock()   # ops chain on it as on a GPU stream (asap.workers.emulation.clock)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.seed = seed
        self.strides = torch.arange(cfg.top_k, device=self.device)[None, :] * max(1, cfg.num_experts // cfg.top_k)

    def _wait(self, seconds: float):
        self.clock.wait(self.clock.run(seconds * self.dilation))

    def inputs_ready(self, t: float | None) -> None:
        """The next op's inputs were in at t (asap.workers.emulation.clock): it starts then or when the device is free."""
        self.clock.inputs_ready(t)

    def done_at(self) -> float:
        """When what the last op made left the device."""
        return self.clock.out()

    def new_kv(self):
        return None

    def embed(self, token_ids):
        return torch.zeros(token_ids.shape[0], self.hidden, dtype=self.dtype, device=self.device)

    def attention_stage(self, layer, h, batch: Batch, kv):
        chunks = [(c.num_tokens, c.start) for c in batch.chunks]
        moe = self.cfg.moe_layers[layer]
        self._wait(self.cost.attention_layer(chunks, moe))
        if not moe:
            return stages.StageOut(h=h)
        T, E, K = h.shape[0], self.cfg.num_experts, self.cfg.top_k
        # The simulator's load model (per-batch drift, group-limited picks: asap.cost.loads.TokenRouting) where
        # the cost table has one; else uniform: a random first expert per token plus K fixed, distinct strides.
        drawn = self.cost.route(layer, T, self.seed) if hasattr(self.cost, "route") else None
        if drawn is not None:
            ids = torch.from_numpy(drawn).to(self.device)
        else:
            ids = (torch.randint(0, E, (T, 1), generator=self.gen, device=self.device) + self.strides) % E
        w = torch.full((T, K), 1.0 / K, device=self.device)
        return stages.StageOut(h=h, x=h, topk_ids=ids, topk_weights=w)

    def experts(self, layer, x, topk_ids, topk_weights):
        pairs = int((topk_ids >= 0).sum())
        touched = int(torch.unique(topk_ids[topk_ids >= 0]).numel()) if pairs else 0
        self._wait(self.cost.experts(pairs, touched))
        return torch.zeros_like(x)

    def combine(self, residual, partials):
        return combine(residual, [p.to(residual.device, residual.dtype) for p in partials])

    def logits(self, h, rows):
        self._wait(self.cost.head(len(rows)))
        return torch.zeros(len(rows), 1, device=self.device)

    def synchronize(self) -> None:
        pass
