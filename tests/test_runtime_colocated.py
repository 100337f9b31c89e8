"""The co-located async mode (RuntimeConfig.colocated, issue 24 point 4): every device hosts an attention
replica and an expert shard, joined by the async exchange. Real compute equals the reference engine; emulated,
a lone prompt takes the simulator's co-located time, expert work stretching the attention on its device; bad
layouts are refused with a clear error."""
import dataclasses

import pytest
import torch

import asap
from asap.config import RuntimeConfig
from asap.model.config import ModelConfig
from asap.model.materialize import resolve_model
from asap.workers.layout import build_layout


@pytest.mark.timeout(120)
def test_colocated_async_equals_reference(same_as_reference):
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 1500, 37, 700, 2)]
    with asap.LLM("tiny-deepseek-v3", engine="reference") as ref:
        expect = ref.prefill(prompts)
    # A small token budget forces chunked prefill and long prompts split across micro-batches.
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, colocated=True,
                  token_budget=500) as llm:
        outs = [f.result(timeout=60) for f in [llm.submit(p) for p in prompts]]      # all in flight at once
        assert llm.healthy()
    same_as_reference(prompts, outs, expect)


def test_each_expert_worker_runs_on_its_replicas_device():
    cfg = ModelConfig.from_dir(resolve_model("tiny-deepseek-v3", config_only=True))
    rt = RuntimeConfig(attention_workers=2, expert_workers=2, colocated=True)
    layout = build_layout(cfg, rt, "async", "unused", "float32", "cuda", send_kv=False, num_gpus=2)
    try:
        devices = {(s.role, s.index): s.device for s in layout.specs}
        assert devices == {("attention", 0): "cuda:0", ("attention", 1): "cuda:1",
                           ("expert", 0): "cuda:0", ("expert", 1): "cuda:1"}
        assert all(s.shared_devices == () for s in layout.specs)      # real compute shares the real device
    finally:
        layout.transport.cleanup()
    plain = build_layout(cfg, dataclasses.replace(rt, colocated=False), "async", "unused", "float32", "cuda",
                         send_kv=False, num_gpus=4)
    try:
        assert [s.device for s in plain.specs] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    finally:
        plain.transport.cleanup()


@pytest.mark.timeout(120)
def test_emulated_prompts_take_the_simulated_colocated_time_and_stretch(roomy):
    """Two prompts at once on two co-located devices: each replica's attention is stretched by the expert
    work of its device, its own and the other replica's. Without the stretch the emulated TTFT would be
    short by about half."""
    from asap.scheduler.request import Request
    from asap.sim.from_runtime import engine_spec
    from asap.sim.run import run
    rt = RuntimeConfig(compute="emulated", hardware=roomy, dilation=3.0, microbatches=2, router="round-robin",
                       attention_workers=2, expert_workers=2, colocated=True)
    cfg = ModelConfig.from_dir(resolve_model("deepseek-v3", config_only=True))
    simulated = run([Request(0, 1024), Request(1, 1024)], engine_spec(rt, "async", cfg))
    sim, sim_stretch = max(r.ttft for r in simulated.results), simulated.stats["attention_stretch_s"]
    assert sim_stretch > 0.8 * sim          # per replica, over 40% of its time
    with asap.LLM("deepseek-v3", engine="async", runtime=rt) as llm:
        for _ in range(2):                  # warm-up, one request on each replica (round-robin)
            llm.submit(num_tokens=1024).result(timeout=60)
        records = [r for s in llm.engine.cluster.specs if s.role == "expert" for r in s.shared_devices]
        took, stretched = [], []
        for _ in range(3):                  # the best of three: a loaded host can lag its emulated devices
            before = sum(r.stretch_s for r in records)
            outs = [f.result(timeout=60) for f in [llm.submit(num_tokens=1024) for _ in range(2)]]
            took.append(max(o.timings["finished"] - o.timings["submitted"] for o in outs) / rt.dilation)
            stretched.append((sum(r.stretch_s for r in records) - before) / rt.dilation)
        assert llm.healthy()
    assert 0.97 < min(took) / sim < 1.10, (took, sim)
    assert 0.9 < max(stretched) / sim_stretch < 1.05, (stretched, sim_stretch)
    assert all(0 < r.stretch_s <= r.busy_s for r in records)     # never more than its experts ran


def test_a_colocated_runtime_config_maps_to_the_simulators_colocated_engine():
    from asap.sim.from_runtime import engine_spec
    spec = engine_spec(RuntimeConfig(attention_workers=4, expert_workers=4, colocated=True), "async")
    assert (spec.colocated, spec.devices, spec.attention_workers) == (True, 4, 4)
    spec = engine_spec(RuntimeConfig(attention_workers=2, attention_tp=2, expert_workers=4, colocated=True,
                                     compute="emulated"), "async")
    assert (spec.colocated, spec.devices, spec.attention_workers, spec.attention_tp) == (True, 4, 2, 2)
    assert engine_spec(RuntimeConfig(attention_workers=4, expert_workers=4), "async").devices == 8


@pytest.mark.parametrize("kw,match", [
    (dict(attention_workers=2, expert_workers=3), "expert_workers must equal attention_workers x attention_tp = 2"),
    (dict(attention_workers=2, attention_tp=2, expert_workers=2, compute="emulated"),
     "attention_workers x attention_tp = 4"),
    (dict(attention_workers=2, expert_workers=2, transport="nccl"), "nccl cannot send between the two processes"),
    (dict(attention_workers=2, expert_workers=2, transport="gloo", master_port=29555, remote_experts=True),
     "not remote_experts"),
])
def test_bad_colocated_configs_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        RuntimeConfig(colocated=True, **kw)


def test_colocated_is_an_async_layout():
    with pytest.raises(ValueError, match="colocated is an async layout"):
        asap.LLM("tiny-deepseek-v3", engine="sync", devices=2, colocated=True)


def test_the_flag_is_on_the_server_and_bench_command_lines():
    from asap.bench.cli import runtime_from_args
    from asap.cli import build_parser, commands
    from asap.config import config_from_args
    parsers = dict(commands(build_parser()))
    argv = ["--colocated", "--attention-workers", "2", "--expert-workers", "2"]
    assert config_from_args(RuntimeConfig, parsers["asap serve"].parse_args(["tiny-deepseek-v3", *argv])).colocated
    bench = runtime_from_args(parsers["asap bench"].parse_args(argv))
    assert bench.colocated and bench.devices == 2        # the sync baseline gets the same N devices
