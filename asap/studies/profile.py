"""`asap profile`: time the project's own kernels on this CPU and write a calibrated "cpu" profile.

Every op of the cost model (asap.sim.cost, OP_NAMES) is timed with the functions the workers
run (asap.studies.kernels.KernelProfiler), on a materialised preset, at several sizes, with `threads`
torch threads (a runtime worker uses RuntimeConfig.threads_per_worker):
  attn_proj      the per-token attention projections (MLA: q_a, q_b, kv_a, o; GQA: q, k, v, o)
  attn_core      one chunk's attention: (MLA: kv_b over the chunk's whole context, the K/V
                 expansion,) the causal SDPA
  gate           asap.model.moe.gate
  shared_expert  gated_ffn on the shared experts; dense_ffn on a dense layer's FFN
  experts        asap.model.moe.expert_stage holding every expert (one expert worker), routed by the
                 gate, and spread over a few experts only (to separate weight traffic from overhead)
  elementwise    what a whole attention_stage leaves over once its other ops, timed alone at the same
                 shapes, are taken out: norms, RoPE, residuals, KV writes, glue
Each op's rates come from asap.studies.calibrate.fit_op_rate on relative errors, with the FLOPs and bytes
the cost model itself counts for each sample; an op whose FLOP and byte terms both matter keeps
fit_op_rate's sum form (OpRate.overlap=False). The whole stages are then predicted from the fitted
ops as a check. The link: a shared-memory ping-pong between two processes (asap.comm.ShmTransportSpec).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from asap.studies.calibrate import fit_op_rate
from asap.sim.hardware import OP_NAMES, Hardware, Link, OpRate, calibrated_cpu_path
from asap.studies.kernels import KernelProfiler

UNUSED = 1e29        # fit_op_rate gives 1e30 FLOP/s or bytes/s for a term it does not use


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


def profile_kernels(prof: KernelProfiler, sizes: Sizes, statistic: str = "min",
                    log=print) -> tuple[dict[str, OpFit], list]:
    """Time and fit every op; `elementwise` is fitted to what each whole attention stage leaves over
    once its other ops (timed alone at the same shapes) are taken out. Also returns the stages as
    (label, chunks, is_moe, measured seconds) for the check."""
    _samples(prof, sizes)                   # registers every kernel
    log(f"  {len(prof._jobs)} kernels: projections, FFNs and the gate at T={list(sizes.tokens)}; attention at "
        f"(n, ctx)={list(sizes.chunks)}; experts at T={list(sizes.expert_tokens)} and (T, experts)="
        f"{list(sizes.expert_subsets)}; {len(sizes.stages)} whole attention stages")
    prof.measure(sizes.repeats, statistic, log)
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


def measure_link(pings: int = 50, statistic: str = "min", big_bytes: int = 4 << 20) -> tuple[Link, dict]:
    """One-way latency (half a small round trip) and bandwidth (big messages, latency taken out); the
    fastest or the median round trip, as for the kernels."""
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
            one_way[size] = (min(trips) if statistic == "min" else statistics.median(trips)) / 2
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
            statistic: str = "min", link: bool = True, log=print) -> tuple[Hardware, dict, Path]:
    """Measure, fit and write the profile (default: $ASAP_CACHE/profiles/cpu.json, which get_hardware("cpu")
    then prefers to the shipped guess). Returns the Hardware, a report of every sample, and the path."""
    from asap.model.materialize import resolve_model
    started = time.perf_counter()
    torch.set_num_threads(threads)
    log(f"asap profile: {model}, {threads} torch thread(s), float32")
    prof = KernelProfiler(resolve_model(model))
    fits, stages = profile_kernels(prof, sizes, statistic, log)
    link_fit, link_report = measure_link(sizes.pings, statistic) if link else \
        (Link(5e9, 5e9, 5e-5, 64), {"skipped": True})
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = f"asap profile --model {model} --threads {threads} --statistic {statistic}"
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
        "statistic": statistic,
        "load_average": os.getloadavg(),
        "seconds": time.perf_counter() - started,
    }
    path = Path(out) if out else calibrated_cpu_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**hw.to_json(), "measurements": report}, indent=2) + "\n")
    return hw, report, path
