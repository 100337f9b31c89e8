"""Promise: under ~3x overload the server sheds with 503 + Retry-After, and no request is unaccounted
for: every request sent gets an HTTP response, every admitted one completes, and the server's
counters agree with the client's. ASAP_SERVER_LOAD_S sets the overload phase (default 30 s)."""
import asyncio
import collections
import os
import time

import httpx
import pytest

from asap.server.process import ServerProcess

LOAD_S = float(os.environ.get("ASAP_SERVER_LOAD_S", "30"))
MAX_PENDING = 8
PROMPT = [(7 * i) % 500 for i in range(1024)]    # long enough that the engine, not HTTP, is the bottleneck
pytestmark = pytest.mark.timeout(int(2 * LOAD_S) + 150)


def counters(client: httpx.Client) -> dict[str, float]:
    """asap:requests_total by outcome, plus running + waiting and the TTFT histogram's count."""
    out = {"asap_queue_depth": 0.0}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("asap:requests_total{"):
            out[line.split('outcome="')[1].split('"')[0]] = float(line.split()[-1])
        elif line.startswith(("asap:num_requests_running{", "asap:num_requests_waiting{")):
            out["asap_queue_depth"] += float(line.split()[-1])
        elif line.startswith("asap:time_to_first_token_seconds_count{"):
            out["asap_ttft_seconds_count"] = float(line.split()[-1])
    return out


async def measure_capacity(url: str, seconds: float) -> float:
    """Completions per second with MAX_PENDING clients back to back (the server never sheds)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        end, done = time.monotonic() + seconds, 0

        async def loop():
            nonlocal done
            while time.monotonic() < end:
                r = await client.post("/v1/completions", json={"prompt": PROMPT, "return_kv": False})
                assert r.status_code == 200, r.text
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(MAX_PENDING)))
        return done / (time.monotonic() - t0)


async def open_loop(url: str, rate: float, seconds: float) -> list:
    """Send at a fixed rate whatever the server does; one (status, headers) or error per request."""
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=None)) as client:
        async def one():
            try:
                r = await client.post("/v1/completions", json={"prompt": PROMPT, "return_kv": False})
                return r.status_code, r.headers, r.json()
            except httpx.HTTPError as e:
                return f"{type(e).__name__}: {e}", None, None

        t0, tasks = time.monotonic(), []
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        return await asyncio.gather(*tasks)


def test_overload_sheds_with_503_and_accounts_for_every_request(tiny_dirs, tmp_path):
    args = ["tiny-deepseek-v3", "--engine", "async", "--attention-workers", "1", "--expert-workers", "1",
            "--max-pending", str(MAX_PENDING)]
    with ServerProcess(args, tmp_path / "server.log") as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        capacity = asyncio.run(measure_capacity(srv.url, 3.0))
        before = counters(client)
        results = asyncio.run(open_loop(srv.url, 3 * capacity, LOAD_S))
        after = counters(client)
        assert srv.proc.poll() is None

    sent = len(results)
    statuses = collections.Counter(status for status, _, _ in results)
    print(f"capacity {capacity:.1f}/s, offered {3 * capacity:.1f}/s for {LOAD_S:.0f}s: {sent} sent, {dict(statuses)}")
    assert all(isinstance(s, int) for s in statuses), f"requests without an HTTP response: {statuses}"
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] > 0 and statuses[503] > 0, f"{sent} sent at {3 * capacity:.1f}/s: {statuses}"
    for status, headers, body in results:
        if status == 503:
            assert headers["retry-after"] == "1" and body["error"]["type"] == "overloaded_error"
        else:
            assert body["usage"]["prompt_tokens"] == len(PROMPT)

    diff = {k: after[k] - before.get(k, 0) for k in after}
    outcomes = {k: v for k, v in diff.items() if not k.startswith("asap_")}
    assert sum(outcomes.values()) == sent, (outcomes, sent)
    assert outcomes["ok"] == statuses[200] == diff["asap_ttft_seconds_count"]
    assert outcomes["rejected"] == statuses[503]
    assert after["asap_queue_depth"] == 0
