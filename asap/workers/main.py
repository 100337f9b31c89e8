"""A worker process: set-up, the loop for its role, and tear-down.

Roles: "attention" (async replica), "expert" (async expert shard), "rank"
(sync baseline: replica + expert shard). A worker exits when told to, when the
engine's stop event is set, or as soon as its parent process is gone.
"""
from __future__ import annotations

import ctypes
import os
import queue as queue_mod
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing import parent_process

import torch

from asap.config import ModelConfig, RuntimeConfig
from asap.workers.messages import Abort, Failure, Ready, Shutdown, Spans, Submit
from asap.workers.spans import SpanRecorder


@dataclass
class WorkerSpec:
    role: str
    rank: int                    # transport rank
    index: int                   # replica index (attention/rank) or expert-worker index
    model_dir: str
    model_cfg: ModelConfig
    runtime: RuntimeConfig
    transport: object            # a TransportSpec
    placement: object            # asap.scheduler.placement.Placement over the expert workers
    first_expert_rank: int       # transport rank of expert worker 0
    expert_ids: dict | None      # layer -> experts this worker holds (expert workers and sync ranks)
    dtype: str = "float32"
    device: str = "cpu"
    send_kv: bool = True
    # colocated + emulated: the expert busy records (asap.workers.emulation.shared_device.DeviceBusy) of the
    # devices this worker shares: an expert worker's own device (it writes), a replica's attention_tp devices (it
    # reads). Shared memory, so it travels only in the spec a worker is started with.
    shared_devices: tuple = ()


class WorkerContext:
    def __init__(self, spec: WorkerSpec, control, results, stop):
        self.spec, self.control, self.results, self.stop = spec, control, results, stop
        self.spans = SpanRecorder(f"{spec.role}{spec.index}")
        self.comm_timeout_s = spec.runtime.comm_timeout_s
        self._parent = parent_process()
        self._next_check = 0.0
        self.finished = lambda: False    # a remote expert worker: set once every replica has closed

    def engine_alive(self) -> bool:
        """Whether the engine process that started this worker still runs (waits on peers give up if not)."""
        return self._parent is None or self._parent.is_alive()

    def running(self) -> bool:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + 0.2
            if (self._parent is not None and not self._parent.is_alive()) or self.finished():
                self.stop.set()
        return not self.stop.is_set()

    def intake(self, replica, block: bool, wait_s: float = 0.05) -> bool:
        """Move submitted requests into the replica; wait up to wait_s for one when idle."""
        t0 = time.monotonic()
        timeout = wait_s if block else (wait_s or None)
        while True:
            try:
                msg = self.control.get(timeout=timeout) if timeout else self.control.get_nowait()
            except queue_mod.Empty:
                break
            timeout = None
            if isinstance(msg, Shutdown):
                self.stop.set()
                break
            if isinstance(msg, Submit):
                replica.intake(msg)
            elif isinstance(msg, Abort):      # between steps: its remaining chunks are never scheduled
                replica.fail([msg.request_id], "aborted")
        if block or wait_s:
            self.spans.add("idle", t0, time.monotonic())
        return replica.has_work

    def flush(self, force: bool = False):
        spans = self.spans.take(force)
        if spans:
            self.results.put(Spans(self.spans.worker, spans))


def _die_with_parent():
    try:   # Linux: the kernel kills us if the engine process dies, even by SIGKILL
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def worker_device(device: str, local_rank: int, num_gpus: int | None = None) -> str:
    """The device one worker runs on. "cuda" means this process's own GPU: cuda:<local rank> (its
    rank among the processes on this machine; LOCAL_RANK under torchrun), wrapping around when
    there are fewer GPUs than workers. "cpu" and an explicit "cuda:N" are kept as given."""
    if device != "cuda":
        return device
    n = torch.cuda.device_count() if num_gpus is None else num_gpus
    if n < 1:
        raise ValueError("device 'cuda' was asked for but no GPU is visible")
    return f"cuda:{local_rank % n}"


def _compute(spec: WorkerSpec, attention: bool):
    """(compute, emulation): emulated compute waits out the cost model and charges its link
    (asap.workers.emulation); real compute has the real link (emulation None)."""
    if spec.runtime.compute == "emulated":
        from asap.workers.emulation.worker import emulated_worker
        return emulated_worker(spec)
    from asap.workers.compute import RealCompute
    return RealCompute(spec.model_dir, spec.expert_ids, attention, getattr(torch, spec.dtype), spec.device), None


def expert_selector(rt: RuntimeConfig):
    """An async expert worker's selector, built from the fields asap.sim.from_runtime gives the simulator."""
    from asap.pipeline.depth import expert_batch_cap
    from asap.scheduler.expert_select import AggregationWindow, make_selector
    sel = make_selector(rt.selector, max_batch_tokens=expert_batch_cap(rt.token_budget, rt.expert_batch_tokens),
                        max_wait_s=rt.expert_max_wait_s)
    return AggregationWindow(sel, rt.aggregation_window_ms / 1000) if rt.aggregation_window_ms > 0 else sel


def worker_main(spec: WorkerSpec, control, results, stop, heartbeat=None):
    _die_with_parent()
    # Ctrl-C or a SIGTERM sent to the whole process group is the engine's to handle (drain, then stop us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(spec.runtime.threads_per_worker)
    if spec.device == "cuda":       # started by torchrun (remote experts): LOCAL_RANK names our GPU
        spec.device = worker_device("cuda", int(os.environ.get("LOCAL_RANK", spec.rank)))
    if spec.device.startswith("cuda"):
        gpu = torch.device(spec.device)
        torch.cuda.set_device(gpu)                          # before anything touches a GPU
        os.environ["LOCAL_RANK"] = str(gpu.index)           # the NCCL transport picks the same GPU
    ctx = WorkerContext(spec, control, results, stop)
    transport = None
    try:
        from asap.scheduler.replica import ReplicaScheduler
        from asap.workers.replica import Replica
        rt = spec.runtime
        compute, emulation = _compute(spec, attention=spec.role != "expert")
        transport = spec.transport.connect(spec.rank)
        transport.alive = ctx.engine_alive      # a send blocked on a full ring gives up once the engine is gone
        if rt.remote_experts and spec.role == "expert":
            replicas = set(range(rt.attention_workers))
            ctx.finished = lambda: replicas <= transport.closed_peers
        from asap.workers.destinations import Destinations
        dest = Destinations(spec.placement, spec.first_expert_rank, compute.device)
        ctx.spans.sync = compute.synchronize if compute.device.type == "cuda" else None
        if heartbeat is not None:       # asap.workers.heartbeat: liveness the engine watches
            heartbeat.attach(ctx)
        results.put(Ready(spec.rank, spec.role))

        def replica():      # a fleet's replicas differ in token budget (RuntimeConfig.replica_budgets)
            budget = rt.replica_budgets[spec.index] if spec.role == "attention" else rt.token_budget
            sched = ReplicaScheduler(budget, rt.order, rt.max_queue)
            return Replica(spec.index, compute, sched, results, spec.send_kv)

        if spec.role == "attention":
            from asap.workers.async_loop import attention_loop
            attention_loop(ctx, replica(), transport, dest, rt.microbatches, rt.adaptive_depth, emulation)
        elif spec.role == "expert":
            from asap.workers.async_loop import expert_loop
            expert_loop(ctx, compute, transport, expert_selector(rt), emulation)
        else:
            from asap.workers.sync_loop import rank_loop
            rank_loop(ctx, replica(), compute, transport, dest, tbo=rt.microbatches > 1, emulation=emulation)
    except Exception:  # noqa: BLE001 - reported to the engine, which fails the affected requests
        results.put(Failure(f"{spec.role}{spec.index}", traceback.format_exc()))
    finally:
        ctx.flush(force=True)
        if transport is not None:
            try:
                transport.close()
            except Exception:  # noqa: BLE001
                pass
        if ctx._parent is not None and not ctx._parent.is_alive():
            results.cancel_join_thread()   # nobody will read it; do not hang on exit
