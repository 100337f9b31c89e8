"""One MoE layer step makes at most one host sync (issue 26 point 3), counted on the CPU.

A host sync is what makes the host wait for a GPU: reading a value (`item`, `int()`, `bool()`,
`tolist`, `numpy`, `cpu`), `nonzero` without a size, or a device-wide synchronize. On a CPU none
of these waits, so the test counts the calls themselves, on the code path a GPU takes
(asap.comm.primitives.HOST_SHORTCUTS off: the CPU-only shortcuts that read values are skipped).
The one sync left is the dispatch's per-rank row counts: a message's size must be known on the
host to be sent (asap.comm.primitives.dispatch_layout).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import asap.comm.primitives as primitives
import asap.model.moe as moe
from asap.model.batch import Batch, Chunk, KVCache
from asap.model.loader import load_attention_side, load_expert_shard
from asap.model.materialize import resolve_model
from asap.model.stages import attention_stage, embed
from asap.scheduler.placement import contiguous_placement
from asap.workers.destinations import Destinations

SYNC_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
            torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}


class SyncCounter(TorchDispatchMode):
    """Counts the aten ops that read a device value on the host, plus the Python-level reads below."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNC_OPS:
            self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counter(monkeypatch):
    c = SyncCounter()
    for name in ("tolist", "numpy", "cpu"):          # these read on the host without an aten op on a CPU tensor
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name, **k: (c.calls.append(_n),
                                                                                         _o(self, *a, **k))[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: c.calls.append("cuda.synchronize"))
    monkeypatch.setattr(primitives, "HOST_SHORTCUTS", False)
    return c


def _layer_step(path, dtype, ranks: int = 2):
    """attention stage -> destinations -> dispatch layout -> each rank's expert stage -> scatter + combine."""
    side = load_attention_side(path, dtype)
    cfg = side.cfg
    layer = cfg.moe_layer_ids[0]
    per = cfg.num_experts // ranks
    shards = [load_expert_shard(path, list(range(r * per, (r + 1) * per)), dtype) for r in range(ranks)]
    dest_of = Destinations(contiguous_placement(cfg.num_layers, cfg.num_experts, ranks), first_rank=0)
    chunks = [Chunk(0, 0, 40), Chunk(1, 0, 9)]
    kv = KVCache(cfg, dtype)
    for c in chunks:
        kv.allocate(c.request_id, c.num_tokens)
    batch = Batch.build(chunks)
    h = embed(side, torch.randint(0, cfg.vocab_size, (batch.num_tokens,), generator=torch.Generator().manual_seed(0)))

    def step(c: SyncCounter | None):
        with c if c is not None else torch.no_grad():
            s = attention_stage(side, layer, h, batch, kv)
            lay = primitives.dispatch_layout(dest_of(layer, s.topk_ids), s.topk_ids, s.topk_weights, ranks)
            out = torch.zeros_like(s.x)
            for r, rows in lay.rows.items():
                part = moe.expert_stage(shards[r], layer, s.x[rows], lay.topk_ids[r], lay.topk_weights[r])
                out.index_add_(0, rows, part)
            return moe.combine(s.h, [out])

    reference = torch.no_grad()(lambda: moe.combine(*_whole(side, shards, layer, h, batch, kv)))()
    return step, reference


def _whole(side, shards, layer, h, batch, kv):
    s = attention_stage(side, layer, h, batch, kv)
    return s.h, [moe.expert_stage(sh, layer, s.x, s.topk_ids, s.topk_weights) for sh in shards]


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-qwen3-moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_moe_layer_step_makes_at_most_one_host_sync(preset, dtype, counter, monkeypatch):
    # The grouped-GEMM path on every dtype (CPU float32 otherwise takes the faster per-expert loop).
    monkeypatch.setattr(moe, "_GROUPED_MM", {})
    step, reference = _layer_step(resolve_model(preset), dtype)
    with torch.no_grad():
        got = step(counter)
    assert len(counter.calls) <= 1, counter.calls
    assert counter.calls == ["tolist"]            # the dispatch's per-rank counts, and nothing else
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), reference.float(), atol=tol)   # and the step is still the model's


def test_an_fp8_shard_adds_no_host_sync(counter, monkeypatch, tmp_path):
    """Block-FP8 experts are dequantised per layer on the device: still the one sync of the dispatch."""
    from asap.model.materialize import materialize
    monkeypatch.setattr(moe, "_GROUPED_MM", {})
    step, reference = _layer_step(materialize("tiny-deepseek-v3", tmp_path / "fp8", fp8_block=(16, 16)),
                                  torch.float32)
    with torch.no_grad():
        got = step(counter)
    assert counter.calls == ["tolist"]
    assert torch.allclose(got, reference, atol=1e-5)


def test_the_counter_sees_the_syncs_the_old_expert_stage_made(counter):
    """The counter is not blind: the old expert stage's nonzero() and bincount().tolist() register."""
    slot = torch.tensor([0, -1, 1, 1])
    with counter:
        pairs = (slot >= 0).nonzero().squeeze(1)
        torch.bincount(slot[pairs], minlength=2).tolist()
        int(pairs[0])
    assert counter.calls == ["aten.nonzero.default", "tolist", "aten._local_scalar_dense.default"]


def test_grouped_swiglu_equals_the_per_expert_loop(monkeypatch):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(23, 16, generator=g)
    gu, dn = torch.randn(3, 16, 16, generator=g), torch.randn(3, 16, 8, generator=g)
    offs = torch.tensor([5, 5, 20], dtype=torch.int32)         # expert 1 gets no rows; rows 20.. belong to nobody
    want = []
    for e, (a, b) in enumerate([(0, 5), (5, 5), (5, 20)]):
        gg, uu = torch.nn.functional.linear(xs[a:b], gu[e]).chunk(2, dim=-1)
        want.append(torch.nn.functional.linear(torch.nn.functional.silu(gg) * uu, dn[e]))
    for table in ({}, {("cpu", torch.float32): False}):          # grouped GEMM, then the loop fallback
        monkeypatch.setattr(moe, "_GROUPED_MM", table)
        assert torch.allclose(moe.grouped_swiglu(xs, gu, dn, offs)[:20], torch.cat(want), atol=1e-5)
