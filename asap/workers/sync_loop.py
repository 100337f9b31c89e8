"""The synchronous DP+EP baseline (SGLang/vLLM DP-attention + EP) on the same parts.

Every rank is an attention replica plus 1/N of the experts. A step starts only
when every rank starts it (idle ranks run an empty batch), and every MoE layer
is an all-to-all dispatch plus an all-to-all combine that every rank must reach.
It reuses the Replica, the scheduler, the model stages and the comm primitives
of the async engine: only this loop differs.
"""
from __future__ import annotations

import time

import torch

from asap.comm import CombineInbox, Header, Kind, Mailbox, WorkQueue, combine_recv, combine_send, dispatch_recv, \
    dispatch_send
from asap.comm import CommTimeout
from asap.comm.loopback import Loopback
from asap.workers.replica import Replica


class _StepSelector:
    """Selects every dispatch of one (step, layer, micro-batch): the all-to-all's receive side."""

    def __init__(self):
        self.key = None

    def select(self, ready, now):   # WorkInfo.key = (src, replica, layer, microbatch, seq); seq is the step
        return [i for i, w in enumerate(ready) if (w.key[4], w.key[2], w.key[3]) == self.key]


def rank_loop(ctx, replica: Replica, compute, transport, dest, tbo: bool):
    transport = Loopback(transport)
    mailbox = Mailbox(transport)
    inbox, queue, sel = CombineInbox(mailbox), WorkQueue(mailbox), _StepSelector()
    ranks = list(range(transport.world_size))
    k = 2 if tbo else 1
    step = 0
    while ctx.running():
        ctx.intake(replica, block=False, wait_s=0.002 if not replica.has_work else 0.0)
        t0 = time.monotonic()
        try:
            anyone = _barrier(mailbox, transport, ranks, step, replica.has_work, ctx.comm_timeout_s)
        except CommTimeout as e:
            replica.fail(list(replica.prompts), f"a rank did not reach the step barrier: {e}")
            ctx.flush()
            continue
        ctx.spans.add("stall" if replica.has_work else "idle", t0, time.monotonic())
        if not anyone:
            replica.flush_routing()
            step += 1
            ctx.flush()
            continue
        schedule, mbs = replica.plan(time.monotonic(), k, exact_k=True)
        pending: list = [None] * k
        try:
            for layer in range(compute.cfg.num_layers):
                for i, mb in enumerate(mbs):
                    if pending[i] is not None:
                        mb.h = _collect(ctx, compute, inbox, pending[i])
                        pending[i] = None
                    with ctx.spans.span("compute"):
                        s = replica.attention(mb, layer)
                    if s.x is None:
                        mb.h = s.h
                        continue
                    pc = dispatch_send(transport, s.x, s.topk_ids, s.topk_weights, dest(layer, s.topk_ids),
                                       replica=replica.index, layer=layer, microbatch=i, seq=step, always_to=ranks)
                    _serve(ctx, compute, queue, transport, sel, (step, layer, i), len(ranks))
                    pending[i] = (s.h, pc)
            for i, mb in enumerate(mbs):
                if pending[i] is not None:
                    mb.h = _collect(ctx, compute, inbox, pending[i])
            with ctx.spans.span("compute"):
                replica.finish(schedule, mbs)
        except CommTimeout as e:
            replica.fail(list(schedule), f"a rank did not reach the all-to-all: {e}")
        step += 1
        ctx.flush()


def _barrier(mailbox, transport, ranks, step, has_work, timeout) -> bool:
    """Every rank announces whether it has work; returns whether any rank does. Waits for all ranks."""
    flag = Header(Kind.CONTROL, transport.rank, -1, int(has_work), step, 0, aux=step)
    for r in ranks:
        transport.send(r, flag, [])
    anyone = False
    for r in ranks:
        msg = mailbox.take_control(src=r, timeout=timeout)
        if msg is None:
            raise CommTimeout(f"rank {r} missed step {step}")
        anyone |= bool(msg.header.microbatch)
    return anyone


def _serve(ctx, compute, queue, transport, sel, key, n):
    """The all-to-all's expert side: wait for the dispatch of every rank, then run this shard on each."""
    sel.key, got = key, []
    t0 = time.monotonic()
    while len(got) < n:
        items = dispatch_recv(queue, timeout=ctx.comm_timeout_s, selector=sel)
        if not items:
            raise CommTimeout(f"all-to-all {key}: {len(got)}/{n} ranks arrived")
        got.extend(items)
    ctx.spans.add("stall", t0, time.monotonic())
    with ctx.spans.span("compute"):
        layer = key[1]
        sizes = [it.x.shape[0] for it in got]
        partial = compute.experts(layer, torch.cat([it.x for it in got]), torch.cat([it.topk_ids for it in got]),
                                  torch.cat([it.topk_weights for it in got]))
        for it, part in zip(got, partial.split(sizes)):
            combine_send(transport, it, part.contiguous())


def _collect(ctx, compute, inbox, pend):
    residual, pc = pend
    with ctx.spans.span("stall"):
        partial = combine_recv(inbox, pc, timeout=ctx.comm_timeout_s)
    with ctx.spans.span("compute"):
        return compute.combine(residual, [partial])
