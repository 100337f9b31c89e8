"""Timing the model's own kernels at given shapes, for `asap profile` (asap/studies/profile.py).

A KernelProfiler answers "how long does this kernel take at this shape" in two passes: the first
time a question is asked it registers the kernel (and answers 0); `measure` then times everything
registered in interleaved rounds, after which the same questions get the times. Successive calls
take the next layer's weights, as a forward pass does, so no call finds its weights still in cache.
`attention_ops` and `work_experts` give the cost model's (FLOPs, bytes) for the same shapes, from a
CostModel on a probe profile whose rates are 1 FLOP/s or 1 byte/s.
"""
from __future__ import annotations

import itertools
import statistics
import time

import torch
import torch.nn.functional as F

from asap.config import ModelConfig
from asap.sim.cost import CostModel
from asap.sim.hardware import OP_NAMES, Hardware, Link, OpRate
from asap.workers.costs import CostTable

STATISTICS = ("min", "median")


def _probe(cfg: ModelConfig, weight_bytes: float) -> tuple[CostModel, CostModel]:
    """Cost models whose op seconds equal the op's FLOPs, and its bytes."""
    link = Link(1.0, 1.0, 0.0, 1)
    def hw(rate):
        return Hardware("probe", {op: rate for op in OP_NAMES}, link, 1e18, weight_bytes=weight_bytes, gemm_tile_m=1)
    return CostModel(cfg, hw(OpRate(1.0, 1e300))), CostModel(cfg, hw(OpRate(1e300, 1.0)))


class KernelProfiler:
    """Times one model's kernels. Asking for a kernel's time at a shape registers it (and answers 0);
    `measure` then times everything registered, after which the same questions get the times.
    `attention_ops` and `work_experts` give the cost model's (FLOPs, bytes) for the same shapes."""

    def __init__(self, model_dir, dtype=torch.float32, seed: int = 0):
        from asap.model.loader import load_attention_side, load_expert_shard
        self.side = load_attention_side(model_dir, dtype)
        self.cfg = cfg = self.side.cfg
        self.shard = load_expert_shard(model_dir, range(cfg.num_experts), dtype)
        self.dtype = dtype
        self.by_flops, self.by_bytes = _probe(cfg, dtype.itemsize)
        self.gen = torch.Generator().manual_seed(seed)
        self.moe_layers = list(cfg.moe_layer_ids)
        self.dense_layers = [i for i, m in enumerate(cfg.moe_layers) if not m]
        self.dense_layer = self.dense_layers[0] if self.dense_layers else None
        self._turn = itertools.count()
        self._jobs: dict = {}           # key -> a call to time
        self._best: dict = {}           # key -> its fastest call, once measured
        self._inputs: dict = {}

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.dtype)

    def layer(self, is_moe: bool = True) -> int:
        """The next layer in turn: successive calls use different weights, as a forward pass does, so
        no call finds the weights still in cache from the one before."""
        ids = self.moe_layers if is_moe else self.dense_layers
        return ids[next(self._turn) % len(ids)]

    def time(self, key, make) -> float:
        """The timed seconds of job `key` (0 until `measure` ran); the first call registers `make()`."""
        if key not in self._jobs:
            self._jobs[key] = make()
        return self._best.get(key, 0.0)

    def measure(self, rounds: int, statistic: str = "min", log=print) -> None:
        """Run every registered job once per round (calls under 20 ms three times) after a warm-up
        round; keep each job's fastest call ("min": the machine when the neighbours are quiet) or its
        median ("median": the machine as loaded as it is now). Interleaving spreads a job's calls over
        the whole run, so a burst of load from other processes spoils only some of them."""
        if statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
        calls: dict = {key: [] for key in self._jobs}
        for r in range(rounds + 1):
            started = time.perf_counter()
            for key, fn in self._jobs.items():
                for _ in range(3 if calls[key] and min(calls[key]) < 0.02 else 1):
                    t = time.perf_counter()
                    fn()
                    if r:
                        calls[key].append(time.perf_counter() - t)
            log(f"  round {r}/{rounds}{' (warm-up)' if r == 0 else ''}: {len(self._jobs)} kernels timed in "
                f"{time.perf_counter() - started:.1f} s")
        pick = min if statistic == "min" else statistics.median
        self._best = {key: pick(ts) for key, ts in calls.items()}

    # ---- the cost model's view of a sample ----
    def attention_ops(self, chunks, is_moe: bool) -> dict[str, tuple[float, float]]:
        """{op: (FLOPs, bytes)} of one layer's attention stage over chunks [(n, ctx), ...]."""
        T = sum(n for n, _ in chunks)
        P = sum(n * c + n * (n + 1) // 2 for n, c in chunks)
        K = sum(n + c for n, c in chunks)
        fl, by = self.by_flops.attention_ops(is_moe, T, P, K), self.by_bytes.attention_ops(is_moe, T, P, K)
        return {op: (fl[op], by[op]) for op in fl}

    def work_experts(self, pairs: int, touched: int) -> tuple[float, float]:
        return CostTable(self.by_flops).experts(pairs, touched), CostTable(self.by_bytes).experts(pairs, touched)

    # ---- the kernels ----
    def attn_proj(self, T: int) -> float:
        """Per-token projections: the model family's (cfg.attention_cost().token_weights). Weights applied
        per context token (MLA's kv_b) are in attn_core."""
        names = self.cfg.attention_cost().token_weights
        def make():
            w0 = self.side.layers[0]                    # every layer's attention weights have the same shapes
            xs = {n: self.randn(T, w0[n].shape[1]) for n in names}
            def run():
                w = self.side.layers[self.layer()]
                for n in names:
                    F.linear(xs[n], w[n], w.get(n.removesuffix("weight") + "bias"))
            return run
        return self.time(("attn_proj", T), make)

    def attn_core(self, n: int, ctx: int) -> float:
        """One chunk of n new tokens after ctx cached ones: the family's per-context-token projections
        (MLA: K/V expansion of the latent), then SDPA at the family's head shapes."""
        from asap.model.attention import _sdpa
        a, lk = self.cfg.attention_cost(), n + ctx
        def make():
            w0 = self.side.layers[0]
            ctx_in = {name: self.randn(lk, w0[name].shape[1]) for name in a.context_weights}
            q = self.randn(a.heads, n, a.qk_head_dim)
            k, v = self.randn(a.kv_heads, lk, a.qk_head_dim), self.randn(a.kv_heads, lk, a.v_head_dim)
            def run():
                if ctx_in:
                    w = self.side.layers[self.layer()]
                    for name, x in ctx_in.items():
                        F.linear(x, w[name])
                _sdpa(q, k, v, ctx, a.qk_head_dim ** -0.5, gqa=a.heads != a.kv_heads)
            return run
        return self.time(("attn_core", n, ctx), make)

    def ffn_op(self, op: str, T: int) -> float:
        """gate, shared_expert or dense_ffn over T tokens."""
        from asap.model.layers import gated_ffn
        from asap.model.moe import gate
        def make():
            x = self.randn(T, self.cfg.hidden_size)
            if op == "gate":
                return lambda: gate(self.cfg, self.side.layers[self.layer()], x)
            prefix = "mlp.shared_experts." if op == "shared_expert" else "mlp."
            def run():
                w = self.side.layers[self.layer(op == "shared_expert")]
                gated_ffn(x, w[prefix + "gate_up"], w[prefix + "down_proj.weight"])
            return run
        return self.time((op, T), make)

    def experts(self, T: int, subset: int | None = None) -> tuple[float, int, int]:
        """expert_stage over T tokens routed by the gate, or spread over only `subset` experts
        (which separates the per-expert weight traffic from the per-call overhead)."""
        from asap.model.moe import expert_stage, gate
        K, key = self.cfg.top_k, ("experts", T, subset)
        if key not in self._inputs:
            x = self.randn(T, self.cfg.hidden_size)
            if subset is None:
                ids, weights = gate(self.cfg, self.side.layers[self.moe_layers[0]], x)
            else:
                ids = (torch.arange(T)[:, None] + torch.arange(K)[None, :]) % subset
                weights = torch.full((T, K), 1.0 / K)
            self._inputs[key] = x, ids, weights
        x, ids, weights = self._inputs[key]
        seconds = self.time(key, lambda: lambda: expert_stage(self.shard, self.layer(), x, ids, weights))
        return seconds, ids.numel(), int(ids.unique().numel())

    def stage(self, chunks, is_moe: bool) -> float:
        """The whole attention_stage of one layer over chunks [(n, ctx), ...]."""
        from asap.model.batch import Batch, Chunk, KVCache
        from asap.model.stages import attention_stage
        def make():
            kv = KVCache(self.cfg, self.dtype)
            for i, (n, ctx) in enumerate(chunks):
                kv.allocate(i, n + ctx)
                for layer in range(self.cfg.num_layers) if ctx else ():
                    kv.write(i, layer, 0, **{k: self.randn(ctx, *s) for k, s in self.cfg.kv_cache_dims.items()})
            batch = Batch.build([Chunk(i, ctx, n) for i, (n, ctx) in enumerate(chunks)])
            h = self.randn(batch.num_tokens, self.cfg.hidden_size)
            return lambda: attention_stage(self.side, self.layer(is_moe), h, batch, kv)
        return self.time(("stage", tuple(chunks), is_moe), make)

    def named_parts(self, chunks, is_moe: bool) -> float:
        """The stage's ops other than elementwise, each timed alone."""
        T = sum(n for n, _ in chunks)
        ffn = ("gate", "shared_expert") if is_moe and self.cfg.n_shared_experts else ("gate",) if is_moe \
            else ("dense_ffn",)
        return self.attn_proj(T) + sum(self.attn_core(n, ctx) for n, ctx in chunks) \
            + sum(self.ffn_op(op, T) for op in ffn)
