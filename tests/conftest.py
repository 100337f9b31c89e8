import os
import tempfile

import pytest

# Presets materialise into a per-session cache so tests never touch ~/.cache.
os.environ.setdefault("ASAP_CACHE", os.path.join(tempfile.gettempdir(), "asap-test-cache"))


@pytest.fixture(scope="session")
def tiny_dirs():
    from asap.model.materialize import resolve_model
    return {name: resolve_model(name) for name in ("tiny-deepseek-v3", "tiny-qwen3-moe")}


@pytest.fixture
def ranks():
    """Four shm ranks in this process: 0, 1 attention; 2, 3 experts (asap.comm tests)."""
    from asap.comm import ShmTransportSpec
    spec = ShmTransportSpec(4, ring_bytes=64 << 10, send_timeout=0.3)
    ts = [spec.connect(r) for r in range(4)]
    yield ts
    for t in ts:
        t.close()
    spec.cleanup()


@pytest.fixture(scope="session")
def roomy(tmp_path_factory):
    """cloudmatrix384 with memory enough for DeepSeek-V3 on 2-4 devices (a test profile: times unchanged)."""
    import dataclasses

    from asap.cost.hardware import get_hardware
    path = tmp_path_factory.mktemp("hw") / "roomy.json"
    dataclasses.replace(get_hardware("cloudmatrix384"), name="roomy", memory_bytes=1e13).save(path)
    return str(path)


@pytest.fixture
def same_as_reference():
    """check(prompts, outs, expect): each engine output equals the reference engine's (first token, logits
    within 1e-4, every KV tensor of the prompt's length within 1e-5)."""
    import torch

    def check(prompts, outs, expect):
        for p, out, r in zip(prompts, outs, expect, strict=True):
            assert out.first_token == r.first_token
            assert (out.logits - r.logits).abs().max().item() < 1e-4
            for a, b in zip(out.kv, r.kv):
                for name in b:
                    assert a[name].shape == (len(p), *b[name].shape[1:])
                    assert torch.allclose(a[name], b[name], atol=1e-5)
    return check
