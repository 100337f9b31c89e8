"""Promise: on SIGTERM the server stops accepting connections, finishes the requests in flight, exits 0
and leaves no process behind (workers, resource tracker, anything it started)."""
import asyncio
import signal
import time

import httpx
import pytest

from asap.server.process import ServerProcess, alive, descendants

pytestmark = pytest.mark.timeout(180)
IN_FLIGHT = 4
PROMPT = [(5 * i) % 500 for i in range(4096)]     # long: still running when the signal lands


async def sigterm_mid_load(srv: ServerProcess):
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
        requests = [asyncio.create_task(client.post("/v1/completions", json={"prompt": PROMPT}))
                    for _ in range(IN_FLIGHT)]
        while (await client.get("/health")).json()["pending"] < IN_FLIGHT:
            await asyncio.sleep(0.02)
        procs = descendants(srv.pid)
        srv.signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        still_running = srv.proc.poll() is None
        try:
            async with httpx.AsyncClient(base_url=srv.url, timeout=5) as fresh:
                await fresh.get("/health")
            refused = False
        except httpx.ConnectError:
            refused = True
        responses = await asyncio.gather(*requests)
    return procs, still_running, refused, responses


def test_sigterm_drains_in_flight_requests_exits_0_and_leaves_no_process(tmp_path):
    args = ["tiny-deepseek-v3", "--engine", "async", "--attention-workers", "1", "--expert-workers", "1"]
    srv = ServerProcess(args, tmp_path / "server.log")
    try:
        procs, still_running, refused, responses = asyncio.run(sigterm_mid_load(srv))
        code = srv.wait(60)
    finally:
        srv.stop()
    assert len(procs) >= 2, f"expected the worker processes below the server, found {procs}"
    assert still_running and refused, "new connections must be refused while in-flight requests drain"
    assert [r.status_code for r in responses] == [200] * IN_FLIGHT
    assert all(r.json()["usage"]["prompt_tokens"] == len(PROMPT) for r in responses)
    assert code == 0, srv.log()
    end = time.monotonic() + 10
    while any(alive(p) for p in procs) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in procs if alive(p)], "processes left behind"
    assert "asap serve: stopped" in srv.log()
