"""Async and sync engines equal the reference engine, for any interleaving (issue: runtime, point 7)."""
import pytest
import torch

import asap

NUM_PROMPTS = 32


@pytest.fixture(scope="module")
def prompts_and_reference():
    g = torch.Generator().manual_seed(7)
    lengths = [1, 2048, 2, 1000] + torch.randint(1, 2049, (NUM_PROMPTS - 4,), generator=g).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in lengths]
    with asap.LLM("tiny-deepseek-v3", engine="reference") as ref:
        return prompts, ref.prefill(prompts)


CASES = [
    ("async", "shm", dict(attention_workers=1, expert_workers=1)),
    ("async", "shm", dict(attention_workers=2, expert_workers=2)),
    ("async", "shm", dict(attention_workers=3, expert_workers=1, router="round-robin")),
    ("async", "gloo", dict(attention_workers=2, expert_workers=2)),
    ("async", "shm", dict(attention_workers=2, expert_workers=2, microbatches=3, adaptive_depth=True,
                          selector="largest", aggregation_window_ms=1.0)),
    ("async", "shm", dict(attention_workers=3, expert_workers=2, selector="fullest", expert_max_wait_ms=5.0)),
    ("async", "shm", dict(attention_workers=2, expert_workers=2, order="srpt")),    # started prompts pause
    ("sync", "shm", dict(devices=2)),
    ("sync", "shm", dict(devices=2, order="srpt")),
    ("sync", "shm", dict(devices=3, microbatches=1)),
    ("sync", "gloo", dict(devices=2)),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine,transport,kw", CASES, ids=[f"{e}-{t}-{'-'.join(f'{k}={v}' for k, v in kw.items())}"
                                                             for e, t, kw in CASES])
def test_engine_equals_reference(engine, transport, kw, prompts_and_reference):
    prompts, ref = prompts_and_reference
    # A small token budget forces chunked prefill and long prompts split across micro-batches.
    with asap.LLM("tiny-deepseek-v3", engine=engine, transport=transport, token_budget=700, **kw) as llm:
        futures = [llm.submit(p) for p in prompts]          # all in flight at once
        outs = [f.result(timeout=180) for f in futures]
        assert llm.healthy()
    for p, out, r in zip(prompts, outs, ref):
        assert out.first_token == r.first_token
        assert (out.logits - r.logits).abs().max().item() < 1e-4
        assert len(out.kv) == len(r.kv)
        for a, b in zip(out.kv, r.kv):
            for name in b:
                assert a[name].shape == b[name].shape == (len(p), *b[name].shape[1:])
                assert torch.allclose(a[name], b[name], atol=1e-5)


def test_qwen3_async_equals_reference():
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 50, 700, 3)]
    with asap.LLM("tiny-qwen3-moe", engine="reference") as ref:
        expect = ref.prefill(prompts)
    with asap.LLM("tiny-qwen3-moe", engine="async", attention_workers=2, expert_workers=2, token_budget=256) as llm:
        outs = llm.prefill(prompts)
    for out, r in zip(outs, expect):
        assert out.first_token == r.first_token and (out.logits - r.logits).abs().max().item() < 1e-4
        assert all(torch.allclose(a[k], b[k], atol=1e-5) for a, b in zip(out.kv, r.kv) for k in b)
