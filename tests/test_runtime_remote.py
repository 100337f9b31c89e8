"""Expert workers on "another node": launched by torchrun, joined over torch.distributed (two-node launch)."""
import os
import subprocess
import sys

import pytest
import torch

import asap
from asap.workers.layout import free_port


@pytest.mark.timeout(180)
def test_engine_with_expert_workers_under_torchrun_equals_reference():
    port, rdzv = free_port(), free_port()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 400, 77)]
    with asap.LLM("tiny-deepseek-v3", engine="reference") as ref:
        expect = ref.prefill(prompts)
    experts = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-port", str(rdzv), "-m", "asap.cli", "expert-worker", "--model", "tiny-deepseek-v3",
         "--attention-workers", "2", "--expert-workers", "2", "--transport", "gloo", "--master-port", str(port)],
        env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, transport="gloo",
                      remote_experts=True, master_port=port, token_budget=128) as llm:
            outs = llm.prefill(prompts)
        for out, r in zip(outs, expect):
            assert out.first_token == r.first_token and (out.logits - r.logits).abs().max().item() < 1e-4
        assert experts.wait(timeout=60) == 0          # the remote workers leave once the replicas closed
    finally:
        if experts.poll() is None:
            experts.kill()
        print(experts.stdout.read())
