"""A tuned configuration's deployments (asap.studies.deploy): the runtime they give is the engine the tuner
simulated, and the printed `asap serve` command parses back into that runtime."""
import dataclasses
import shlex

import pytest

from asap.cli import build_parser, main
from asap.config import RuntimeConfig, config_from_args
from asap.scheduler.expert_select import FullestLayer
from asap.sim.from_runtime import engine_spec
from asap.sim.run import get_model
from asap.sim.spec import EngineSpec
from asap.studies.deploy import deployments, serve_command
from asap.studies.config import EngineConfig
from asap.studies.space import space
from asap.workers.main import expert_selector

MODEL = "deepseek-v3"
HW = dict(compute="emulated", hardware="cloudmatrix384")     # attention TP > 1 runs emulated only
EXPERTS = get_model(MODEL).num_experts


def _configs():
    """Every primary candidate of both engines on 32 dies (fleets included) and a few secondary variants."""
    out = space("sync", 32, full=False, fleet_fractions=(0.25, 0.5)) + space("async", 32, full=False,
                                                                              fleet_fractions=(0.25, 0.5))
    out += [EngineConfig("sync", 4, 8192, instances=2, two_batch_overlap=False, router="round-robin"),
            EngineConfig("async", 1, 8192, attention_workers=16, window_s=0.002, selector="fullest",
                         microbatches=3),
            EngineConfig("async", 1, 16384, attention_workers=17, selector="fullest", max_wait_s=0.005),
            EngineConfig("async", 1, 8192, attention_workers=32, colocated=True, microbatches="adaptive"),
            EngineConfig("sync", 8, 16384, wide_replicas=1, wide_tp=16, order="sjf"),      # the queue order too
            EngineConfig("async", 1, 8192, attention_workers=32, colocated=True, order="srpt")]
    return out


def test_runtime_is_the_simulated_engine():
    for c in _configs():
        _check_runtime(c)


def _check_runtime(c):
    parts = deployments(c, 32, EXPERTS, **HW)
    per = 32 // c.instances
    assert sum(d.devices for d in parts) == per
    if c.engine == "sync" and c.wide_replicas:
        assert [d.runtime.attention_tp for d in parts] == [c.attention_tp, c.wide_tp]
        assert parts[1].devices == c.wide_replicas * c.wide_tp
        return                      # two deployments: the tuner simulates them as one split (split_by_length)
    (d,) = parts
    got = engine_spec(d.runtime, d.engine, MODEL, d.devices)
    want = dataclasses.replace(c.spec(MODEL, "cloudmatrix384", 32), instances=1, devices=per)
    workers = d.runtime.devices // d.runtime.attention_tp if c.engine == "sync" else d.runtime.expert_workers
    want = dataclasses.replace(want, redundant_experts=(
        want.redundant_experts if want.redundant_experts is not None else (-EXPERTS) % workers))
    if want.selector == "fullest" and want.max_wait_s is None:      # None: FullestLayer's default age bound
        want = dataclasses.replace(want, max_wait_s=FullestLayer().max_wait_s)
    if c.wide_replicas:             # the tuner leaves the narrow count to the spec; the runtime names it
        want = dataclasses.replace(want, attention_workers=got.attention_workers)
    for f in dataclasses.fields(got):
        assert getattr(got, f.name) == getattr(want, f.name), (c.describe(32), f.name)


def test_serve_command_parses_back():
    for c in _configs():
        _check_serve(c)


def _check_serve(c):
    for d in deployments(c, 32, EXPERTS, **HW):
        argv = shlex.split(serve_command(MODEL, d))
        assert argv[:3] == ["asap", "serve", MODEL]
        args = build_parser().parse_args(argv[1:])
        parsed = config_from_args(RuntimeConfig, args)
        layout = {f.name for f in dataclasses.fields(RuntimeConfig)} - {"dilation", "comm_timeout_s"}
        if d.engine == "sync":      # sync reads its devices and TP; the async-only fields stay at their defaults
            layout -= {"attention_workers", "expert_workers"}
        for name in layout:
            assert getattr(parsed, name) == getattr(d.runtime, name), (c.describe(32), name)
        assert args.engine == d.engine


def test_a_tuned_queue_order_is_named_in_every_serve_command():
    for c in (EngineConfig("sync", 8, 16384, wide_replicas=1, wide_tp=16, order="sjf"),
              EngineConfig("async", 1, 8192, attention_workers=32, colocated=True, order="srpt")):
        assert all(f"--order {c.order}" in serve_command(MODEL, d) for d in deployments(c, 32, EXPERTS, **HW))
    assert all("--order" not in serve_command(MODEL, d) for d in deployments(EngineConfig("sync"), 32, EXPERTS, **HW))


def test_real_compute_refuses_tensor_parallel_layouts():
    c = EngineConfig("sync", 4, 8192)
    with pytest.raises(ValueError, match="needs compute='emulated'"):
        deployments(c, 32, EXPERTS)
    (d,) = deployments(EngineConfig("sync", 1, 4096), 32, EXPERTS)
    assert serve_command(MODEL, d) == f"asap serve {MODEL} --engine sync --devices 32 --token-budget 4096"


def test_a_tuned_config_runs_with_the_expert_batch_cap_it_was_simulated_with():
    c = EngineConfig("async", 1, 8192, attention_workers=16)      # 4 x 8K = 32K: the runtime's own rule
    (d,) = deployments(c, 32, EXPERTS)
    assert d.runtime.expert_batch_tokens == EngineSpec.max_batch_tokens == 65536
    assert expert_selector(d.runtime).max_batch_tokens == 65536     # what the expert workers merge up to
    argv = shlex.split(serve_command(MODEL, d))
    assert argv[argv.index("--expert-batch-tokens") + 1] == "65536"
    # 4 x 16K is the tuner's cap already: the runtime keeps its rule and the command stays short
    (d,) = deployments(EngineConfig("async", 1, 16384, attention_workers=16), 32, EXPERTS)
    assert d.runtime.expert_batch_tokens is None and "--expert-batch-tokens" not in serve_command(MODEL, d)
    assert expert_selector(d.runtime).max_batch_tokens == 65536


def test_the_expert_batch_cap_is_checked_and_is_a_serve_flag(capsys):
    for bad in (0, -1, 2.5, "4096"):
        with pytest.raises(ValueError, match="expert_batch_tokens"):
            RuntimeConfig(expert_batch_tokens=bad)
    assert main(["serve", MODEL, "--expert-batch-tokens", "0"]) == 2       # refused before any worker starts
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expert_batch_tokens must be an int >= 1" in err
    args = build_parser().parse_args(["serve", MODEL, "--expert-batch-tokens", "32768", "--token-budget", "2048"])
    rt = config_from_args(RuntimeConfig, args)
    assert rt.expert_batch_tokens == 32768
    assert expert_selector(rt).max_batch_tokens == engine_spec(rt, "async").max_batch_tokens == 32768
    windowed = dataclasses.replace(rt, aggregation_window_ms=2.0)
    assert expert_selector(windowed).max_batch_tokens == 32768
    default = config_from_args(RuntimeConfig, build_parser().parse_args(["serve", MODEL, "--token-budget", "2048"]))
    assert default.expert_batch_tokens is None and expert_selector(default).max_batch_tokens == 4 * 2048
