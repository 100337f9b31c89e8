"""A closed engine (asap.engine.errors.EngineClosed) is a 503 + Retry-After in OpenAI's error shape on every
path into it, never a 500: closed before the request, closed between the health check and the submit, or
closed with the request in flight. /health and /metrics still answer (unhealthy)."""
import asyncio
from concurrent.futures import Future
from types import SimpleNamespace

import httpx

import asap
from asap.config import ModelConfig
from asap.engine.errors import EngineClosed
from asap.server.app import create_app
from asap.server.config import ServerConfig

BODY = {"prompt": [1, 2, 3], "max_tokens": 1}


async def _requests(llm, close=None, paths=("/v1/completions",)):
    app = create_app(llm, ServerConfig(), "m")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                                 base_url="http://t") as client:
        if close:
            close()
        out = {"/v1/completions": await client.post("/v1/completions", json=BODY)}
        for path in paths[1:]:
            out[path] = await client.get(path)
        return out


def _assert_503(r):
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "unavailable_error"
    assert "engine is closed" in err["message"]


def test_a_closed_llm_is_503_and_health_and_metrics_still_answer(tiny_dirs):
    llm = asap.LLM(str(tiny_dirs["tiny-deepseek-v3"]), engine="reference")
    out = asyncio.run(_requests(llm, close=llm.close, paths=("/v1/completions", "/health", "/metrics")))
    _assert_503(out["/v1/completions"])
    assert out["/health"].status_code == 503 and out["/health"].json()["status"] == "unhealthy"
    metrics = out["/metrics"]
    assert metrics.status_code == 200
    assert 'asap:healthy{model_name="m"} 0.0' in metrics.text
    assert 'asap:requests_total{model_name="m",outcome="unavailable"} 1.0' in metrics.text


def test_a_closed_reference_engine_refuses_submit_instead_of_hanging(tiny_dirs):
    llm = asap.LLM(str(tiny_dirs["tiny-deepseek-v3"]), engine="reference")
    llm.engine.close()                      # the engine itself, under an LLM that still holds it
    out = asyncio.run(_requests(llm))
    _assert_503(out["/v1/completions"])
    llm.close()


class _ClosingLLM:
    """healthy() says yes; submit() then finds the engine closed (synchronously, or later on the future)."""
    engine_name = "scripted"

    def __init__(self, cfg, raise_on_submit: bool):
        self.cfg, self.engine, self.raise_on_submit = cfg, SimpleNamespace(), raise_on_submit

    def healthy(self):
        return True

    def submit(self, ids, **kw):
        if self.raise_on_submit:
            raise EngineClosed()
        f = Future()
        f.set_exception(EngineClosed())
        return f


def test_closed_between_health_check_and_submit_or_in_flight_is_503(tiny_dirs):
    cfg = ModelConfig.from_dir(tiny_dirs["tiny-deepseek-v3"])
    for raise_on_submit in (True, False):
        _assert_503(asyncio.run(_requests(_ClosingLLM(cfg, raise_on_submit)))["/v1/completions"])
