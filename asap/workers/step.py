"""Drive one replica step through the step pipeline: the one loop body both engines' workers share.

The pipeline (asap.pipeline.step) says what comes next; this file does it with
the Replica's model stages and an expert exchange (asap.workers.exchange):
point-to-point in the async attention loop, all-to-all in the sync rank loop.
"""
from __future__ import annotations

import time

from asap.pipeline.step import Attend, Dispatch, StepPipeline, Wait


def run_step(ctx, replica, mbs: list, exchange, attend=None, inputs_in: float | None = None) -> StepPipeline:
    """Run every micro-batch of `mbs` through every layer; mb.h ends as the last layer's output.
    attend(replica, mb, layer) -> StageOut defaults to replica.attention. inputs_in: when the step's
    inputs were in (Replica.inputs_in; default now). Raises asap.comm.CommTimeout if the experts do not
    answer within ctx.comm_timeout_s."""
    compute = replica.compute
    pipe = StepPipeline(len(mbs), compute.cfg.moe_layers)
    outs, residual = {}, {}
    # When each micro-batch's next input was in (told to emulated compute, asap.workers.clock; real kernels
    # wait for real): the step's inputs, then 0.0 after its own attention (the next op follows it on the
    # device), then its combine's arrival.
    ready = [time.monotonic() if inputs_in is None else inputs_in] * len(mbs)
    while True:
        a = pipe.next()
        if isinstance(a, Attend):
            exchange.poll()          # file combines that came meanwhile: their arrival times feed the depth policy
            mb = mbs[a.mb]
            compute.inputs_ready(ready[a.mb])
            ready[a.mb] = 0.0
            with ctx.spans.span("compute"):
                t0 = time.monotonic()
                s = attend(replica, mb, a.layer) if attend else replica.attention(mb, a.layer)
                compute.synchronize()        # on a GPU: the kernels' time, not their launch (no-op on CPU)
                took = time.monotonic() - t0
            if s.x is None:
                mb.h = s.h
            else:
                outs[a.mb] = s
            pipe.attended(a.mb, a.layer, took)
        elif isinstance(a, Dispatch):
            s = outs.pop(a.mb)
            residual[a.mb] = s.h
            with ctx.spans.span("compute"):
                exchange.dispatch(a.mb, a.layer, s)
            pipe.dispatched(a.mb, a.layer, time.monotonic())
        elif isinstance(a, Wait):
            partial = exchange.combine(a.mb, a.layer, ctx.comm_timeout_s)
            arrived = exchange.arrival(a.mb, a.layer)
            pipe.combined(a.mb, a.layer, arrived)
            ready[a.mb] = time.monotonic() if arrived is None else arrived
            with ctx.spans.span("compute"):
                mbs[a.mb].h = compute.combine(residual.pop(a.mb), [partial])
        else:
            pipe.finish()
            return pipe
