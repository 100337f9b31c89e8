"""The asynchronous loops: attention replicas and expert workers, with no barrier between replicas.

An attention replica schedules its own requests and keeps k >= 2 micro-batches
in flight: while the experts work on micro-batch i's layer L, it runs the
attention of micro-batch i+1 (ping-pong). An expert worker runs whatever
dispatched work is ready, from any replica and any layer, merging same-layer
items when the selector says so. Nothing here waits on more than the expert
workers one dispatch went to.
"""
from __future__ import annotations

import time

import torch

from asap.comm import CombineInbox, CommTimeout, Mailbox, WorkQueue, combine_recv, combine_send, dispatch_recv, \
    dispatch_send
from asap.scheduler.microbatch import AdaptiveDepth
from asap.workers.replica import Replica


def attention_loop(ctx, replica: Replica, transport, dest, k: int, adaptive: bool):
    """dest(layer, topk_ids) -> transport rank per (token, expert) pair (asap.workers.destinations)."""
    inbox = CombineInbox(Mailbox(transport))
    depth = AdaptiveDepth(min_k=2, max_k=max(k, 4)) if adaptive else None
    seq = 0
    while ctx.running():
        if not ctx.intake(replica, block=not replica.has_work):
            replica.flush_routing()
            ctx.flush()
            continue
        kk = depth.k if depth else k
        schedule, mbs = replica.plan(time.monotonic(), kk)
        pending: list = [None] * len(mbs)
        # Earliest TTFT deadline per micro-batch, carried in every dispatch header (deadline-first experts).
        deadlines = [min((replica.scheduler.get(c.request_id).deadline or float("inf")) for c in mb.batch.chunks)
                     for mb in mbs]
        try:
            for layer in range(replica.compute.cfg.num_layers):
                for i, mb in enumerate(mbs):
                    if pending[i] is not None:
                        mb.h = _collect(ctx, replica, inbox, pending[i], depth)
                        pending[i] = None
                    with ctx.spans.span("compute"):
                        t0 = time.monotonic()
                        s = replica.attention(mb, layer)
                        attn_s = time.monotonic() - t0
                        if s.x is None:
                            mb.h = s.h
                            continue
                        pc = dispatch_send(transport, s.x, s.topk_ids, s.topk_weights, dest(layer, s.topk_ids),
                                           replica=replica.index, layer=layer, microbatch=i, seq=seq,
                                           deadline=deadlines[i])
                        seq += 1
                    pending[i] = (s.h, pc, time.monotonic(), attn_s)
            for i, mb in enumerate(mbs):
                if pending[i] is not None:
                    mb.h = _collect(ctx, replica, inbox, pending[i], depth)
            with ctx.spans.span("compute"):
                replica.finish(schedule, mbs)
        except CommTimeout as e:
            replica.fail(list(schedule), f"expert workers did not answer: {e}")
        ctx.flush()


def _collect(ctx, replica, inbox, pend, depth):
    residual, pc, sent_at, attn_s = pend
    with ctx.spans.span("stall"):
        partial = combine_recv(inbox, pc, timeout=ctx.comm_timeout_s)
    if depth is not None:
        depth.update(attn_s, time.monotonic() - sent_at)
    with ctx.spans.span("compute"):
        return replica.compute.combine(residual, [partial])


def expert_loop(ctx, compute, transport, selector):
    queue = WorkQueue(Mailbox(transport))
    while ctx.running():
        t0 = time.monotonic()
        items = dispatch_recv(queue, timeout=0.05, selector=selector)
        ctx.spans.add("idle", t0, time.monotonic())
        if not items:
            ctx.flush()
            continue
        with ctx.spans.span("compute"):
            layer = items[0].header.layer
            sizes = [it.x.shape[0] for it in items]
            partial = compute.experts(layer, torch.cat([it.x for it in items]), torch.cat([it.topk_ids for it in items]),
                                      torch.cat([it.topk_weights for it in items]))
            for it, part in zip(items, partial.split(sizes)):
                combine_send(transport, it, part.contiguous())
        ctx.flush()
