"""Prompt logprobs (opt-in per request): every prompt token's log-probability under the model, and the
top-k there, equal a full forward's log-softmax; the async engine, with prompts split into chunks,
returns the same as the reference engine; requests that do not ask get none."""
import pytest
import torch

import asap
from asap.config import RuntimeConfig

PROMPTS = [[7, 300, 12, 45, 99, 3, 250, 18, 64, 101, 5], [9], list(range(40, 140))]
K = 3


@pytest.fixture(scope="module")
def reference(tiny_dirs):
    with asap.LLM(tiny_dirs["tiny-deepseek-v3"], engine="reference") as llm:
        outs = [f.result() for f in [llm.submit(p, prompt_logprobs=K) for p in PROMPTS]]
        plain = llm.submit(PROMPTS[0]).result()
        full = [_full_logprobs(llm, p) for p in PROMPTS]
    return outs, plain, full


def _full_logprobs(llm, prompt):
    """log-softmax at every prompt position, by prefilling each prefix (the last logits of prefix i)."""
    return torch.stack([torch.log_softmax(llm.prefill([prompt[:i]])[0].logits, -1) for i in range(1, len(prompt))]) \
        if len(prompt) > 1 else torch.zeros(0, llm.cfg.vocab_size)


def test_reference_prompt_logprobs_equal_the_models_distribution(reference):
    outs, plain, full = reference
    assert plain.prompt_logprobs is None
    for prompt, out, lp in zip(PROMPTS, outs, full):
        got = out.prompt_logprobs
        assert got.token_logprobs.shape == (len(prompt) - 1,) and got.top_ids.shape == (len(prompt) - 1, K)
        torch.testing.assert_close(got.token_logprobs, lp.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0],
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.top_logprobs, lp.topk(K, -1).values, rtol=1e-4, atol=1e-4)


def test_async_engine_with_chunked_prompts_matches_the_reference(tiny_dirs, reference):
    outs, _, _ = reference
    rt = RuntimeConfig(attention_workers=1, expert_workers=1, token_budget=16)   # the 100-token prompt: 7 chunks
    with asap.LLM(tiny_dirs["tiny-deepseek-v3"], engine="async", runtime=rt) as llm:
        got = [f.result(timeout=120) for f in [llm.submit(p, prompt_logprobs=K) for p in PROMPTS]]
        assert llm.submit(PROMPTS[0]).result(timeout=120).prompt_logprobs is None
        with pytest.raises(ValueError, match="prompt_logprobs"):
            llm.submit(PROMPTS[0], prompt_logprobs=-1)
    for ref, out in zip(outs, got):
        torch.testing.assert_close(out.prompt_logprobs.token_logprobs, ref.prompt_logprobs.token_logprobs,
                                   rtol=1e-4, atol=1e-4)
        assert torch.equal(out.prompt_logprobs.top_ids, ref.prompt_logprobs.top_ids)
