"""Promise: `asap serve` on a broken model directory prints one line naming the file and exits 2
(no traceback); `--api-key` and ASAP_API_KEY come from the config's field help like every flag."""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def serve(model_dir, *flags, env=None):
    return subprocess.run([sys.executable, "-m", "asap.cli", "serve", str(model_dir), "--engine", "reference",
                           "--port", "0", *flags], capture_output=True, text=True, timeout=100,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("breakage, names", [
    (lambda d: (d / "config.json").write_text("{not json"), "config.json"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "hidden_size": "64"})), "hidden_size"),
    (lambda d: [f.unlink() for f in d.glob("*.safetensors")], "safetensors"),
])
def test_a_broken_model_is_one_line_and_exit_code_2(tiny_dirs, tmp_path, breakage, names):
    d = tmp_path / "m"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], d)
    breakage(d)
    r = serve(d)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr and names in lines[0], r.stderr


def test_api_key_flag_is_in_the_help():
    r = subprocess.run([sys.executable, "-m", "asap.cli", "serve", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert "--api-key" in r.stdout and "ASAP_API_KEY" in r.stdout


def test_asap_api_key_env_guards_like_the_flag(tiny_dirs, monkeypatch):
    import asyncio
    from types import SimpleNamespace

    import httpx

    from asap.config import ModelConfig
    from asap.server.app import create_app
    from asap.server.config import ServerConfig

    monkeypatch.setenv("ASAP_API_KEY", "k1")
    llm = SimpleNamespace(cfg=ModelConfig.from_dir(tiny_dirs["tiny-deepseek-v3"]), engine=SimpleNamespace(),
                          engine_name="stub", healthy=lambda: True)
    app = create_app(llm, ServerConfig(), "m")

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return [(await c.get(path, headers=h)).status_code for path, h in
                    (("/health", {}), ("/v1/models", {}), ("/v1/models", {"Authorization": "Bearer k1"}),
                     ("/v1/kv/kv-x", {"Authorization": "Bearer k2"}))]

    assert asyncio.run(run()) == [200, 401, 200, 401]
