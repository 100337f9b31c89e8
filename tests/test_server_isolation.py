"""Promise (issue 15, point 2): the event loop only does I/O, so one client sending 1 MB text prompts
at 4/s (each refused by the byte cap, without being tokenised) leaves other clients' p99 latency
under 2x its baseline and /health under 100 ms. Baseline and attack are measured in the same run."""
import asyncio
import json
import threading
import time

import httpx
import pytest

from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(240)
PHASE_S = 8.0
ATTACK_BODY = json.dumps({"prompt": "a" * 1_000_000, "max_tokens": 1}).encode()


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


async def measure(url: str, seconds: float) -> tuple[list[float], list[float]]:
    """A victim sending short text prompts back to back, and a /health probe every 50 ms."""
    victim, health = [], []
    end = time.monotonic() + seconds

    async def victim_loop(client):
        while time.monotonic() < end:
            t = time.perf_counter()
            r = await client.post("/v1/completions", json={"prompt": "hello there, prefill me", "max_tokens": 1})
            assert r.status_code == 200, r.text
            victim.append(time.perf_counter() - t)

    async def health_loop(client):
        while time.monotonic() < end:
            t = time.perf_counter()
            assert (await client.get("/health")).status_code == 200
            health.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(base_url=url, timeout=60) as a, httpx.AsyncClient(base_url=url, timeout=60) as b:
        await asyncio.gather(victim_loop(a), health_loop(b))
    return victim, health


def attack(url: str, stop: threading.Event, statuses: list) -> None:
    """1 MB text prompts at 4/s, open loop (a slow answer does not slow the attack), from a thread and
    event loop of its own so that its sends do not slow the measuring client."""
    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            async def one():
                r = await client.post("/v1/completions", content=ATTACK_BODY,
                                      headers={"content-type": "application/json"})
                statuses.append((r.status_code, r.json()["error"]["message"]))
            sent = []
            while not stop.is_set():
                sent.append(asyncio.create_task(one()))
                await asyncio.sleep(0.25)
            await asyncio.gather(*sent)
    asyncio.run(run())


def test_megabyte_prompts_do_not_stall_other_clients(tiny_dirs, tmp_path):
    args = [str(tiny_dirs["tiny-deepseek-v3"]), "--engine", "async", "--attention-workers", "1",
            "--expert-workers", "1", "--max-body-kb", "2048"]
    with ServerProcess(args, tmp_path / "server.log") as srv:
        asyncio.run(measure(srv.url, 2.0))                              # warm-up
        base_victim, base_health = asyncio.run(measure(srv.url, PHASE_S))
        stop, statuses = threading.Event(), []
        attacker = threading.Thread(target=attack, args=(srv.url, stop, statuses))
        attacker.start()
        try:
            hit_victim, hit_health = asyncio.run(measure(srv.url, PHASE_S))
        finally:
            stop.set()
            attacker.join()
    assert len(statuses) >= 0.8 * 4 * PHASE_S, f"the attack ran at {len(statuses) / PHASE_S:.1f}/s, not ~4/s"
    base, hit = p99(base_victim), p99(hit_victim)
    print(f"victim p99 {base * 1e3:.1f} ms -> {hit * 1e3:.1f} ms under attack; /health p99 "
          f"{p99(base_health) * 1e3:.1f} -> {p99(hit_health) * 1e3:.1f} ms (max {max(hit_health) * 1e3:.1f})")
    assert hit < 2 * base, f"victim p99 {base * 1e3:.1f} ms -> {hit * 1e3:.1f} ms under attack"
    assert p99(hit_health) < 0.1, f"/health p99 {p99(hit_health) * 1e3:.1f} ms under attack"
    assert all(s == 400 and "bytes of text" in m for s, m in statuses)      # refused before tokenising
