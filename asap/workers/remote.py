"""`asap expert-worker`: expert workers on another machine, started by torchrun.

Two-node launch (node 0 runs the engine and the attention replicas, node 1 the experts):

    # node 1 (experts), E processes; asap's own group meets at node0:29600
    torchrun --nnodes 1 --nproc-per-node 2 -m asap.cli expert-worker --model small-deepseek-v3 \
        --attention-workers 2 --expert-workers 2 --transport gloo --master-addr node0 --master-port 29600
    # node 0 (engine), in Python:
    asap.LLM("small-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, transport="gloo",
             remote_experts=True, master_addr="node0", master_port=29600)

torchrun only launches and supervises the processes (RANK = expert index on that node); the workers
join the engine's torch.distributed group as ranks A..A+E-1. Both nodes need the same model directory
(a preset materialises identically on each: the weights are seeded). A worker exits once every
attention replica has closed its link.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading


class _Report:
    """Stands in for the engine's result queue: failures go to stderr, the rest is dropped."""

    def put(self, msg):
        from asap.workers.messages import Failure
        if isinstance(msg, Failure):
            print(f"[asap expert-worker] {msg.worker} failed:\n{msg.error}", file=sys.stderr, flush=True)

    def cancel_join_thread(self):
        pass


def register(sub):
    from asap.config import RuntimeConfig, add_config_flags
    p = sub.add_parser("expert-worker", help="run expert workers for a remote engine (under torchrun)",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="preset name or HF model directory (same as the engine's)")
    p.add_argument("--index", type=int, default=None, help="expert worker index (default: $RANK from torchrun)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights and activations, as the engine's (asap.LLM dtype; auto: the checkpoint's)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda (this process's GPU: cuda:$LOCAL_RANK) or cuda:N; "
                        "default cuda with --transport nccl, else cpu")
    add_config_flags(p, RuntimeConfig, skip=("remote_experts", "colocated"))   # colocated: no remote experts
    p.set_defaults(func=run)


def remote_spec(args):
    """The WorkerSpec of this expert worker: dtype and device from the flags, not assumed."""
    from asap.config import ModelConfig, RuntimeConfig, config_from_args
    from asap.workers.layout import build_layout
    from asap.model.loader import runtime_dtype
    from asap.model.materialize import resolve_model
    rt = config_from_args(RuntimeConfig, args, remote_experts=True)
    model_dir = resolve_model(args.model, config_only=rt.compute == "emulated")
    index = args.index if args.index is not None else int(os.environ.get("RANK", 0))
    if not 0 <= index < rt.expert_workers:
        raise ValueError(f"expert worker index {index} not in [0, {rt.expert_workers})")
    device = args.device or ("cuda" if rt.transport == "nccl" else "cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    cfg = ModelConfig.from_dir(model_dir)
    dtype = str(runtime_dtype(cfg, None if args.dtype == "auto" else args.dtype)).removeprefix("torch.")
    layout = build_layout(cfg, rt, "async", str(model_dir), dtype, "cpu", False)
    # "cuda" stays unresolved here: worker_main picks cuda:$LOCAL_RANK once it runs.
    return dataclasses.replace(layout.remote[index], device=device)


def run(args) -> int:
    from asap.workers.main import worker_main
    worker_main(remote_spec(args), None, _Report(), threading.Event())
    return 0
