"""Timing attention and moving tensors across the comm boundary without host syncs on a GPU, checked on a CPU.

A GPU stand-in (FakeDevice) gives CUDA-like events and streams: an event's time is the device clock when
it was recorded, and it has "run" (query() is True) only once the device has caught up with it. Every
synchronize on it, on the compute, or on torch.cuda is counted: the GPU path of the step driver's attend
must make none, and the durations must still reach the depth policy (asap.pipeline.depth.StepDepth).
"""
from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import pytest
import torch

import asap.comm.streams as streams
import asap.workers.timing as timing
from asap.model.stages import StageOut
from asap.pipeline.depth import StepDepth
from asap.workers.step import run_step
from asap.workers.timing import AttentionTimer

KERNEL_S = 0.004       # each attention's kernels, in device time


class FakeDevice:
    """A GPU's clock (seconds) and what its host waited for."""

    def __init__(self):
        self.now = 0.0
        self.queued: list["FakeEvent"] = []
        self.syncs: list[str] = []
        self.log: list[tuple] = []

    def catch_up(self) -> None:
        """Everything queued so far has run (in an MoE layer the dispatch's count copy waited for it)."""
        for ev in self.queued:
            ev.done = True
        self.queued.clear()

    def event_class(self):
        device = self

        class FakeEvent:
            count = 0

            def __init__(self, enable_timing: bool = False):
                FakeEvent.count += 1
                self.id, self.t, self.done, self.stream = FakeEvent.count, None, False, None

            def record(self, stream=None):
                self.t, self.stream, self.done = device.now, stream, False
                device.queued.append(self)
                device.log.append(("record", stream, self.id))

            def query(self) -> bool:
                return self.done

            def synchronize(self) -> None:
                """The host waits until this event has run, and with it everything queued before it."""
                device.syncs.append(f"event {self.id}")
                while device.queued and not self.done:
                    device.queued.pop(0).done = True

            def elapsed_time(self, end) -> float:
                assert self.done and end.done, "elapsed_time of an event that has not run"
                return (end.t - self.t) * 1e3

        return FakeEvent


class FakeStream:
    def __init__(self, name: str, device: FakeDevice):
        self.name, self.device = name, device

    def wait_event(self, ev) -> None:
        self.device.log.append(("wait", self.name, ev.id))

    def synchronize(self) -> None:
        self.device.syncs.append(f"stream {self.name}")

    def __repr__(self):
        return self.name


@pytest.fixture
def no_cuda_sync(monkeypatch):
    """torch.cuda's device-wide synchronize, counted (it must not be reached)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("cuda.synchronize"))
    return calls


class _Spans:
    @contextlib.contextmanager
    def span(self, name):
        yield


class _GpuCompute:
    """A compute whose synchronize would be the host sync per attention op the GPU path must not make."""

    def __init__(self, device: FakeDevice, moe_layers):
        self.device_ = device
        self.cfg = SimpleNamespace(moe_layers=moe_layers)
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1

    def combine(self, residual, partials):
        return residual + partials[0]


def _replica(dev: FakeDevice, moe_layers, timer: AttentionTimer | None = None):
    compute = _GpuCompute(dev, moe_layers)

    def attention(mb, layer):
        dev.catch_up()                 # the kernels queued before this launch have run by now
        dev.now += KERNEL_S            # this op's kernels, queued (the host does not wait)
        h = torch.zeros(2, 3)
        if not moe_layers[layer]:
            return StageOut(h=h)
        return StageOut(h=h, x=h, topk_ids=torch.zeros(2, 1, dtype=torch.long), topk_weights=torch.ones(2, 1))

    timer = timer or AttentionTimer(compute, event=dev.event_class(), stream=lambda: FakeStream("compute", dev))
    return SimpleNamespace(compute=compute, attention=attention, attention_timer=timer)


def _exchange():
    return SimpleNamespace(poll=lambda: None, dispatch=lambda *a: None, arrival=lambda mb, layer: None,
                           combine=lambda mb, layer, timeout: torch.zeros(2, 3))


def _ctx():
    return SimpleNamespace(spans=_Spans(), comm_timeout_s=1.0)


def test_the_gpu_path_of_attend_makes_no_host_sync_and_the_depth_policy_still_gets_the_times(no_cuda_sync):
    dev = FakeDevice()
    replica = _replica(dev, moe_layers=(True, True))
    depth = StepDepth(2, adaptive=True)
    means = []
    for _ in range(3):
        mbs = [SimpleNamespace(h=None, deadline=float("inf")) for _ in range(depth.k)]
        pipe = run_step(_ctx(), replica, mbs, _exchange())
        depth.end_step(pipe)
        means.append(pipe.attn_s / pipe.num_attn)
    assert replica.compute.syncs == 0 and dev.syncs == [] and no_cuda_sync == []
    # The first step reads all but its last op (still running when its step ended); each later step reads
    # the previous step's last op and all but its own: every op counted once, one op late.
    assert means[0] == pytest.approx(KERNEL_S * 3 / 4)
    assert means[1:] == [pytest.approx(KERNEL_S)] * 2
    alpha = depth.adaptive.alpha                                       # its EMA over the three steps
    assert depth.adaptive.attn_time == pytest.approx(KERNEL_S * (1 - (1 - alpha) ** 2 / 4))


def test_attention_events_are_recorded_on_the_compute_stream():
    dev = FakeDevice()
    replica = _replica(dev, moe_layers=(False,))
    run_step(_ctx(), replica, [SimpleNamespace(h=None)], _exchange())
    assert [(kind, str(stream)) for kind, stream, _ in dev.log] == [("record", "compute")] * 2


def test_unread_ops_stay_bounded_by_waiting_for_the_oldest_only(monkeypatch):
    monkeypatch.setattr(timing, "MAX_OPEN", 2)
    dev = FakeDevice()
    timer = AttentionTimer(SimpleNamespace(), event=dev.event_class(), stream=lambda: "compute")
    got = []
    for _ in range(4):                 # the device never catches up by itself
        t0 = timer.start()
        dev.now += KERNEL_S
        got.append(timer.stop(t0))
    assert got == [0.0, 0.0, pytest.approx(KERNEL_S), pytest.approx(KERNEL_S)]
    assert len(dev.syncs) == 2 and len(timer._open) == 2      # one op's end each time, never the device


def test_the_cpu_path_is_the_synchronous_clock_it_always_was():
    calls = []
    compute = SimpleNamespace(device=torch.device("cpu"), synchronize=lambda: (calls.append(1), time.sleep(0.02)))
    timer = AttentionTimer(compute)
    assert not timer.on_gpu
    t0 = timer.start()
    assert timer.stop(t0) >= 0.02 and calls == [1]
    assert not AttentionTimer(SimpleNamespace(synchronize=lambda: None)).on_gpu     # a stand-in with no device


def test_a_cuda_compute_is_timed_with_cuda_events():
    timer = AttentionTimer(SimpleNamespace(device=torch.device("cuda", 0)))
    assert timer.on_gpu and timer.event is torch.cuda.Event      # built lazily: nothing touches a GPU here


# ---- the communication stream (asap.comm.streams) ---------------------------------------------------


def _comm(dev: FakeDevice):
    return streams.CommStream("cpu", event=dev.event_class(), stream=FakeStream("comm", dev),
                              current_stream=lambda device: FakeStream("compute", dev))


def test_a_copy_to_the_host_waits_for_its_producer_then_for_itself_only():
    dev = FakeDevice()
    comm = _comm(dev)
    src, dst = torch.arange(6.0), torch.empty(6)
    comm.to_host(dst, src)
    assert torch.equal(dst, src)
    (_, producer, ready), (_, waiter, waited), (_, copier, done) = dev.log
    assert (str(producer), waiter, waited) == ("compute", "comm", ready)   # comm stream after the producer
    assert str(copier) == "comm" and dev.syncs == [f"event {done}"]          # the host waits for the copy alone


def test_a_copy_to_the_device_orders_its_consumer_after_it_and_keeps_the_host_source_until_it_ran():
    dev = FakeDevice()
    comm = _comm(dev)
    src = torch.arange(6, dtype=torch.int32)
    out = comm.to_device(src, torch.float32)
    assert torch.equal(out, src.float())
    (_, copier, done), (_, waiter, waited) = dev.log
    assert str(copier) == "comm" and (waiter, waited) == ("compute", done)   # the consumer waits on the copy
    assert dev.syncs == []                                                     # the host does not
    assert [s is src for _, s in comm._kept] == [True]                        # the copy may still read it
    dev.catch_up()
    comm.to_device(torch.zeros(1))
    assert all(s is not src for _, s in comm._kept)                          # it ran: the source may go


def test_off_a_gpu_the_comm_helpers_are_the_plain_copies():
    t = torch.arange(4.0)
    assert streams.to_device(t, "cpu") is t
    assert streams.to_device(t, torch.device("cpu"), torch.float64).dtype == torch.float64
    dst = torch.empty(4)
    streams.copy_to_host(dst, t)
    assert torch.equal(dst, t) and streams._STREAMS == {}
