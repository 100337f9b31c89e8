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
