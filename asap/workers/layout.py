"""Who runs where: transport ranks, expert placement and the worker specs of an engine.

async: ranks [0, A) are attention replicas, [A, A+E) expert workers.
async colocated: the same ranks, E = A x attention_tp devices; expert worker e runs on device e, which belongs
       to replica e // attention_tp. The attention replica and the expert shard of a device stay two processes
       (two ranks: the exchange between them is the same point-to-point one); one process per device, with
       expert kernels on a high-priority stream, is future work.
       A length-aware fleet (wide_replicas): the A narrow replicas, then the wide ones (ranks [A, A + W)), each
       on its own run of devices (RuntimeConfig.replica_devices); E = A x attention_tp + W x wide_tp.
sync:  ranks [0, N) are replicas that also hold 1/N of the experts each.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

import torch

from asap.config import ModelConfig, RuntimeConfig
from asap.scheduler.placement import Placement, balanced_placement, contiguous_placement
from asap.workers.main import WorkerSpec, worker_device


@dataclass
class Layout:
    specs: list[WorkerSpec]          # the workers this engine starts
    transport: object
    num_replicas: int
    remote: list[WorkerSpec] = field(default_factory=list)   # started elsewhere (remote_experts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _transport(rt: RuntimeConfig, world: int, pairs, ring_bytes: int, num_gpus: int | None = None):
    if rt.transport == "nccl" and not rt.remote_experts:   # remote: torchrun gives each rank its own LOCAL_RANK
        n = torch.cuda.device_count() if num_gpus is None else num_gpus
        if n < world:
            raise ValueError(f"transport nccl needs one GPU per rank: {world} ranks, {n} GPUs "
                             "(NCCL cannot send between two ranks on one GPU); use transport shm")
    if rt.transport == "shm":
        from asap.comm import ShmTransportSpec
        return ShmTransportSpec(world, ring_bytes=ring_bytes, pairs=pairs, send_timeout=rt.comm_timeout_s)
    from asap.comm import DistTransportSpec
    port = rt.master_port or free_port()
    return DistTransportSpec(backend=rt.transport, init_method=f"tcp://{rt.master_addr}:{port}", world_size=world,
                             device="cuda" if rt.transport == "nccl" else "cpu")


def replica_cost(cfg: ModelConfig, rt: RuntimeConfig, mode: str, tp: int | None = None):
    """The router's cost predictor: the cost model on this engine's hardware profile (emulated: dilated), for a
    replica of attention TP `tp` (default rt.attention_tp)."""
    from asap.workers.costs import runtime_cost_table
    fn = runtime_cost_table(cfg, rt, mode, tp).cost.replica_cost_fn()
    scale = rt.dilation if rt.compute == "emulated" else 1.0
    return lambda batch: scale * fn(batch)


def default_placement(cfg: ModelConfig, rt: RuntimeConfig, num_expert_workers: int) -> Placement:
    if rt.redundant_experts:
        uniform = [[1.0] * cfg.num_experts for _ in range(cfg.num_layers)]
        return balanced_placement(uniform, num_expert_workers, rt.redundant_experts)
    return contiguous_placement(cfg.num_layers, cfg.num_experts, num_expert_workers)


def _device_records(num_devices: int, num_replicas: int) -> list:
    from asap.workers.emulation.shared_device import DeviceBusy      # emulation only: off the real path
    return [DeviceBusy(num_replicas) for _ in range(num_devices)]


def build_layout(cfg: ModelConfig, rt: RuntimeConfig, mode: str, model_dir: str, dtype: str, device: str,
                 send_kv: bool, placement: Placement | None = None, num_gpus: int | None = None) -> Layout:
    """device "cuda": each worker gets the GPU of its local rank (its transport rank on this machine),
    cuda:<rank % GPUs>; remote expert workers resolve theirs from LOCAL_RANK where they run.
    num_gpus overrides torch.cuda.device_count() (tests)."""
    if rt.colocated and mode != "async":
        raise ValueError(f"colocated is an async layout (mode 'async'), not {mode!r}: the sync engine's ranks "
                         "already hold a replica and an expert shard each")
    if mode == "async":
        A, E = len(rt.replica_tps), rt.expert_workers
        if E > cfg.num_experts:
            raise ValueError(f"expert_workers={E} exceeds the model's {cfg.num_experts} experts")
        first_expert_rank, world = A, A + E
        pairs = [(a, A + e) for a in range(A) for e in range(E)] + [(A + e, a) for a in range(A) for e in range(E)]
    elif mode == "sync":
        if rt.devices % rt.attention_tp:
            raise ValueError(f"sync: attention_tp={rt.attention_tp} must divide devices={rt.devices} (DP x TP)")
        A = E = rt.devices // rt.attention_tp      # one rank per DP group (emulated TP: one process per group)
        if E > cfg.num_experts:
            raise ValueError(f"devices={E} exceeds the model's {cfg.num_experts} experts")
        first_expert_rank, world = 0, A
        pairs = [(i, j) for i in range(A) for j in range(A) if i != j]   # self-sends stay local (Loopback)
    else:
        raise ValueError(f"mode must be async or sync, got {mode!r}")
    placement = placement or default_placement(cfg, rt, E)
    if placement.num_workers != E:
        raise ValueError(f"placement is for {placement.num_workers} expert workers, the engine has {E}")
    shard = {w: {l: placement.experts_on(w, l) for l in cfg.moe_layer_ids} for w in range(E)}
    emulated = rt.compute == "emulated"
    hidden = rt.emulated_hidden if emulated else cfg.hidden_size
    # A ring holds a few of the largest messages: a replica's full step of activations plus routing.
    budget = max(rt.replica_budgets) if mode == "async" else rt.token_budget
    ring = max(rt.ring_mb * 2**20, 3 * budget * (hidden * 4 + cfg.top_k * 16) + 2**16) if not emulated \
        else max(2**20, 4 * budget * (hidden * 4 + cfg.top_k * 16))
    common = dict(model_dir=model_dir, model_cfg=cfg, runtime=rt, placement=placement,
                  first_expert_rank=first_expert_rank, dtype=dtype, send_kv=send_kv)
    transport = _transport(rt, world, pairs, ring, num_gpus)
    local = A if mode == "async" and rt.remote_experts else world

    def dev(rank: int) -> str:      # ranks past `local` run on another machine and pick their own GPU there
        return worker_device(device, rank, num_gpus) if rank < local else device

    if mode == "async":
        # colocated: expert worker e runs on device e, its replica's (real compute: TP 1, the same cuda:i).
        owner = [a for a in range(A) for _ in rt.replica_devices(a)] if rt.colocated else None
        expert_dev = (lambda e: dev(owner[e])) if rt.colocated else (lambda e: dev(A + e))
        # colocated + emulated: the device's expert busy time, which stretches its replica's attention
        # (asap.workers.emulation.shared_device); real compute shares the real device.
        busy = _device_records(E, A) if rt.colocated and emulated else None
        specs = [WorkerSpec("attention", a, a, transport=transport, expert_ids=None, device=dev(a),
                            shared_devices=tuple(busy[d] for d in rt.replica_devices(a)) if busy else (), **common)
                 for a in range(A)]
        specs += [WorkerSpec("expert", A + e, e, transport=transport, expert_ids=shard[e], device=expert_dev(e),
                             shared_devices=(busy[e],) if busy else (), **common)
                  for e in range(E)]
        if rt.remote_experts:      # the experts run elsewhere (asap/workers/remote.py); they join the same group
            return Layout([s for s in specs if s.role == "attention"], transport, A, specs[A:])
    else:
        specs = [WorkerSpec("rank", i, i, transport=transport, expert_ids=shard[i], device=dev(i), **common)
                 for i in range(A)]
    return Layout(specs, transport, A)
