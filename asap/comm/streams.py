"""A step's copies between a GPU and host memory, on a CUDA stream of their own.

What a worker moves across the comm boundary (a dispatch or a combine written into a shm ring, a
received dispatch or partial moved onto its device) is communication, not compute: it runs on one
dedicated stream per device, so a copy waits only for the kernels that made its input, not for
whatever the compute stream has queued since, and the compute stream's next kernels never queue
behind a copy.

The order between the streams is explicit, never an accident of which stream was free:
  - device to host (`copy_to_host`): the producer's stream (the caller's current one) records an
    event once the tensor is made; the comm stream waits on that event and copies; the host then
    waits for that copy alone (its event, not the device) before the bytes are published, since a
    ring record must be whole when its reader sees it. The source is the caller's, alive for the
    whole call.
  - host to device (`to_device`): the comm stream copies (asynchronously from pinned memory); the
    consumer's stream (the caller's current one) waits on an event recorded after the copy, so the
    first kernel that reads the result runs after it. The result was allocated on the comm stream and
    is used on the consumer's: record_stream tells the caching allocator, so its memory is not handed
    out again before the consumer is done with it. The host source is kept referenced until the copy's
    event has run: a pooled receive buffer (asap.comm.transport.BufferPool) is reused as soon as
    nobody refers to it, and a copy still reading it must count as someone.
Anything else (CPU to CPU, device to device, a CPU-only process) is the plain `.to` / `copy_` it
replaces. One thread per process uses these (the worker's loop); torch.distributed's transport has
its own stream and thread (asap.comm.dist).
"""
from __future__ import annotations

from collections import deque

import torch

MAX_KEPT = 1024      # host sources of copies not yet known to be done; past this the oldest is waited for


class CommStream:
    """One device's communication stream. event / current_stream / stream: CUDA's by default; tests
    pass fakes to check the ordering without a GPU."""

    def __init__(self, device, event=None, current_stream=None, stream=None):
        self.device = torch.device(device)
        self.event = event or torch.cuda.Event
        self.current_stream = current_stream or torch.cuda.current_stream
        self.stream = stream if stream is not None else torch.cuda.Stream(self.device)
        self._kept: deque[tuple[object, torch.Tensor]] = deque()    # (copy done event, host source)

    def to_host(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst.copy_(src) for a device src and a host dst, on the comm stream; returns once dst holds it."""
        self.stream.wait_event(self._mark(self.current_stream(self.device)))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        self._mark(self.stream).synchronize()
        self._release()

    def to_device(self, src: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """src.to(this device, dtype) for a host src, on the comm stream; the caller's stream is ordered
        after the copy, the host is not."""
        consumer = self.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = src.to(self.device, dtype, non_blocking=True)
        done = self._mark(self.stream)
        consumer.wait_event(done)
        if out.device.type == "cuda":       # (a test's stand-in device may be the CPU)
            out.record_stream(consumer)
        self._kept.append((done, src))
        self._release()
        return out

    def _mark(self, stream):
        ev = self.event()
        ev.record(stream)
        return ev

    def _release(self) -> None:
        """Drop the host sources whose copy has run (oldest first; query() never blocks). Over MAX_KEPT,
        wait for the oldest: bounded memory even if nothing else ever waits."""
        while self._kept:
            done, _ = self._kept[0]
            if len(self._kept) > MAX_KEPT:
                done.synchronize()
            elif not done.query():
                return
            self._kept.popleft()


_STREAMS: dict[torch.device, CommStream] = {}


def comm_stream(device) -> CommStream:
    """This process's communication stream on a CUDA device (made once per device)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    s = _STREAMS.get(device)
    if s is None:
        s = _STREAMS[device] = CommStream(device)
    return s


def copy_to_host(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) into host memory: on the comm stream when src is on a GPU, else as is."""
    if src.device.type == "cuda" and dst.device.type == "cpu":
        comm_stream(src.device).to_host(dst, src)
    else:
        dst.copy_(src)


def to_device(t: torch.Tensor, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """t.to(device, dtype): a host tensor bound for a GPU goes on the comm stream, anything else as is."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return comm_stream(device).to_device(t, dtype)
    return t.to(device, dtype)
