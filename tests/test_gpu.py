"""Device plumbing (issue 11 point 6). The CPU tests prove it without a GPU: each worker's device
comes from its local rank, every table follows compute.device (the `meta` device stands in for a
GPU: a tensor left on the CPU shows up as such), the expert worker takes dtype and device from its
flags. The CUDA tests run the same promises on a real GPU and skip cleanly where there is none;
benchmarks/gpu_check.py is the longer check with a verdict."""
from __future__ import annotations

import argparse

import pytest
import torch

from asap.config import RuntimeConfig
from asap.workers.layout import build_layout
from asap.workers.main import worker_device

pytestmark = pytest.mark.timeout(120)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
META = torch.device("meta")


@pytest.fixture(scope="module")
def tiny():
    from asap.config import ModelConfig
    from asap.model.materialize import resolve_model
    path = resolve_model("tiny-deepseek-v3")
    return path, ModelConfig.from_dir(path)


# ---- CPU: device assignment ----

def test_worker_device_is_the_gpu_of_its_local_rank():
    assert [worker_device("cuda", r, num_gpus=4) for r in range(6)] == \
        ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert worker_device("cuda:3", 1, num_gpus=4) == "cuda:3"      # an explicit device is kept
    assert worker_device("cpu", 5, num_gpus=4) == "cpu"
    with pytest.raises(ValueError, match="no GPU is visible"):
        worker_device("cuda", 0, num_gpus=0)


def test_layout_gives_every_worker_its_own_device(tiny):
    path, cfg = tiny
    rt = RuntimeConfig(attention_workers=2, expert_workers=2)
    lay = build_layout(cfg, rt, "async", str(path), "float32", "cuda", False, num_gpus=4)
    assert [(s.role, s.device) for s in lay.specs] == \
        [("attention", "cuda:0"), ("attention", "cuda:1"), ("expert", "cuda:2"), ("expert", "cuda:3")]
    lay.transport.cleanup()
    lay = build_layout(cfg, rt, "async", str(path), "float32", "cuda", False, num_gpus=1)
    assert {s.device for s in lay.specs} == {"cuda:0"}               # one GPU: shm workers share it
    lay.transport.cleanup()
    lay = build_layout(cfg, RuntimeConfig(devices=3), "sync", str(path), "float32", "cuda", False, num_gpus=2)
    assert [s.device for s in lay.specs] == ["cuda:0", "cuda:1", "cuda:0"]
    lay.transport.cleanup()
    lay = build_layout(cfg, rt, "async", str(path), "float32", "cpu", False)
    assert {s.device for s in lay.specs} == {"cpu"}
    lay.transport.cleanup()


def test_nccl_refuses_two_ranks_on_one_gpu(tiny):
    path, cfg = tiny
    rt = RuntimeConfig(attention_workers=1, expert_workers=1, transport="nccl")
    with pytest.raises(ValueError, match="one GPU per rank: 2 ranks, 1 GPUs"):
        build_layout(cfg, rt, "async", str(path), "float32", "cuda", False, num_gpus=1)
    lay = build_layout(cfg, rt, "async", str(path), "float32", "cuda", False, num_gpus=2)
    assert [s.device for s in lay.specs] == ["cuda:0", "cuda:1"]


def test_expert_worker_takes_dtype_and_device_from_its_flags(tiny):
    from asap.workers.remote import register, remote_spec
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    base = ["expert-worker", "--model", "tiny-deepseek-v3", "--attention-workers", "1", "--expert-workers", "2",
            "--master-port", "29777", "--index", "1"]
    spec = remote_spec(ap.parse_args(base + ["--transport", "gloo", "--dtype", "bfloat16"]))
    assert (spec.role, spec.rank, spec.dtype, spec.device) == ("expert", 2, "bfloat16", "cpu")
    spec = remote_spec(ap.parse_args(base + ["--transport", "nccl"]))
    assert (spec.dtype, spec.device) == ("float32", "cuda")        # auto: the checkpoint's; cuda:$LOCAL_RANK at start
    with pytest.raises(ValueError, match="--device must be"):
        remote_spec(ap.parse_args(base + ["--transport", "gloo", "--device", "tpu"]))


# ---- CPU: every table on compute.device ----

def test_destination_tables_live_on_the_given_device():
    from asap.scheduler.placement import balanced_placement, contiguous_placement
    from asap.workers.destinations import Destinations
    plain = Destinations(contiguous_placement(2, 8, 2), first_rank=1, device=META)
    assert {t.device for t in plain.tables.values()} == {META}
    assert plain(0, torch.zeros(4, 2, dtype=torch.long, device=META)).device == META
    spread = Destinations(balanced_placement([[1.0] * 8], 2, 2), first_rank=1, device=META)
    assert {t.device for t in spread.owners.values()} == {META}


def test_expert_index_tables_follow_the_weights():
    from asap.model.moe import ExpertShard
    gate_up = {0: torch.empty(2, 8, 4, device=META)}
    shard = ExpertShard.build(4, {0: [1, 3]}, gate_up, {0: torch.empty(2, 4, 4, device=META)})
    assert shard.local_index[0].device == META
    cpu = ExpertShard.build(4, {0: [1, 3]}, {0: torch.zeros(2, 8, 4)}, {0: torch.zeros(2, 4, 4)})
    assert cpu.local_index[0].tolist() == [-1, 0, -1, 1, -1]


class _MetaCompute:
    emulated, device, dtype = False, META, torch.float32

    def __init__(self, cfg):
        self.cfg = cfg

    def new_kv(self):
        return None


def test_replica_keeps_prompts_and_routing_counts_on_the_compute_device(tiny):
    from asap.scheduler.replica import ReplicaScheduler
    from asap.workers.messages import Submit
    from asap.workers.replica import Replica
    _, cfg = tiny
    replica = Replica(0, _MetaCompute(cfg), ReplicaScheduler(64), results=None)
    replica.intake(Submit(7, [5, 6, 7], 3, arrival=0.0))
    assert replica.prompts[7].device == META and replica.prompts[7].shape == (3,)
    assert replica.routing.device == META


class _FakeEvent:
    """A CUDA event stand-in: `now` is the device's clock in ms; an event is done once the device passed it."""
    now, done_until, recorded = 0.0, 0.0, []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self):
        self.t = _FakeEvent.now
        _FakeEvent.recorded.append(self)

    def query(self):
        return self.t <= _FakeEvent.done_until

    def synchronize(self):
        _FakeEvent.done_until = max(_FakeEvent.done_until, self.t)

    def elapsed_time(self, other):
        return other.t - self.t


def test_spans_time_the_device_with_events_and_never_wait_in_the_loop():
    """On a GPU a span covers its kernels (CUDA events at its edges) without a sync per span: the events
    are read when the loop flushes, only those already done unless forced."""
    from asap.workers.spans import SpanRecorder
    calls = []
    rec = SpanRecorder("attention0", flush_every_s=0.0)
    rec.sync, rec.event = lambda: calls.append("sync"), _FakeEvent
    _FakeEvent.now = _FakeEvent.done_until = 0.0
    with rec.span("compute"):
        _FakeEvent.now = 5.0                    # 5 ms of kernels queued
    with rec.span("stall"):
        _FakeEvent.now = 7.0
    assert calls == [] and len(rec.pending) == 0
    _FakeEvent.done_until = 5.0                 # the device finished the first span only
    first = rec.take()
    assert [k for k, _, _ in first] == ["compute"]
    (_, s, e), = first
    t_ref = rec._clock[0]
    assert (s, e) == (t_ref, t_ref + 0.005)     # device time, mapped onto the monotonic clock
    forced = rec.take(force=True)
    assert [(k, round((b - a) * 1e3, 6)) for k, a, b in forced] == [("stall", 2.0)]


# ---- CPU: benchmarks/gpu_check.py's dry run ----

def _gpu_check(tmp_path, *args):
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "check.json"
    env = dict(os.environ, PYTHONPATH=root)                 # uninstalled, as on the GPU machine
    p = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "gpu_check.py"), "--device", "cpu",
                        "--json", str(out), *args], capture_output=True, text=True, timeout=110, env=env)
    return p, json.loads(out.read_text())


@pytest.mark.timeout(120)
def test_gpu_check_dry_run_ends_in_a_verdict_and_a_json(tmp_path):
    p, report = _gpu_check(tmp_path, "--quick", "--tokens", "32")
    last = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 0 and last.startswith("VERDICT: PASS") and "DRY RUN ON THE CPU" in last, p.stdout + p.stderr
    fp8, timer, exact, layer = report["phases"]       # the short kernel phases first
    assert [fp8["phase"], timer["phase"], layer["phase"]] == ["fp8_linear", "attention_timer", "layer"]
    assert exact["ok"] and exact["workers"] and all(w["weights_on"] == "cpu" for w in exact["workers"])
    assert {r for w in exact["workers"] for r in w["roles"]} == {"attention", "experts"}
    assert layer["ok"] and layer["rows"][0]["T"] == 32
    # On the CPU the block-scaled GEMM is not tried: the fallback must equal the dequantised linear exactly.
    assert fp8["ok"] and not fp8["gemm_required"] and fp8["path"] == "fallback (dequantise per linear)"
    assert {r["weight"] for r in fp8["rows"]} == {"q_b_proj", "o_proj", "kv_b_proj", "shared_experts.gate_up"}
    assert all(r["exact"] and r["rel_max_err"] == 0.0 for r in fp8["rows"]) and not fp8["scaled_mm_failed"]
    # The CPU path of AttentionTimer: monotonic-clock durations, compute.synchronize() once a stop.
    assert timer["ok"] and not timer["on_gpu"] and timer["compute_synchronize_calls"] == 5
    assert all(d > 0 for d in timer["durations_ms"])
    assert sum(ln.startswith("ok   ") for ln in p.stdout.splitlines()) == 4       # one line a phase


@pytest.mark.timeout(120)
def test_gpu_check_fails_when_a_worker_ran_elsewhere_and_at_its_deadline(tmp_path):
    # Workers that ran on the CPU fail a check that expects the GPU: the check cannot pass on the wrong device.
    p, report = _gpu_check(tmp_path, "--quick", "--skip-layer", "--skip-fp8", "--skip-timer", "--expect-device", "cuda")
    assert p.returncode == 1 and "VERDICT: FAIL" in p.stdout
    assert [r["phase"] for r in report["phases"]] == ["exact tiny-qwen3-moe float32 async-1+1"]
    assert "not on cuda" in report["phases"][0]["device_check"]
    # A deadline shorter than the work: still a verdict and a JSON, and FAIL. 8 s leaves no phase its 5 s
    # minimum on any machine (15 s was enough for the whole quick check on a quiet one).
    p, report = _gpu_check(tmp_path, "--quick", "--deadline", "8")
    assert p.returncode != 0 and "VERDICT: FAIL" in p.stdout and report["verdict"] == "FAIL"


# ---- CUDA ----

@cuda
def test_shm_takes_cuda_tensors_and_rows_in_one_copy(ranks):
    from asap.comm import Header, Kind
    from asap.comm.transport import Rows
    x = torch.randn(6, 5, device="cuda")
    idx = torch.tensor([4, 0, 2], device="cuda")
    ranks[0].send(1, Header(Kind.CONTROL, 0, 0, 0, 0, 0), [x, Rows(x, idx), x.t()])
    got = ranks[1].recv(5.0).tensors
    assert all(t.device.type == "cpu" for t in got)                # shm hands over host tensors
    assert torch.equal(got[0], x.cpu()) and torch.equal(got[1], x[idx].cpu()) and torch.equal(got[2], x.t().cpu())


@cuda
def test_a_streamed_cuda_message_arrives_exactly():
    from asap.comm import Header, Kind, ShmTransportSpec
    from asap.comm.transport import Rows
    spec = ShmTransportSpec(2, ring_bytes=16 << 20)
    a, b = spec.connect(0), spec.connect(1)
    try:
        x = torch.randn(1024, 1024, device="cuda")                       # 4 MiB: streamed in chunks
        idx = torch.randperm(1024, device="cuda")[:700]
        a.send(1, Header(Kind.CONTROL, 0, 0, 0, 0, 0), [x, Rows(x, idx)])
        got = b.recv(5.0).tensors
        assert torch.equal(got[0], x.cpu()) and torch.equal(got[1], x[idx].cpu())
    finally:
        a.close(), b.close()
        spec.cleanup()


@cuda
def test_dispatch_layout_on_cuda_matches_cpu():
    from asap.comm.primitives import dispatch_layout
    g = torch.Generator().manual_seed(0)
    dest = torch.randint(-1, 4, (50, 4), generator=g)
    ids, w = torch.randint(0, 16, (50, 4), generator=g), torch.rand(50, 4, generator=g)
    a = dispatch_layout(dest, ids, w, 4)
    b = dispatch_layout(dest.cuda(), ids.cuda(), w.cuda(), 4)
    assert a.rows.keys() == b.rows.keys()
    for r in a.rows:
        assert torch.equal(a.rows[r], b.rows[r].cpu()) and torch.equal(a.topk_ids[r], b.topk_ids[r].cpu())


@cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine,kw", [("async", dict(attention_workers=1, expert_workers=1)),
                                       ("sync", dict(devices=2))])
def test_engines_on_cuda_equal_the_reference(engine, kw):
    import asap
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 300, 40)]
    with asap.LLM("tiny-deepseek-v3", engine="reference", device="cuda") as ref:
        want = ref.prefill(prompts)
    with asap.LLM("tiny-deepseek-v3", engine=engine, device="cuda", token_budget=128, **kw) as llm:
        got = llm.prefill(prompts)
    for o, r in zip(got, want):
        assert o.first_token == r.first_token
        assert (o.logits.cpu() - r.logits.cpu()).abs().max().item() < 1e-4
