"""Expert load balancing: placement recomputed from routing statistics between runs; outputs unchanged."""
import time

import torch

import asap


def test_rebalance_with_redundant_experts_keeps_outputs():
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (300, 5, 800, 64, 1)]
    with asap.LLM("tiny-deepseek-v3", engine="reference") as ref:
        expect = ref.prefill(prompts)
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, token_budget=256) as llm:
        before = llm.prefill(prompts)
        routed = sum(len(p) for p in prompts) * llm.cfg.top_k
        deadline = time.monotonic() + 10
        while sum(llm.engine.routing_stats.loads()[1]) < routed and time.monotonic() < deadline:
            time.sleep(0.1)                                   # replicas report routing counts when idle
        loads = llm.engine.routing_stats.loads()
        assert sum(loads[1]) == routed                         # every routed pair of layer 1 was counted
        placement = llm.engine.rebalance(num_redundant=2)
        hottest = max(range(16), key=lambda e: loads[1][e])
        assert len(placement.replicas[1][hottest]) == 2        # the hottest expert got a second copy
        assert sorted(len(placement.experts_on(w, 1)) for w in range(2)) == [9, 9]
        after = llm.prefill(prompts)
        assert llm.healthy()
    for b, a, r in zip(before, after, expect):
        for out in (b, a):
            assert out.first_token == r.first_token
            assert (out.logits - r.logits).abs().max().item() < 1e-4
