"""Drive one replica step through the step pipeline: the one loop body both engines' workers share.

The pipeline (asap.pipeline.step.drive) says what comes next; this file's
driver does it with the Replica's model stages and an expert exchange
(asap.workers.exchange): point-to-point in the async attention loop, all-to-all
in the sync rank loop. An emulated worker drives with a subclass that also
tells its device clock when inputs were in (asap.workers.emulation.step).
"""
from __future__ import annotations

import time

from asap.pipeline.step import StepPipeline, drive
from asap.workers.timing import AttentionTimer


class Runner:
    """The runtime's StepDriver: real time, blocking waits."""

    def __init__(self, ctx, replica, mbs: list, exchange, attend=None):
        self.ctx, self.replica, self.mbs, self.exchange = ctx, replica, mbs, exchange
        self.compute = replica.compute
        self._attend = attend
        self.timer = attention_timer(replica)
        self.outs, self.residual = {}, {}

    def attend(self, i: int, layer: int) -> float:
        """Run (i, layer)'s attention side; returns seconds of attention for the depth policy: this op's on a
        CPU, on a GPU those of the ops whose kernels have finished since the last attend (no host sync:
        asap.workers.timing)."""
        self.exchange.poll()       # file combines that came meanwhile: their arrival times feed the depth policy
        mb = self.mbs[i]
        with self.ctx.spans.span("compute"):
            t0 = self.timer.start()
            s = self._attend(self.replica, mb, layer) if self._attend else self.replica.attention(mb, layer)
            took = self.timer.stop(t0)
        if s.x is None:
            mb.h = s.h
        else:
            self.outs[i] = s
        return took

    def dispatch(self, i: int, layer: int) -> float:
        s = self.outs.pop(i)
        self.residual[i] = s.h
        with self.ctx.spans.span("compute"):
            self.exchange.dispatch(i, layer, s, self.mbs[i].deadline, time.monotonic())
        return time.monotonic()

    def wait(self, i: int, layer: int) -> float:
        partial = self.exchange.combine(i, layer, self.ctx.comm_timeout_s)
        arrived = self.exchange.arrival(i, layer)
        with self.ctx.spans.span("compute"):
            self.mbs[i].h = self.compute.combine(self.residual.pop(i), [partial])
        return time.monotonic() if arrived is None else arrived


def attention_timer(replica) -> AttentionTimer:
    """The replica's timer, which outlives a step: on a GPU the ops a step leaves unread are read, and
    counted, in the next. A stand-in replica without one gets a fresh timer (nothing is carried over)."""
    timer = getattr(replica, "attention_timer", None)
    return timer if timer is not None else AttentionTimer(replica.compute)


def run_step(ctx, replica, mbs: list, exchange, attend=None, runner=Runner) -> StepPipeline:
    """Run every micro-batch of `mbs` through every layer; mb.h ends as the last layer's output.
    attend(replica, mb, layer) -> StageOut defaults to replica.attention. runner: the driver class (an
    emulated worker's: asap.workers.emulation). Raises asap.comm.CommTimeout if the experts do not answer
    within ctx.comm_timeout_s."""
    pipe = StepPipeline(len(mbs), replica.compute.cfg.moe_layers)
    drive(pipe, runner(ctx, replica, mbs, exchange, attend))
    return pipe
