"""The emulated runtime charges the hardware profile's link as the simulator does (asap.workers.emulation.link),
and emulates attention tensor parallelism as the simulator models it.

Without it an emulated dispatch or combine costs only what the shm transport takes, and the emulated
runtime runs ahead of the simulator by the whole link time. On a profile whose link latency dwarfs the
compute, a lone prompt's emulated TTFT must land on the simulator's, for both engines.
"""
import dataclasses
import math
import time

import pytest

import asap
from asap.comm.headers import Header, Kind
from asap.comm.mailbox import Mailbox
from asap.comm.transport import Message
from asap.config import RuntimeConfig
from asap.cost.hardware import get_hardware
from asap.model.config import ModelConfig
from asap.model.materialize import resolve_model
from asap.scheduler.request import Request
from asap.sim.from_runtime import engine_spec
from asap.sim.run import run
from asap.workers.emulation.link import EmulatedLink


class Wire:
    rank, world_size = 0, 2

    def __init__(self, msgs):
        self.inbox = list(msgs)

    def poll(self):
        return self.inbox.pop(0) if self.inbox else None

    def recv(self, timeout):
        if not self.inbox and timeout:
            time.sleep(timeout)
        return self.poll()


def _combine(seq: int, ready_ns: int) -> Message:
    import torch
    return Message(1, Header(Kind.COMBINE, 0, 0, 0, seq, 1, ready_ns=ready_ns), [torch.zeros(1, 4)])


def test_a_message_is_filed_when_it_is_due_and_a_wait_wakes_for_it():
    now = time.monotonic_ns()
    box = Mailbox(Wire([_combine(1, now + 150_000_000), _combine(2, 0)]))
    box.pump(0)
    assert (0, 0, 0, 2) in box.partials and (0, 0, 0, 1) not in box.partials     # the undue one is held
    t0 = time.monotonic()
    box.pump(None)                     # nothing else will ever come: the wait ends when the held one is due
    waited = time.monotonic() - t0
    assert (0, 0, 0, 1) in box.partials
    assert 0.1 < waited < 1.0, waited
    assert box.arrived_at[(0, 0, 0, 1)] == pytest.approx(now / 1e9 + 0.15, abs=1e-6)   # it came when due


def test_the_link_serialises_message_groups_and_adds_the_latency_once():
    link = EmulatedLink(latency_s=0.01, dispatch_per_copy_s=0.001, combine_per_copy_s=0.002, dilation=2.0)
    t0 = time.monotonic()
    first = link.dispatch_due(10) / 1e9          # 10 copies x 1 ms x 2, then 10 ms x 2
    second = link.combine_due(5) / 1e9           # waits for the first on the same outgoing link
    assert first - t0 == pytest.approx(0.02 + 0.02, abs=0.005)
    assert second - first == pytest.approx(5 * 0.004, abs=0.005)
    assert link.received(t0, 10) - t0 == pytest.approx(10 * 0.004 + 0.02, abs=1e-9)


@pytest.fixture(scope="module")
def slow_link(tmp_path_factory):
    """The CPU profile with a 25 ms link latency: ~50 ms per MoE layer in the link alone."""
    hw = get_hardware("cpu")
    slow = dataclasses.replace(hw, name="slow-link", link=dataclasses.replace(hw.link, latency_s=0.025))
    path = tmp_path_factory.mktemp("hw") / "slow-link.json"
    slow.save(path)
    return str(path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine,layout", [
    ("sync", dict(devices=2, microbatches=1)),
    ("async", dict(attention_workers=1, expert_workers=1, microbatches=1)),
    # emulated attention TP: one process stands for its group, with the group's all-reduce and its share
    ("sync", dict(devices=4, attention_tp=2, microbatches=1)),
    ("async", dict(attention_workers=1, attention_tp=2, expert_workers=1, microbatches=1))])
def test_a_lone_prompt_takes_the_simulated_link_time(slow_link, engine, layout):
    rt = RuntimeConfig(compute="emulated", hardware=slow_link, router="round-robin", **layout)
    cfg = ModelConfig.from_dir(resolve_model("tiny-deepseek-v3", config_only=True))
    sim = run([Request(0, 64)], engine_spec(rt, engine, cfg)).results[0].ttft
    link_only = 2 * sum(cfg.moe_layers) * 0.025
    assert sim > link_only, "the simulated TTFT should be mostly link"
    with asap.LLM("tiny-deepseek-v3", engine=engine, runtime=rt) as llm:
        llm.submit(num_tokens=64).result(timeout=60)                  # warm-up
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            llm.submit(num_tokens=64).result(timeout=60)
            took.append(time.monotonic() - t0)
    emulated = min(took)
    assert 0.9 * sim < emulated < 1.3 * sim + 0.02, (emulated, sim)


def test_attention_tp_needs_emulated_compute_and_must_divide_the_sync_devices():
    with pytest.raises(ValueError, match="needs compute='emulated'"):
        RuntimeConfig(attention_tp=2, devices=4)
    with pytest.raises(ValueError, match="must divide devices"):
        asap.LLM("tiny-deepseek-v3", engine="sync", compute="emulated", attention_tp=4, devices=6)


@pytest.mark.timeout(30)
def test_an_async_combine_crosses_the_in_link_from_when_the_experts_sent_it():
    """A replica busy with another micro-batch's attention files an answer late; the emulated in-link must
    count from when the expert sent it (as the simulator does), not from when the replica looked."""
    import torch
    from asap.comm import Mailbox, ShmTransportSpec, WorkQueue, dispatch_recv
    from asap.model.stages import StageOut
    from asap.workers.emulation.exchange import EmulatedPointToPoint
    from asap.workers.exchange import serve_experts
    from asap.workers.spans import SpanRecorder

    class Doubling:
        def inputs_ready(self, t):
            pass

        def done_at(self):
            return time.monotonic()

        def experts(self, layer, x, topk_ids, topk_weights):
            return 2 * x

    spec = ShmTransportSpec(2, ring_bytes=1 << 20, send_timeout=2.0)
    replica_t, expert_t = spec.connect(0), spec.connect(1)
    try:
        link = EmulatedLink(latency_s=0.0, dispatch_per_copy_s=0.0, combine_per_copy_s=0.02)   # 10 copies: 0.2 s
        ex = EmulatedPointToPoint(replica_t, Mailbox(replica_t), lambda layer, ids: torch.ones_like(ids), 0,
                                  SpanRecorder("a0"), link)
        x = torch.randn(5, 4)
        ex.dispatch(0, 1, StageOut(h=x, x=x, topk_ids=torch.zeros(5, 2, dtype=torch.long),
                                   topk_weights=torch.full((5, 2), 0.5)), math.inf, time.monotonic())
        items = dispatch_recv(WorkQueue(Mailbox(expert_t)), timeout=5)
        serve_experts(Doubling(), expert_t, items)
        sent = time.monotonic()
        time.sleep(0.3)                     # the replica is busy elsewhere while the answer crosses its link
        t0 = time.monotonic()
        ex.combine(0, 1, timeout=5)
        assert time.monotonic() - t0 < 0.1, "the in-link was charged from when the replica filed the answer"
        assert ex.arrival(0, 1) == pytest.approx(sent + 0.2, abs=0.05)
    finally:
        replica_t.close(), expert_t.close()
        spec.cleanup()
