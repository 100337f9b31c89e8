"""The asynchronous loops: attention replicas and expert workers, with no barrier between replicas.

An attention replica schedules its own requests and drives each step through
the shared step pipeline (asap.workers.step.run_step) with a point-to-point
exchange: while the experts work on micro-batch i's layer L, it runs the
attention of the other micro-batches. An expert worker runs whatever
dispatched work is ready, from any replica and any layer, merging same-layer
items when the selector says so. Nothing here waits on more than the expert
workers one dispatch went to.
"""
from __future__ import annotations

import time

from asap.comm import CommTimeout, Mailbox, WorkQueue, dispatch_recv
from asap.pipeline.depth import StepDepth
from asap.workers.exchange import PointToPoint, serve_experts
from asap.workers.replica import Replica
from asap.workers.step import Runner, run_step


def attention_loop(ctx, replica: Replica, transport, dest, k: int, adaptive: bool, emulation=None):
    """dest(layer, topk_ids) -> transport rank per (token, expert) pair (asap.workers.destinations);
    emulation: an emulated worker's wrappers (asap.workers.emulation.worker.Emulation), None for a real one."""
    mailbox = Mailbox(transport, alive=ctx.engine_alive)
    exchange = (emulation.point_to_point if emulation else PointToPoint)(transport, mailbox, dest, replica.index,
                                                                         ctx.spans)
    depth = StepDepth(k, adaptive)
    while ctx.running():
        if not ctx.intake(replica, block=not replica.has_work):
            replica.flush_routing()
            ctx.flush()
            continue
        schedule, mbs = replica.plan(time.monotonic(), depth.k)     # each with its earliest TTFT deadline
        try:
            runner = emulation.runner(replica.inputs_in(schedule)) if emulation else Runner
            step = run_step(ctx, replica, mbs, exchange, runner=runner)
            with ctx.spans.span("compute"):
                replica.finish(schedule, mbs)
            depth.end_step(step)
        except CommTimeout as e:
            exchange.abandon()
            replica.fail(list(schedule), f"expert workers did not answer: {e}")
        ctx.flush()


def expert_loop(ctx, compute, transport, selector, emulation=None):
    queue = WorkQueue(Mailbox(transport))      # its loop checks ctx.running() every 50 ms
    if emulation:                              # choose in device time
        selector = emulation.selector(selector, queue.mailbox)
    while ctx.running():
        t0 = time.monotonic()
        items = dispatch_recv(queue, timeout=0.05, selector=selector)
        ctx.spans.add("idle", t0, time.monotonic())
        if not items:
            ctx.flush()
            continue
        with ctx.spans.span("compute"):
            serve_experts(compute, transport, items)
        ctx.flush()
