"""Emulated ops chain on a device clock (asap.workers.clock), so the host's Python time between ops
does not add to the emulated times: a lone prompt takes what the simulator says, not that plus ~1 ms of
Python per layer. Before the clock (d8f2d17), a lone 512-token DeepSeek-V3 prompt took 1.68x the simulated
TTFT on sync at dilation 1 and 1.16x at dilation 4 (its ranks also served later all-to-alls by the wall
clock, not by when their dispatches were due), and 1.10x / 1.03x on async; with it, 1.015x and 1.006x at
dilation 1. The test runs at dilation 4: at dilation 1, with another process on the two cores, the hosts of
4 sync ranks could not do a step's Python within the step's emulated time (1.29x), and a result is seen
when its host gets there."""
import time

import pytest

import asap
from asap.config import RuntimeConfig
from asap.model.config import ModelConfig
from asap.model.materialize import resolve_model
from asap.scheduler.request import Request
from asap.sim.from_runtime import engine_spec
from asap.sim.run import run
from asap.workers.emulation.clock import DeviceClock
from asap.workers.emulation.select import DeviceTimeSelector
from test_workers_link import Wire      # a transport that hands over a fixed list of messages


def test_ops_chain_from_when_the_device_is_free_not_from_when_the_host_issues_them():
    clock = DeviceClock()
    t0 = time.monotonic()
    first = clock.run(0.010)                       # no word on its inputs: they are in when it is issued
    assert t0 <= first - 0.010 <= time.monotonic()
    time.sleep(0.05)                               # the host is busy elsewhere meanwhile
    clock.inputs_ready(0.0)                        # inputs the device's own last op made
    assert clock.run(0.010) == pytest.approx(first + 0.010, abs=1e-9)   # it follows the first on the device
    clock.inputs_ready(first + 0.05)               # an input that comes later: the op waits for it
    assert clock.run(0.010) == pytest.approx(first + 0.060, abs=1e-9)
    clock.inputs_ready(t0)                         # an input that was in long ago: the device is the limit
    assert clock.run(0.010) == pytest.approx(first + 0.070, abs=1e-9)
    clock.inputs_ready(first + 0.1)                # an op that never ran (an empty micro-batch): what it
    assert clock.out() == pytest.approx(first + 0.1, abs=1e-9)   # would send leaves once its inputs are in
    assert clock.run(0.010) == pytest.approx(first + 0.110, abs=1e-9)
    time.sleep(max(0.0, first + 0.15 - time.monotonic()))
    t1 = time.monotonic()
    assert clock.run(0.010) - 0.010 >= t1          # the word was used once: with none, the op starts when issued


@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine,layout", [("sync", dict(devices=4)),
                                           ("async", dict(attention_workers=2, expert_workers=2))])
def test_a_lone_prompt_takes_the_simulated_time_on_deepseek_v3(roomy, engine, layout):
    rt = RuntimeConfig(compute="emulated", hardware=roomy, dilation=4.0, microbatches=2, router="round-robin",
                       **layout)
    cfg = ModelConfig.from_dir(resolve_model("deepseek-v3", config_only=True))
    sim = run([Request(0, 512)], engine_spec(rt, engine, cfg)).results[0].ttft
    with asap.LLM("deepseek-v3", engine=engine, runtime=rt) as llm:
        llm.submit(num_tokens=512).result(timeout=60)                  # warm-up
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            llm.submit(num_tokens=512).result(timeout=60)
            took.append((time.monotonic() - t0) / rt.dilation)
    assert 0.98 < min(took) / sim < 1.05, (took, sim)


def _dispatch(replica: int, ready_ns: int):
    import torch
    from asap.comm.headers import Header, Kind
    from asap.comm.transport import Message
    h = Header.of(Kind.DISPATCH, replica, 3, 0, 0, 2, float("inf"), ready_ns / 1e9, ready_ns, 0)
    return Message(replica, h, [torch.zeros(2, 4), torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2)])


@pytest.mark.parametrize("emulated", [False, True])
def test_an_emulated_expert_chooses_among_what_was_due_when_its_device_got_free(emulated):
    """Two same-layer dispatches, due 10 ms and 60 ms ago; the device got free 20 ms ago. A host that looks
    only now sees both and merges them; in device time only the first was in when the device started."""
    from asap.comm import Mailbox, WorkQueue, dispatch_recv
    from asap.scheduler.expert_select import make_selector
    now = time.monotonic_ns()
    queue = WorkQueue(Mailbox(Wire([_dispatch(0, now - 60_000_000), _dispatch(1, now - 10_000_000)])))
    clock = DeviceClock()
    clock.free = now / 1e9 - 0.020

    def selector(policy):      # an emulated expert worker wraps its policy (asap.workers.emulation.worker)
        return DeviceTimeSelector(policy, clock, queue.mailbox) if emulated else policy
    items = dispatch_recv(queue, timeout=0, selector=selector(make_selector("oldest", max_batch_tokens=1 << 20)))
    assert [it.header.replica for it in items] == ([0] if emulated else [0, 1])
    assert [it.header.replica for it in dispatch_recv(queue, timeout=0, selector=selector(make_selector("oldest")))] \
        == ([1] if emulated else [])
