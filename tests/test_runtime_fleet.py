"""A length-aware fleet in the runtime (RuntimeConfig.wide_replicas, issue 24 point 4): the co-located async
engine with narrow replicas for short prompts and wide ones (their own attention TP and token budget) for long
prompts, routed by length as the simulator's fleet is (asap.scheduler.length_router). Real compute equals the
reference engine; emulated, a lone prompt of each kind takes the simulated fleet's time; bad fleets are refused."""
import pytest
import torch

import asap
from asap.config import RuntimeConfig
from asap.model.config import ModelConfig
from asap.model.materialize import resolve_model
from asap.scheduler.length_router import LengthRouter
from asap.scheduler.request import Request
from asap.workers.layout import build_layout


@pytest.mark.timeout(180)
def test_a_fleet_equals_the_reference_engine(same_as_reference):
    """Real compute: one narrow replica (256-token steps) and one wide one (TP1 here, 1024-token steps), prompts
    of >= 600 tokens to the wide one; everything in flight at once, chunked on both."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 1500, 37, 700, 599, 600, 3)]
    with asap.LLM("tiny-deepseek-v3", engine="reference") as ref:
        expect = ref.prefill(prompts)
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=1, expert_workers=2, colocated=True,
                  token_budget=256, wide_replicas=1, wide_tp=1, wide_from_tokens=600,
                  wide_token_budget=1024) as llm:
        router, picks = llm.engine.router, []
        assert isinstance(router, LengthRouter)
        route = router.route
        router.route = lambda req, loads, now: picks.append(route(req, loads, now)) or picks[-1]
        outs = [f.result(timeout=90) for f in [llm.submit(p) for p in prompts]]
        assert llm.healthy()
    assert picks == [int(len(p) >= 600) for p in prompts]       # replica 1 is the wide one
    same_as_reference(prompts, outs, expect)


def test_the_router_sends_long_prompts_to_the_wide_group_and_short_ones_to_the_narrow():
    cfg = ModelConfig.from_dir(resolve_model("deepseek-v3", config_only=True))
    rt = RuntimeConfig(compute="emulated", attention_workers=2, expert_workers=6, colocated=True, wide_replicas=1,
                       wide_tp=4, wide_from_tokens=8192)
    from asap.engine.loads import ReplicaBook
    from asap.scheduler.router import make_router
    from asap.workers.layout import replica_cost
    narrow, wide = replica_cost(cfg, rt, "async"), replica_cost(cfg, rt, "async", 4)
    assert wide([(16384, 0)]) < narrow([(16384, 0)]) / 2         # TP4 attention: the wide replica is faster
    router = LengthRouter(make_router(rt.router, narrow), make_router(rt.router, wide), {2}, rt.wide_from_tokens)
    loads = [ReplicaBook().load(i) for i in range(3)]
    assert router.route(Request(0, 20000, 0.0), loads, 0.0) == 2
    assert router.route(Request(1, 500, 0.0), loads, 0.0) in (0, 1)


def test_each_replica_owns_its_run_of_devices():
    cfg = ModelConfig.from_dir(resolve_model("tiny-deepseek-v3", config_only=True))
    rt = RuntimeConfig(compute="emulated", attention_workers=2, expert_workers=6, colocated=True, wide_replicas=1,
                       wide_tp=4, token_budget=512, wide_token_budget=2048)
    assert rt.replica_tps == (1, 1, 4) and rt.replica_budgets == (512, 512, 2048)
    assert [list(rt.replica_devices(a)) for a in range(3)] == [[0], [1], [2, 3, 4, 5]]
    layout = build_layout(cfg, rt, "async", "unused", "float32", "cpu", send_kv=False)
    try:
        assert layout.num_replicas == 3
        attention = [s for s in layout.specs if s.role == "attention"]
        experts = [s for s in layout.specs if s.role == "expert"]
        assert [s.rank for s in attention] == [0, 1, 2] and [s.rank for s in experts] == [3, 4, 5, 6, 7, 8]
        # a replica's attention is stretched by the expert work of exactly its own devices
        assert [len(s.shared_devices) for s in attention] == [1, 1, 4]
        assert attention[2].shared_devices == tuple(e.shared_devices[0] for e in experts[2:])
    finally:
        layout.transport.cleanup()


@pytest.mark.timeout(180)
def test_emulated_lone_prompts_take_the_simulated_fleets_time(roomy):
    """One narrow TP1 replica and one wide TP2 replica on 3 co-located devices: a lone short prompt runs on
    the narrow replica and a lone long one on the wide replica, each in the simulated fleet's time. Routed
    the other way, the long prompt would take about twice as long on TP1."""
    from asap.sim.from_runtime import engine_spec
    from asap.sim.run import run
    # dilation 6: the host's own lag stays small against the emulated ops on a loaded machine
    rt = RuntimeConfig(compute="emulated", hardware=roomy, dilation=6.0, microbatches=2, attention_workers=1,
                       expert_workers=3, colocated=True, wide_replicas=1, wide_tp=2, wide_from_tokens=2048,
                       token_budget=2048, wide_token_budget=4096, redundant_experts=2)   # 258 slots on 3 devices
    cfg = ModelConfig.from_dir(resolve_model("deepseek-v3", config_only=True))
    spec = engine_spec(rt, "async", cfg)
    assert (spec.devices, spec.wide_replicas, spec.wide_tp, spec.wide_token_budget) == (3, 1, 2, 4096)
    sim = {n: run([Request(0, n)], spec).results[0].ttft for n in (1024, 4096)}
    on_narrow = run([Request(0, 4096)], spec.replace(wide_from_tokens=8192)).results[0].ttft
    assert on_narrow > 1.5 * sim[4096]          # the check below can tell the two groups apart
    with asap.LLM("deepseek-v3", engine="async", runtime=rt) as llm:
        for n in (1024, 4096):                  # warm-up
            llm.submit(num_tokens=n).result(timeout=60)
        for n in (1024, 4096):
            took = []
            for _ in range(3):                  # the best of three: a loaded host can lag its emulated devices
                out = llm.submit(num_tokens=n).result(timeout=60)
                took.append((out.timings["finished"] - out.timings["submitted"]) / rt.dilation)
            assert 0.97 < min(took) / sim[n] < 1.10, (n, took, sim[n])
        assert llm.healthy()


@pytest.mark.parametrize("kw,match", [
    (dict(attention_workers=1, expert_workers=2, wide_replicas=1, wide_tp=1),
     "set colocated"),
    (dict(attention_workers=1, expert_workers=2, colocated=True, wide_replicas=1, wide_tp=2),
     "wide_tp=2 needs compute='emulated'"),
    (dict(attention_workers=1, expert_workers=3, colocated=True, wide_replicas=1, wide_tp=4, compute="emulated"),
     "attention_workers x attention_tp \\+ wide_replicas x wide_tp = 5"),
    (dict(attention_workers=1, expert_workers=2, colocated=True, wide_replicas=1, wide_tp=0), "wide_tp must be >= 1"),
    (dict(attention_workers=1, expert_workers=2, colocated=True, wide_replicas=1, wide_tp=1, wide_from_tokens=0),
     "wide_from_tokens must be >= 1"),
    (dict(attention_workers=1, expert_workers=2, colocated=True, wide_replicas=1, wide_tp=1, wide_token_budget=-1),
     "wide_token_budget must be >= 0"),
    (dict(attention_workers=1, expert_workers=1, colocated=True, wide_replicas=-1), "wide_replicas must be >= 0"),
])
def test_bad_fleets_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        RuntimeConfig(**kw)


def test_a_fleet_is_an_async_layout_and_on_the_command_lines():
    with pytest.raises(ValueError, match="colocated is an async layout"):
        asap.LLM("tiny-deepseek-v3", engine="sync", devices=2, colocated=True, wide_replicas=1, wide_tp=1,
                 attention_workers=1, expert_workers=2)
    from asap.cli import build_parser, commands
    from asap.config import config_from_args
    parsers = dict(commands(build_parser()))
    rt = config_from_args(RuntimeConfig, parsers["asap serve"].parse_args(
        ["tiny-deepseek-v3", "--colocated", "--attention-workers", "1", "--expert-workers", "2",
         "--wide-replicas", "1", "--wide-tp", "1", "--wide-from-tokens", "4096"]))
    assert (rt.wide_replicas, rt.wide_tp, rt.wide_from_tokens) == (1, 1, 4096)
