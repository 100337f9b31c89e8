"""Promise: when an expert worker is killed (SIGKILL) under load, the requests in flight get a 5xx
within a bounded time, /health turns 503, the server restarts its workers (reloading their weights)
and is healthy and serving again, with no request left without a response."""
import asyncio
import os
import signal
import time

import httpx
import pytest

from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(240)
COMM_TIMEOUT_S = 10.0
FAIL_WITHIN_S = COMM_TIMEOUT_S + 10     # the bound on how long an in-flight request may hang after the kill
PROMPT = [(3 * i) % 500 for i in range(1024)]   # long: requests spend most of their time mid-pipeline


async def scenario(url: str, clients: int = 4):
    results, health, stop = [], [], asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def load():
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = await client.post("/v1/completions", json={"prompt": PROMPT, "return_kv": False})
                    results.append((t0, time.monotonic(), r.status_code, r.text))
                except httpx.HTTPError as e:
                    results.append((t0, time.monotonic(), f"{type(e).__name__}: {e}", ""))
                if results[-1][2] != 200:
                    await asyncio.sleep(0.2)

        before = (await client.get("/health")).json()
        loops = [asyncio.create_task(load()) for _ in range(clients)]
        while len(results) < 2 * clients:               # load is flowing
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        os.kill(before["workers"]["expert0"]["pid"], signal.SIGKILL)
        while time.monotonic() < killed_at + 150:
            r = await client.get("/health")
            health.append((time.monotonic(), r.status_code, r.json()))
            if r.status_code == 200 and any(s == 503 for _, s, _ in health):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)                         # serve a little after recovery
        stop.set()
        await asyncio.gather(*loops)
        after = (await client.get("/health")).json()
    return before, killed_at, results, health, after


def transitions(health, t0):
    out = []
    for t, status, body in health:
        if not out or out[-1][1:] != (status, body["status"], body["restarts"]):
            out.append((round(t - t0, 2), status, body["status"], body["restarts"]))
    return out


def test_killed_expert_worker_fails_in_flight_requests_and_the_server_recovers(tmp_path):
    args = ["tiny-deepseek-v3", "--engine", "async", "--attention-workers", "1", "--expert-workers", "1",
            "--comm-timeout-s", str(COMM_TIMEOUT_S)]
    with ServerProcess(args, tmp_path / "server.log") as srv:
        before, killed_at, results, health, after = asyncio.run(scenario(srv.url))
        assert srv.proc.poll() is None

    assert all(isinstance(status, int) for _, _, status, _ in results), "a request got no HTTP response"
    assert {status for _, _, status, _ in results} <= {200, 500, 503}
    in_flight = [(end, status, text) for start, end, status, text in results if start < killed_at < end]
    assert in_flight and all(end - killed_at < FAIL_WITHIN_S for end, _, _ in in_flight)
    assert any(status >= 500 for _, status, _ in in_flight), in_flight

    statuses = [status for _, status, _ in health]
    print(f"in flight at the kill: {[(round(end - killed_at, 2), status) for end, status, _ in in_flight]}; "
          f"healthy again after {next(t for t, s, _ in reversed(health) if s == 200) - killed_at:.1f}s")
    assert 503 in statuses, "health never reported the dead worker"
    first_503 = statuses.index(503)
    assert 200 in statuses[first_503:], f"not healthy again: {health[-1]}"
    assert {h["status"] for _, s, h in health if s == 503} <= {"unhealthy", "restarting"}
    assert after["restarts"] >= 1 and after["workers"]["expert0"]["alive"]
    assert after["workers"]["expert0"]["pid"] != before["workers"]["expert0"]["pid"]
    recovered_at = next(t for t, s, _ in health[first_503:] if s == 200)
    after_recovery = [(round(start - killed_at, 2), status, text[:80]) for start, _, status, text in results
                      if start > recovered_at]
    assert any(status == 200 for _, status, _ in after_recovery), (after_recovery, transitions(health, killed_at))
