"""How long a replica's attention ops took, for the adaptive depth policy, without a host sync on a GPU.

The depth policy (asap.pipeline.depth.StepDepth) reads, once per step, the step's mean attention
time per (micro-batch, layer): the sum of what `Runner.attend` returned over the number of attends.

On a CPU an op has run when its call returns: the timer reads the monotonic clock around it, as
the runtime always did (compute.synchronize() is still called, a no-op there, so emulated and CPU
workers measure exactly what they did before).

On a GPU the call only queues kernels. Waiting for them after every op would be a host sync per
attention (two per MoE layer per micro-batch) for the sake of a statistic. Instead each op is
bracketed by two CUDA events recorded on the compute stream, and an op's duration is read only
once its end event has run (`query()`, which never blocks). Each `stop` returns the durations of
the ops that finished since the previous `stop`, oldest first, so every op is counted exactly
once, usually one op late (in an MoE layer the dispatch's count copy already waited for the
attention's kernels, asap.comm.primitives.dispatch_layout, so its end event has run by the next
attend). Why a late figure is fine: the policy changes k only at a step boundary, from a whole
step's mean over k x layers ops (a hundred or more on a real model); moving the last op or two
of one step into the next moves that mean by a percent or so, and in steady state by nothing,
as each step hands as much to the next as it got from the one before.
"""
from __future__ import annotations

import time
from collections import deque

import torch

MAX_OPEN = 4096      # ops whose events are unread; past this the oldest is waited for (stay bounded)


class AttentionTimer:
    """start() before an attention op, stop(token) after it -> seconds to report for the depth policy.

    event: a torch.cuda.Event-like class; stream: () -> the compute stream to record on. Both default
    to CUDA's on a CUDA compute and exist so tests can time the GPU path without a GPU."""

    def __init__(self, compute, event=None, stream=None):
        self.compute = compute
        device = getattr(compute, "device", None)
        on_gpu = event is not None or (device is not None and torch.device(device).type == "cuda")
        self.event = stream_of = None
        if on_gpu:
            self.event = event or torch.cuda.Event
            stream_of = stream or (lambda: torch.cuda.current_stream(device))
        self.stream = stream_of
        self._open: deque[tuple[object, object]] = deque()     # (start, end) events, oldest first

    @property
    def on_gpu(self) -> bool:
        return self.event is not None

    def start(self):
        if not self.on_gpu:
            return time.monotonic()
        return self._record()

    def stop(self, token) -> float:
        if not self.on_gpu:
            self.compute.synchronize()      # a no-op on a CPU; kept so the CPU path is what it always was
            return time.monotonic() - token
        self._open.append((token, self._record()))
        return self._resolve(force=len(self._open) > MAX_OPEN)

    def _record(self):
        ev = self.event(enable_timing=True)
        ev.record(self.stream())
        return ev

    def _resolve(self, force: bool = False) -> float:
        """Seconds of the ops whose end event has run, taken off the open list in order. force: wait for
        the oldest one (only when the list is over MAX_OPEN, so it never grows without bound)."""
        took = 0.0
        while self._open:
            start, end = self._open[0]
            if force:
                end.synchronize()          # one op's end, not the device; then the rest only if done
                force = False
            elif not end.query():
                break
            self._open.popleft()
            took += start.elapsed_time(end) / 1e3
        return took
