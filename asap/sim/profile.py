"""`asap profile`: time the project's own kernels on this CPU and write a calibrated "cpu" profile.

Every op of the cost model (asap.sim.cost, OP_NAMES) is timed with the functions the
workers run, on a materialised preset, at several sizes (median of a few calls after a
warm-up, `threads` torch threads: a runtime worker uses RuntimeConfig.threads_per_worker):
  attn_proj      the attention projections over T tokens (MLA: q_a, q_b, kv_a, kv_b, o; GQA: q, k, v, o)
  attn_core      per chunk: what the attention loop does beyond the projections (MLA: kv_b over
                 the cached context, the K/V expansion; both: the causal SDPA)
  gate           asap.model.moe.gate
  shared_expert  gated_ffn with the shared experts; dense_ffn with a dense layer's FFN
  experts        asap.model.moe.expert_stage with every expert (one expert worker)
  elementwise    the rest of a whole attention_stage (norms, RoPE, residuals, KV writes, glue):
                 the stage's time minus the other ops' fitted times
The FLOPs and bytes of each sample come from the cost model itself (a CostModel on a
probe profile whose rates are 1 FLOP/s or 1 byte/s), so the fit cannot drift from the
formulas the simulator and emulated workers use. Each op's rate comes from
asap.sim.calibrate.fit_op_rate; the table shows measured vs fitted per sample as the
cost model evaluates it (roofline max). The link figures come from a shared-memory
ping-pong between two processes (asap.comm.ShmTransportSpec).
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from asap.config import ModelConfig
from asap.sim.calibrate import fit_op_rate
from asap.sim.cost import CostModel
from asap.sim.hardware import OP_NAMES, Hardware, Link, OpRate, calibrated_cpu_path
from asap.workers.costs import CostTable

UNUSED = 1e29        # fit_op_rate gives 1e30 FLOP/s or bytes/s for a term it does not use
ATTN_OPS = ("attn_proj", "attn_core", "gate", "shared_expert", "dense_ffn")


@dataclass(frozen=True)
class Sizes:
    """What to time. Chunks are (new tokens, context before); stages are lists of chunks."""
    tokens: tuple[int, ...] = (32, 128, 512, 1024)
    expert_tokens: tuple[int, ...] = (32, 128, 512, 1024, 2048)
    expert_subsets: tuple[tuple[int, int], ...] = ((64, 4), (256, 8), (256, 16))    # (T, experts touched)
    chunks: tuple[tuple[int, int], ...] = ((64, 0), (256, 0), (512, 0), (1024, 0), (256, 256), (512, 512),
                                           (128, 896), (256, 1536))
    stages: tuple[tuple[tuple[int, int], ...], ...] = (((32, 0),), ((128, 0),), ((512, 0),), ((1024, 0),),
                                                       ((128, 0),) * 4, ((512, 512), (256, 0)))
    repeats: int = 4                # timed rounds over all kernels (after a warm-up round)
    pings: int = 50


TINY = Sizes(tokens=(4, 16, 64), expert_tokens=(4, 16, 64), expert_subsets=((16, 4),),
             chunks=((8, 0), (32, 0), (16, 16)), stages=(((8, 0),), ((32, 0),), ((16, 16), (8, 0))),
             repeats=1, pings=5)


@dataclass
class OpFit:
    """An op's fitted rate and its samples (label, FLOPs, bytes, measured seconds, reference seconds):
    the reference is the measured time itself, or for elementwise the whole stage it was left over from."""
    rate: OpRate
    samples: list = field(default_factory=list)

    @classmethod
    def of(cls, samples: list) -> "OpFit":
        """fit_op_rate on relative errors (against each reference), kept in the sum form (overlap=False)
        when it uses both the FLOP and the byte term: a CPU runs an op's kernels one after another."""
        rate = fit_op_rate([s[1:4] for s in samples], weights=[1 / max(s[4], 1e-9) for s in samples])
        return cls(replace(rate, overlap=not (rate.flops_per_s < UNUSED and rate.bytes_per_s < UNUSED)), samples)

    def fitted(self, flops: float, nbytes: float) -> float:
        return self.rate.seconds(flops, nbytes)

    def error(self) -> float:
        """sum |fitted - measured| / sum reference: the share of the measured time the fit misses."""
        return sum(abs(self.fitted(f, b) - s) for _, f, b, s, _ in self.samples) / \
            max(sum(ref for *_, ref in self.samples), 1e-12)


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
        self.moe_layer = cfg.moe_layer_ids[0]
        self.dense_layer = next((i for i, m in enumerate(cfg.moe_layers) if not m), None)
        self._jobs: dict = {}           # key -> a call to time
        self._best: dict = {}           # key -> its fastest call, once measured
        self._inputs: dict = {}

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(self.dtype)

    def time(self, key, make) -> float:
        """The timed seconds of job `key` (0 until `measure` ran); the first call registers `make()`."""
        if key not in self._jobs:
            self._jobs[key] = make()
        return self._best.get(key, 0.0)

    def measure(self, rounds: int, log=print) -> None:
        """Run every registered job once per round (calls under 20 ms three times) after a warm-up
        round, keeping each job's fastest call. Interleaving spreads a job's calls over the whole run,
        so a burst of load from other processes on a shared machine spoils only some of them."""
        best = {key: math.inf for key in self._jobs}
        for r in range(rounds + 1):
            started = time.perf_counter()
            for key, fn in self._jobs.items():
                for _ in range(3 if r and best[key] < 0.02 else 1):
                    t = time.perf_counter()
                    fn()
                    if r:
                        best[key] = min(best[key], time.perf_counter() - t)
            log(f"  round {r}/{rounds}{' (warm-up)' if r == 0 else ''}: {len(self._jobs)} kernels timed in "
                f"{time.perf_counter() - started:.1f} s")
        self._best = best

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
        """Per-token projections. MLA's kv_b runs over a chunk's whole context: it is in attn_core."""
        c, w = self.cfg, self.side.layers[self.moe_layer]
        def make():
            x = self.randn(T, c.hidden_size)
            if c.is_mla:
                o_in = self.randn(T, c.num_heads * c.v_head_dim)
                names = ["self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight"] if c.q_lora_rank \
                    else ["self_attn.q_proj.weight"]
                def run():
                    q = x
                    for name in names:
                        q = F.linear(q, w[name])
                    F.linear(x, w["self_attn.kv_a_proj_with_mqa.weight"])
                    F.linear(o_in, w["self_attn.o_proj.weight"])
                return run
            o_in = self.randn(T, c.num_heads * c.head_dim)
            def run():
                for p in "qkv":
                    F.linear(x, w[f"self_attn.{p}_proj.weight"], w.get(f"self_attn.{p}_proj.bias"))
                F.linear(o_in, w["self_attn.o_proj.weight"], w.get("self_attn.o_proj.bias"))
            return run
        return self.time(("attn_proj", T), make)

    def attn_core(self, n: int, ctx: int) -> float:
        """One chunk of n new tokens after ctx cached ones: (MLA: K/V expansion of the context,) SDPA."""
        from asap.model.attention import _sdpa
        c, w, lk = self.cfg, self.side.layers[self.moe_layer], n + ctx
        def make():
            if c.is_mla:
                H, dn, R, dv = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
                q, lat, k_rope = self.randn(H, n, dn + R), self.randn(lk, c.kv_lora_rank), self.randn(lk, R)
                def run():
                    kvb = F.linear(lat, w["self_attn.kv_b_proj.weight"]).view(lk, H, dn + dv)
                    k = torch.cat((kvb[..., :dn], k_rope[:, None, :].expand(lk, H, R)), dim=-1)
                    _sdpa(q, k.transpose(0, 1), kvb[..., dn:].transpose(0, 1), ctx, (dn + R) ** -0.5)
                return run
            H, Hkv, d = c.num_heads, c.num_kv_heads, c.head_dim
            q, k, v = self.randn(H, n, d), self.randn(Hkv, lk, d), self.randn(Hkv, lk, d)
            return lambda: _sdpa(q, k, v, ctx, d ** -0.5, gqa=H != Hkv)
        return self.time(("attn_core", n, ctx), make)

    def ffn_op(self, op: str, T: int) -> float:
        """gate, shared_expert or dense_ffn over T tokens."""
        from asap.model.layers import gated_ffn
        from asap.model.moe import gate
        def make():
            x = self.randn(T, self.cfg.hidden_size)
            if op == "gate":
                return lambda: gate(self.cfg, self.side.layers[self.moe_layer], x)
            prefix = "mlp.shared_experts." if op == "shared_expert" else "mlp."
            w = self.side.layers[self.moe_layer if op == "shared_expert" else self.dense_layer]
            return lambda: gated_ffn(x, w[prefix + "gate_up"], w[prefix + "down_proj.weight"])
        return self.time((op, T), make)

    def experts(self, T: int, subset: int | None = None) -> tuple[float, int, int]:
        """expert_stage over T tokens routed by the gate, or spread over only `subset` experts
        (which separates the per-expert weight traffic from the per-call overhead)."""
        from asap.model.moe import expert_stage, gate
        layer, K, key = self.moe_layer, self.cfg.top_k, ("experts", T, subset)
        if key not in self._inputs:
            x = self.randn(T, self.cfg.hidden_size)
            if subset is None:
                ids, weights = gate(self.cfg, self.side.layers[layer], x)
            else:
                ids = (torch.arange(T)[:, None] + torch.arange(K)[None, :]) % subset
                weights = torch.full((T, K), 1.0 / K)
            self._inputs[key] = x, ids, weights
        x, ids, weights = self._inputs[key]
        seconds = self.time(key, lambda: lambda: expert_stage(self.shard, layer, x, ids, weights))
        return seconds, ids.numel(), int(ids.unique().numel())

    def stage(self, chunks, is_moe: bool) -> float:
        """The whole attention_stage of one layer over chunks [(n, ctx), ...]."""
        from asap.model.batch import Batch, Chunk, KVCache
        from asap.model.stages import attention_stage
        layer = self.moe_layer if is_moe else self.dense_layer
        def make():
            kv = KVCache(self.cfg, self.dtype)
            for i, (n, ctx) in enumerate(chunks):
                kv.allocate(i, n + ctx)
                if ctx:
                    kv.write(i, layer, 0, **{k: self.randn(ctx, *s) for k, s in self.cfg.kv_cache_dims.items()})
            batch = Batch.build([Chunk(i, ctx, n) for i, (n, ctx) in enumerate(chunks)])
            h = self.randn(batch.num_tokens, self.cfg.hidden_size)
            return lambda: attention_stage(self.side, layer, h, batch, kv)
        return self.time(("stage", tuple(chunks), is_moe), make)

    def named_parts(self, chunks, is_moe: bool) -> float:
        """The stage's ops other than elementwise, each timed alone."""
        T = sum(n for n, _ in chunks)
        ffn = ("gate", "shared_expert") if is_moe and self.cfg.n_shared_experts else ("gate",) if is_moe \
            else ("dense_ffn",)
        return self.attn_proj(T) + sum(self.attn_core(n, ctx) for n, ctx in chunks) \
            + sum(self.ffn_op(op, T) for op in ffn)


def profile_kernels(prof: KernelProfiler, sizes: Sizes, log=print) -> tuple[dict[str, OpFit], list]:
    """Time and fit every op; `elementwise` is fitted to what each whole attention stage leaves over
    once its other ops (timed alone at the same shapes) are taken out. Also returns the stages as
    (label, chunks, is_moe, measured seconds) for the check."""
    _samples(prof, sizes)                   # registers every kernel
    log(f"  {len(prof._jobs)} kernels: projections, FFNs and the gate at T={list(sizes.tokens)}; attention at "
        f"(n, ctx)={list(sizes.chunks)}; experts at T={list(sizes.expert_tokens)} and (T, experts)="
        f"{list(sizes.expert_subsets)}; {len(sizes.stages)} whole attention stages")
    prof.measure(sizes.repeats, log)
    raw, stages = _samples(prof, sizes)
    fits = {op: OpFit.of(raw[op]) for op in OP_NAMES if len(raw[op]) >= 3}
    for op in OP_NAMES:      # a model without shared experts or dense layers: a GEMM rate stands in
        fits.setdefault(op, OpFit(fits["attn_proj"].rate))
    return fits, stages


def _samples(prof: KernelProfiler, sizes: Sizes) -> tuple[dict[str, list], list]:
    """{op: [(label, FLOPs, bytes, seconds)]} and the whole stages."""
    raw = {op: [] for op in OP_NAMES}
    ffn_ops = ["gate"] + ["shared_expert"] * bool(prof.cfg.n_shared_experts) \
        + ["dense_ffn"] * (prof.dense_layer is not None)
    for T in sizes.tokens:
        sec = prof.attn_proj(T)
        raw["attn_proj"].append((f"T={T}", *prof.attention_ops([(T, 0)], True)["attn_proj"], sec, sec))
        for op in ffn_ops:
            sec = prof.ffn_op(op, T)
            raw[op].append((f"T={T}", *prof.attention_ops([(T, 0)], op != "dense_ffn")[op], sec, sec))
    for n, ctx in sizes.chunks:
        sec = prof.attn_core(n, ctx)
        raw["attn_core"].append((f"n={n} ctx={ctx}", *prof.attention_ops([(n, ctx)], True)["attn_core"], sec, sec))
    for T, subset in [(T, None) for T in sizes.expert_tokens] + list(sizes.expert_subsets):
        sec, pairs, touched = prof.experts(T, subset)
        raw["experts"].append((f"T={T} experts={touched}", *prof.work_experts(pairs, touched), sec, sec))
    stages = []
    for chunks in sizes.stages:
        for is_moe in (True, False) if prof.dense_layer is not None else (True,):
            measured = prof.stage(chunks, is_moe)
            label = f"{'moe' if is_moe else 'dense'} {list(chunks)}"
            stages.append((label, chunks, is_moe, measured))
            rest = max(measured - prof.named_parts(chunks, is_moe), 0.0)
            raw["elementwise"].append((label, *prof.attention_ops(chunks, is_moe)["elementwise"], rest, measured))
    return raw, stages


def stage_check(prof: KernelProfiler, fits: dict[str, OpFit], stages) -> list[tuple[str, float, float]]:
    """(label, measured, the cost model's sum of fitted ops) per whole attention stage."""
    return [(label, measured, sum(fits[op].fitted(*work) for op, work in prof.attention_ops(chunks, is_moe).items()))
            for label, chunks, is_moe, measured in stages]


# ---- transport: shared-memory ping-pong between two processes ----

def _echo(spec, count: int) -> None:
    t = spec.connect(1)
    for _ in range(count):
        m = t.recv(timeout=60)
        t.send(0, m.header, m.tensors)
    t.close()


def measure_link(pings: int = 50, big_bytes: int = 4 << 20) -> tuple[Link, dict]:
    """One-way latency (half a small round trip) and bandwidth (big messages, latency taken out)."""
    from asap.comm.headers import Header, Kind
    from asap.comm.shm import ShmTransportSpec
    sizes = (64, 64 << 10, big_bytes)
    spec = ShmTransportSpec(2, ring_bytes=4 * big_bytes)
    proc = mp.get_context("spawn").Process(target=_echo, args=(spec, len(sizes) * (pings + 1)), daemon=True)
    proc.start()
    one_way = {}
    try:
        t = spec.connect(0)
        header = Header(Kind.CONTROL, 0, 0, 0, 0, 0)
        for size in sizes:
            msg = [torch.zeros(size, dtype=torch.uint8)]
            trips = []
            for i in range(pings + 1):
                t0 = time.perf_counter()
                t.send(1, header, msg)
                if t.recv(timeout=60) is None:
                    raise RuntimeError("shm ping-pong: no answer within 60 s")
                if i:                           # the first round trip includes the child's start
                    trips.append(time.perf_counter() - t0)
            one_way[size] = statistics.median(trips) / 2
        t.close()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
        spec.cleanup()
    latency = one_way[sizes[0]]
    bandwidth = big_bytes / max(one_way[big_bytes] - latency, 1e-9)
    link = Link(intra_bytes_per_s=bandwidth, inter_bytes_per_s=bandwidth, latency_s=latency, node_size=64)
    return link, {"one_way_s": {str(k): v for k, v in one_way.items()}}


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} ({cpu}, {os.cpu_count()} cpus)"


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 16e9


def profile(model="small-deepseek-v3", out: "str | Path | None" = None, threads: int = 1, sizes: Sizes = Sizes(),
            link: bool = True, log=print) -> tuple[Hardware, dict, Path]:
    """Measure, fit and write the profile (default: $ASAP_CACHE/profiles/cpu.json, which get_hardware("cpu")
    then prefers to the shipped guess). Returns the Hardware, a report of every sample, and the path."""
    from asap.model.materialize import resolve_model
    started = time.perf_counter()
    torch.set_num_threads(threads)
    log(f"asap profile: {model}, {threads} torch thread(s), float32")
    prof = KernelProfiler(resolve_model(model))
    fits, stages = profile_kernels(prof, sizes, log)
    link_fit, link_report = measure_link(sizes.pings) if link else (Link(5e9, 5e9, 5e-5, 64), {"skipped": True})
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"asap profile --model {model} --threads {threads}"
    hw = Hardware("cpu", {op: fits[op].rate for op in OP_NAMES}, link_fit, _memory_bytes(),
                  weight_bytes=prof.dtype.itemsize, dispatch_bytes=prof.dtype.itemsize,
                  combine_bytes=prof.dtype.itemsize, comm_compute_share=0.0, gemm_tile_m=1, calibrated=True,
                  source=f"{command} (float32); {when}; {_machine()}")
    report = {
        "ops": {op: {"error": f.error() if f.samples else None,
                     "samples": [{"label": lbl, "flops": fl, "bytes": by, "measured_s": sec,
                                  "reference_s": ref, "fitted_s": f.fitted(fl, by)}
                                 for lbl, fl, by, sec, ref in f.samples]}
                for op, f in fits.items()},
        "stages": [{"label": lbl, "measured_s": m, "predicted_s": p} for lbl, m, p in stage_check(prof, fits, stages)],
        "link": link_report,
        "threads": threads,
        "seconds": time.perf_counter() - started,
    }
    path = Path(out) if out else calibrated_cpu_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**hw.to_json(), "measurements": report}, indent=2) + "\n")
    return hw, report, path
