"""Hardware profiles for the cost model.

A profile is a set of per-op roofline rates (effective FLOP/s and bytes/s, i.e.
peak x efficiency, plus a fixed per-op overhead) and a two-tier link model
(inside a node / across nodes). Built-in profiles are derived from datasheet
peaks and published efficiencies (/work/shared/REFERENCE.md, cited per line);
any profile can also be read from / written to JSON (schema below), which is
how a measured "cpu" profile from `asap profile` gets in ($ASAP_CACHE/profiles/cpu.json,
preferred by get_hardware("cpu") over the shipped, uncalibrated profiles/cpu.json).

JSON schema "asap-sim-hardware/1":
    {"schema": "asap-sim-hardware/1", "name": str, "calibrated": bool, "source": str,
     "memory_bytes": float,            # per device
     "weight_bytes": float,            # bytes per GEMM weight parameter (1 = FP8/INT8, 2 = BF16)
     "dispatch_bytes": float,          # bytes per activation element sent to the experts
     "combine_bytes": float,           # ... and sent back
     "comm_compute_share": float,      # fraction of compute lost to comm kernels while they overlap it
     "comm_contention": float (optional), # fraction of link rate lost while comm overlaps compute
     "gemm_tile_m": int,               # grouped-GEMM row tile (padding per expert)
     "ops": {OP: {"flops_per_s": float, "bytes_per_s": float, "overhead_s": float,
                  "overlap": bool (optional, default true)}, ...},
     "link": {"intra_bytes_per_s": float, "inter_bytes_per_s": float, "latency_s": float, "node_size": int,
              "collective_bytes_per_s": float (optional: tensor-parallel all-reduce bus rate inside a node)}}
OP is each name in OP_NAMES. Per op, time = overhead_s + max(flops / flops_per_s, bytes / bytes_per_s)
(the sum instead of the max where "overlap" is false);
`asap.studies.calibrate.fit_op_rate` fits those three numbers from measured (flops, bytes, seconds) samples.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = "asap-sim-hardware/1"
OP_NAMES = ("attn_proj", "attn_core", "gate", "shared_expert", "dense_ffn", "experts", "elementwise")
PROFILE_DIR = Path(__file__).parent.parent / "sim" / "profiles"   # shipped as package data of asap.sim


@dataclass(frozen=True)
class OpRate:
    flops_per_s: float      # effective: peak x efficiency
    bytes_per_s: float      # effective memory bandwidth
    overhead_s: float = 0.0
    # True: compute and memory traffic overlap (roofline max). False: they add, as in a CPU's eager
    # kernels run one after another (weight streaming, the K/V expansion, then the GEMMs); the form
    # fit_op_rate fits, so a measured profile sets it where both terms matter.
    overlap: bool = True

    def __post_init__(self):
        if not (self.flops_per_s > 0 and self.bytes_per_s > 0 and self.overhead_s >= 0):
            raise ValueError(f"bad op rate {self}")

    def seconds(self, flops: float, nbytes: float) -> float:
        """Roofline: the slower of compute and memory (or their sum), plus the fixed overhead."""
        compute, memory = flops / self.flops_per_s, nbytes / self.bytes_per_s
        return self.overhead_s + (max(compute, memory) if self.overlap else compute + memory)


@dataclass(frozen=True)
class Link:
    intra_bytes_per_s: float    # effective per-device all-to-all rate inside a node (or a flat fabric)
    inter_bytes_per_s: float    # effective per-device rate across nodes
    latency_s: float            # fixed cost of one dispatch or combine
    node_size: int              # devices per node; a flat fabric uses its whole size
    # NCCL-style all-reduce "bus bandwidth" inside a node, for attention tensor parallelism;
    # 0 = the all-to-all rate (intra_bytes_per_s)
    collective_bytes_per_s: float = 0.0

    def __post_init__(self):
        if not (self.intra_bytes_per_s > 0 and self.inter_bytes_per_s > 0 and self.latency_s >= 0
                and self.node_size >= 1 and self.collective_bytes_per_s >= 0):
            raise ValueError(f"bad link {self}")

    @property
    def allreduce_bytes_per_s(self) -> float:
        return self.collective_bytes_per_s or self.intra_bytes_per_s


@dataclass(frozen=True)
class Hardware:
    name: str
    ops: dict[str, OpRate]
    link: Link
    memory_bytes: float
    weight_bytes: float = 1.0
    dispatch_bytes: float = 1.0
    combine_bytes: float = 2.0
    comm_compute_share: float = 0.0
    comm_contention: float = 0.0        # fraction of link rate lost while comm overlaps compute (HBM, SM time)
    gemm_tile_m: int = 64
    calibrated: bool = True
    source: str = ""
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        missing = [op for op in OP_NAMES if op not in self.ops]
        if missing:
            raise ValueError(f"hardware {self.name!r}: no rate for ops {missing}")
        if not (0 <= self.comm_compute_share < 1 and 0 <= self.comm_contention < 1):
            raise ValueError(f"comm_compute_share and comm_contention must be in [0, 1), got "
                             f"{self.comm_compute_share}, {self.comm_contention}")

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("notes")
        return {"schema": SCHEMA, **d}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def from_json(d: dict, where: str = "profile") -> Hardware:
    if d.get("schema") != SCHEMA:
        raise ValueError(f"{where}: schema must be {SCHEMA!r}, got {d.get('schema')!r}")
    try:
        ops = {name: OpRate(**rate) for name, rate in d["ops"].items()}
        scalars = {k: d[k] for k in ("weight_bytes", "dispatch_bytes", "combine_bytes", "comm_compute_share",
                                     "comm_contention",
                                     "gemm_tile_m", "calibrated", "source") if k in d}
        return Hardware(name=d["name"], ops=ops, link=Link(**d["link"]), memory_bytes=float(d["memory_bytes"]),
                        **scalars)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: malformed hardware profile ({type(e).__name__}: {e})") from None


def load_profile(path: str | Path) -> Hardware:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"hardware profile not found: {p}")
    return from_json(json.loads(p.read_text()), str(p))


# The same rule for every accelerator: a kernel's published efficiency (a microbenchmark at its best
# shape, alone on the chip) times SUSTAINED_CLOCK, because datasheet peaks assume the boost clock
# (H100: 989 TFLOPS = 132 SMs x 4,096 FLOP/clk x 1.83 GHz) and a serving step's back-to-back GEMMs run
# at the power cap, ~1.55 GHz (our estimate from commonly reported sustained clocks; not fitted).
SUSTAINED_CLOCK = 0.85


def _accelerator(name, *, gemm_peak, bf16_peak, hbm_bw, memory, link, eff_gemm, eff_attn, eff_attn_mem,
                 eff_mem, overhead_s, comm_compute_share, source, gemm_tile_m=64) -> Hardware:
    """Weight GEMMs run at the low-precision peak (FP8/INT8); the attention core and the gate in BF16."""
    eff_gemm, eff_attn = eff_gemm * SUSTAINED_CLOCK, eff_attn * SUSTAINED_CLOCK
    gemm = OpRate(gemm_peak * eff_gemm, hbm_bw * eff_mem, overhead_s)
    ops = dict(attn_proj=gemm, shared_expert=gemm, dense_ffn=gemm, experts=gemm,
               attn_core=OpRate(bf16_peak * eff_attn, hbm_bw * eff_attn_mem, overhead_s),
               gate=OpRate(bf16_peak * eff_gemm, hbm_bw * eff_mem, overhead_s),
               elementwise=OpRate(bf16_peak * eff_gemm, hbm_bw * eff_mem, overhead_s))
    return Hardware(name, ops, link, memory, weight_bytes=1.0, dispatch_bytes=1.0, combine_bytes=2.0,
                    comm_compute_share=comm_compute_share, gemm_tile_m=gemm_tile_m, source=source)


def _hopper(name: str, hbm_bw: float, memory: float, allreduce_bw: float) -> Hardware:
    return _accelerator(
        name,
        gemm_peak=1979e12,      # FP8 dense, NVIDIA H100 SXM datasheet (3,958 with sparsity); H800/H200 same cores
        bf16_peak=989e12,       # BF16 dense (REFERENCE.md)
        hbm_bw=hbm_bw, memory=memory,
        # DeepEP on H800 (REFERENCE.md): ~155 GB/s over NVLink inside a node, 43-58 GB/s RDMA across nodes
        # (400 Gb/s NIC); the DeepEP README's normal (prefill) kernels reach ~58 GB/s at EP32, where every
        # calibration point runs. Latency: a 128-token EP8 low-latency dispatch is 77 us, of which ~47 us is
        # 7.3 MB at 155 GB/s (our arithmetic) -> ~30 us fixed.
        # All-reduce bus bandwidth for attention TP (nccl-tests on 8 GPUs, our estimate): ~80% of the NVLink
        # rate each way: 360 GB/s on H100/H200 (450 GB/s), 160 GB/s on H800 (NVLink cut to 200 GB/s each way).
        link=Link(intra_bytes_per_s=155e9, inter_bytes_per_s=58e9, latency_s=30e-6, node_size=8,
                  collective_bytes_per_s=allreduce_bw),
        # Kernel efficiencies (not fitted to the calibration points), then x SUSTAINED_CLOCK: FP8 grouped
        # GEMM at 65% of peak (DeepGEMM reports up to ~78% on large shapes; we allow for quantisation and
        # epilogues); attention core at 60% (FlashAttention-3 reaches 60-75% BF16 on Hopper; MLA's 192/128
        # head dims and the causal mask cost some); 80% of HBM bandwidth for streaming weights.
        eff_gemm=0.65, eff_attn=0.60, eff_attn_mem=0.80, eff_mem=0.80,
        overhead_s=10e-6,       # ~3 kernel launches per op group at ~3 us each (eager mode); a guess
        # DeepEP normal kernels take 24 of 132 SMs (DeepEP README); only while they overlap compute
        # (two-batch overlap, async workers) is that compute lost: asap.cost.model.CostModel(overlapped=...)
        comm_compute_share=24 / 132,
        source="datasheet peaks + published efficiencies; see asap/sim/hardware.py",
    )


def _ascend_910c_die() -> Hardware:
    return _accelerator(
        "cloudmatrix384",
        gemm_peak=750e12,       # INT8: ~1,500 TOPS per 910C chip, 2 dies (REFERENCE.md)
        bf16_peak=376e12,       # BF16 per die (REFERENCE.md)
        hbm_bw=1.6e12,          # 3.2 TB/s per chip (REFERENCE.md)
        memory=64e9,            # 128 GB per chip
        # UB fabric: 392 GB/s per chip each way (196 per die), flat across all 384 chips (<3% bandwidth,
        # <1 us latency to cross nodes). Measured 128-token INT8 dispatch: 116 us at EP8, 152 us at EP256
        # (REFERENCE.md). Per rank that is ~4.2 MB (EP8: 5.25 distinct ranks per token, 7/8 remote) and
        # ~7.25 MB (EP256); fitting latency + bytes / rate to both gives 85 GB/s and 67 us (our arithmetic).
        # The quoted "54 GB/s at EP256" is 7.25 MB / 152 us with the latency included, consistent with this.
        # TP all-reduce: the same ~80% of the per-die UB rate (196 GB/s each way) as on NVLink (our estimate).
        link=Link(intra_bytes_per_s=85e9, inter_bytes_per_s=85e9 * 0.97, latency_s=67e-6, node_size=768,
                  collective_bytes_per_s=0.8 * 196e9),
        # Measured in CloudMatrix-Infer (REFERENCE.md): INT8 GEMM 77-83% -> 0.80; MLA 65% of compute peak,
        # 84% of memory bandwidth; then x SUSTAINED_CLOCK, the same rule as Hopper's.
        eff_gemm=0.80, eff_attn=0.65, eff_attn_mem=0.84, eff_mem=0.84,
        overhead_s=20e-6,       # Ascend kernel launch is slower than CUDA's; a guess
        # Dispatch/combine run on the vector (AIV) cores, not the cube units; those AIV cores also run the
        # softmax, norms and quantisation, about a third of the non-GEMM time: we take 0.10 (a guess
        # from the core split, 48 AIV per die; not fitted)
        comm_compute_share=0.10,
        gemm_tile_m=16,          # cube unit fractal is 16x16
        source="CloudMatrix-Infer (arXiv 2506.12708) via REFERENCE.md; see asap/sim/hardware.py",
    )


BUILTIN = {
    "h800": lambda: _hopper("h800", hbm_bw=3.35e12, memory=80e9, allreduce_bw=160e9),   # H100 HBM3, cut NVLink
    "h100": lambda: _hopper("h100", hbm_bw=3.35e12, memory=80e9, allreduce_bw=360e9),   # REFERENCE.md
    "h200": lambda: _hopper("h200", hbm_bw=4.8e12, memory=141e9, allreduce_bw=360e9),   # REFERENCE.md
    "cloudmatrix384": _ascend_910c_die,
    "ascend-910c": _ascend_910c_die,
}


def calibrated_cpu_path() -> Path:
    """Where `asap profile` writes this machine's profile: $ASAP_CACHE/profiles/cpu.json."""
    return Path(os.environ.get("ASAP_CACHE", Path.home() / ".cache" / "asap")) / "profiles" / "cpu.json"


def cpu_profile_path() -> Path:
    """The file "cpu" means: the measured profile if `asap profile` has written one, else the shipped
    guess (profiles/cpu.json, "calibrated": false)."""
    p = calibrated_cpu_path()
    return p if p.is_file() else PROFILE_DIR / "cpu.json"


def get_hardware(spec: "str | Path | Hardware") -> Hardware:
    """A Hardware, a built-in name, "cpu" (see cpu_profile_path; the result's `calibrated` and
    `source` say which file it came from), or a path to a profile JSON."""
    if isinstance(spec, Hardware):
        return spec
    name = str(spec)
    if name in BUILTIN:
        return BUILTIN[name]()
    if name == "cpu":
        return load_profile(cpu_profile_path())
    if name.endswith(".json"):
        return load_profile(name)
    raise ValueError(f"unknown hardware {name!r}; choose one of {', '.join([*BUILTIN, 'cpu'])} or a .json path")
