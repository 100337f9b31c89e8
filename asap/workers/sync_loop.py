"""The synchronous DP+EP baseline (SGLang/vLLM DP-attention + EP) on the same parts.

Every rank is an attention replica plus 1/N of the experts. A step starts only
when every rank starts it (idle ranks run an empty batch): a step barrier of
typed flags that carry their step number (asap.comm.Mailbox.take_barrier checks
them on receipt). Every MoE layer is an all-to-all dispatch plus an all-to-all
combine that every rank must reach (asap.workers.exchange.AllToAll). The step
itself is the same pipeline the async replicas drive (asap.workers.step):
only the exchange and the barrier differ.

While every rank is idle nobody polls: each rank blocks on its control queue,
and a listener thread blocks on the transport; whichever wakes first (a request
for this rank, or a peer's flag for the next step) starts the next barrier.
"""
from __future__ import annotations

import threading
import time

import torch

from asap.comm import CommTimeout, Mailbox
from asap.comm.headers import barrier as barrier_flag
from asap.comm.loopback import Loopback
from asap.model.stages import StageOut
from asap.workers.exchange import AllToAll
from asap.workers.messages import Wake
from asap.workers.replica import Replica
from asap.workers.step import Runner, run_step


def rank_loop(ctx, replica: Replica, compute, transport, dest, tbo: bool, emulation=None):
    """emulation: an emulated worker's wrappers (asap.workers.emulation.worker.Emulation), None for a real one."""
    transport = Loopback(transport)
    mailbox = Mailbox(transport, alive=ctx.engine_alive)
    exchange = (emulation.all_to_all if emulation else AllToAll)(transport, mailbox, dest, replica.index, compute,
                                                                 ctx.spans)
    ranks = exchange.ranks
    k = 2 if tbo else 1
    step, sent = 0, False
    # Emulated: every flag says when its rank's device finished the last step, so the step starts on every
    # rank at once, when the slowest is done (the simulator's lock-step), not when each host gets there.
    done_ns = emulation.done_ns if emulation else (lambda: 0)
    while ctx.running():
        ctx.intake(replica, block=False, wait_s=0.0)
        t0 = time.monotonic()
        try:
            flags = barrier(mailbox, transport, ranks, step, replica.has_work, ctx.comm_timeout_s, send=not sent,
                            ready_ns=done_ns())
        except CommTimeout as e:     # the same step is tried again: the flags that came stay filed
            sent = False
            replica.fail(list(replica.prompts), f"a rank did not reach the step barrier: {e}")
            ctx.flush()
            continue
        ctx.spans.add("stall" if replica.has_work else "idle", t0, time.monotonic())
        sent = False
        if not any(flags.values()):
            replica.flush_routing()
            ctx.flush()
            step += 1
            sent = idle_wait(ctx, replica, mailbox, transport, ranks, step, done_ns())
            continue
        schedule, mbs = replica.plan(time.monotonic(), k)
        mbs += [replica.empty_microbatch() for _ in range(k - len(mbs))]    # every rank runs all k
        exchange.begin_step(step)
        try:
            runner = emulation.runner(max(replica.inputs_in(schedule), mailbox.barrier_ready)) if emulation else Runner
            run_step(ctx, replica, mbs, exchange, attend=_attend, runner=runner)
            with ctx.spans.span("compute"):
                replica.finish(schedule, mbs)
        except CommTimeout as e:
            exchange.abandon()
            replica.fail(list(schedule), f"a rank did not reach the all-to-all: {e}")
        step += 1
        ctx.flush()


def _attend(replica, mb, layer: int) -> StageOut:
    """The replica's attention stage; an empty micro-batch (an idle rank) still brings an empty dispatch."""
    if mb.batch.num_tokens:
        return replica.attention(mb, layer)
    cfg = replica.compute.cfg
    if not cfg.moe_layers[layer]:
        return StageOut(h=mb.h)
    empty = torch.zeros(0, cfg.top_k, device=mb.h.device)
    return StageOut(h=mb.h, x=mb.h, topk_ids=empty.long(), topk_weights=empty)


def barrier(mailbox, transport, ranks, step: int, has_work: bool, timeout: float, send: bool = True,
            ready_ns: int = 0) -> dict:
    """Every rank announces whether it has work for `step`; returns {rank: has work}. Waits for all ranks.
    ready_ns: when this rank's emulated device finished its last step (0: real)."""
    if send:
        flag = barrier_flag(transport.rank, step, has_work, ready_ns=ready_ns)
        for r in ranks:
            transport.send(r, flag, [])
    flags = mailbox.take_barrier(step, ranks, timeout)
    if flags is None:
        missing = sorted(set(ranks) - mailbox.barriers.get(step, {}).keys())
        raise CommTimeout(f"ranks {missing} missed the barrier of step {step}")
    return flags


def idle_wait(ctx, replica, mailbox, transport, ranks, step: int, ready_ns: int = 0) -> bool:
    """Block until this rank gets a request or a peer starts `step`. Returns whether this rank has
    already sent its flag for `step` (it does so at once when a request wakes it, to wake the peers)."""
    if mailbox.has_barrier(step) or replica.has_work:
        return False
    if len(ranks) == 1:
        while ctx.running() and not replica.has_work:
            ctx.intake(replica, block=True, wait_s=0.2)
        return False
    listener = _Listener(transport, ctx.control)
    listener.start()
    sent = False
    try:
        while ctx.running() and not replica.has_work and not listener.got:
            ctx.intake(replica, block=True, wait_s=0.2)
        if replica.has_work and not listener.got:
            # Wake the peers (their listeners get this flag), whose flags then end our listener's wait.
            flag = barrier_flag(transport.rank, step, True, ready_ns=ready_ns)
            for r in ranks:
                transport.send(r, flag, [])
            sent = True
    finally:
        listener.stop.set()
        listener.join()
        for msg in listener.got:
            mailbox.deliver(msg)
    return sent


class _Listener(threading.Thread):
    """Blocks on the transport while the rank blocks on its control queue; the first message it gets
    wakes the rank (a Wake on its own control queue). The main thread only sends meanwhile, but a send
    that finds its ring full (a peer still busy with late messages of an abandoned step) drains this
    rank's inbound rings itself; the transport serialises its receive side (ShmTransport._take_lock;
    DistTransport's receive threads deliver into a queue), so the two never take the same message."""

    def __init__(self, transport, control):
        super().__init__(daemon=True, name="asap-idle-listener")
        self.transport, self.control = transport, control
        self.stop = threading.Event()
        self.got: list = []

    def run(self):
        while not self.stop.is_set():
            msg = self.transport.recv(0.1)
            if msg is not None:
                self.got.append(msg)
                self.control.put(Wake())
                return
