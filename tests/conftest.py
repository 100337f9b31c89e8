import os
import tempfile

import pytest

# Presets materialise into a per-session cache so tests never touch ~/.cache.
os.environ.setdefault("ASAP_CACHE", os.path.join(tempfile.gettempdir(), "asap-test-cache"))


@pytest.fixture(scope="session")
def tiny_dirs():
    from asap.model.materialize import resolve_model
    return {name: resolve_model(name) for name in ("tiny-deepseek-v3", "tiny-qwen3-moe")}
