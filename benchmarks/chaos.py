"""Chaos run of `asap serve`: steady load while workers are killed, stopped and resumed and hostile clients
connect. Prints the requests sent, answered (by status code) and lost (no HTTP answer: must be 0), and
/health's latency all along (p50 / p99 / max).

    python benchmarks/chaos.py --duration-s 90

Faults, one every --fault-every-s, in turn: kill -9 of a random worker; SIGSTOP of a random worker,
SIGCONT a few seconds later (before or after the heartbeat timeout). Hostile clients all along:
slowloris connections (silent, or trickling headers), garbage bodies, prompts over the model's length
(token ids past max positions, a 2 MB body, a 1 MB text), huge answers (n x logprobs x echo over
--max-response-mb: must be 400; a big one under it: must not stall /health), clients that hang up on a
4,000-token prompt after 0.3 s (plain and streaming: their work must be cancelled, so `pending` is 0 at
the end), a forged Host header (must never reach kv_url or a Location), and sampling values that would
empty the distribution (NaN, Infinity, underflow: must be 400, never 500). Real compute on CPU: timings
are noisy.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

from asap.server.process import ServerProcess


class Tally:
    def __init__(self):
        self.sent, self.lost, self.status = 0, 0, collections.Counter()
        self.lost_examples: list[str] = []

    def answer(self, code: int):
        self.status[code] += 1

    def lose(self, why: str):
        self.lost += 1
        self.lost_examples.append(why)

    def line(self) -> str:
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(self.status.items()))
        return f"sent {self.sent}, answered {sum(self.status.values())} ({codes}), lost {self.lost}"


async def post(client, tally: Tally, **kw):
    tally.sent += 1
    try:
        r = await client.post("/v1/completions", **kw)
        tally.answer(r.status_code)
        return r.status_code
    except httpx.HTTPError as e:
        tally.lose(f"{type(e).__name__}: {e}")
        return None


async def load(client, tally: Tally, stop: asyncio.Event, rng: random.Random):
    while not stop.is_set():
        prompt = [rng.randrange(500) for _ in range(rng.randint(16, 2048))]
        if await post(client, tally, json={"prompt": prompt, "max_tokens": 1}) != 200:
            await asyncio.sleep(0.2)            # 503 + Retry-After: back off a little, as a client would


async def slowloris(host: str, port: int, stats: collections.Counter, trickle: bool):
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for byte in b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" if trickle else b"":
            writer.write(bytes([byte]))
            await asyncio.sleep(0.5)
            if reader.at_eof():
                break
        data = await asyncio.wait_for(reader.read(), timeout=120)
        stats["slowloris dropped"] += 1
        stats["slowloris answered"] += bool(data)
    except (ConnectionError, OSError):
        stats["slowloris dropped"] += 1
    except asyncio.TimeoutError:
        stats["slowloris never dropped"] += 1
    finally:
        stats["slowloris max open s"] = max(stats["slowloris max open s"], round(time.monotonic() - t0))
        writer.close()


LONG = [(7 * i) % 500 for i in range(4000)]
BAD_SAMPLING = [b'"top_p": 1e-300', b'"min_p": 1e-300', b'"top_p": NaN', b'"temperature": Infinity',
                b'"logit_bias": {"5": NaN}', b'"logit_bias": {"5": -Infinity}', b'"temperature": NaN']


async def hang_up(url: str, stats, stream: bool):
    """A client that sends a long prompt and gives up after 0.3 s: no answer is expected, nor lost."""
    async with httpx.AsyncClient(base_url=url) as client:
        try:
            await client.post("/v1/completions", json={"prompt": LONG, "stream": stream}, timeout=0.3)
            stats["hang-up answered within 0.3s"] += 1
        except httpx.HTTPError:
            stats["hang-up gone"] += 1


async def forged_host(client, tally: Tally, stats):
    """Host: evil.example must reach neither kv_url nor a redirect's Location."""
    tally.sent += 2
    try:
        r = await client.post("/v1/completions", headers={"Host": "evil.example:6666"},
                              json={"prompt": [1, 2, 3], "kv_transfer_params": {"do_remote_decode": True}})
        tally.answer(r.status_code)
        stats["forged-host leaked"] += "evil" in r.text
        r = await client.get("/v1/models/", headers={"Host": "evil.example:6666"})
        tally.answer(r.status_code)
        stats["forged-host leaked"] += "evil" in r.headers.get("location", "") + r.text
    except httpx.HTTPError as e:
        tally.lose(f"{type(e).__name__}: {e}")


async def hostile(client, url: str, tally: Tally, stats, stop: asyncio.Event, rng: random.Random):
    host, port = url.removeprefix("http://").split(":")
    port = int(port)
    kinds = ["garbage", "bad-json", "long-ids", "2MB-body", "1MB-text", "slowloris", "slowloris-trickle",
             "huge-answer", "big-answer", "hang-up", "hang-up-stream", "forged-host", "bad-sampling"]
    tasks = []
    while not stop.is_set():
        kind = rng.choice(kinds)
        stats[kind] += 1
        if kind == "garbage":
            await post(client, tally, content=os.urandom(rng.randint(1, 4096)))
        elif kind == "bad-json":
            await post(client, tally, content=rng.choice([b'{"prompt": [1, 2', b'{"prompt": "\\ud800"}', b"[]",
                                                          b'{"prompt": NaN}', b'{"prompt": [1e999]}']))
        elif kind == "long-ids":
            await post(client, tally, json={"prompt": [1] * 100_000})
        elif kind == "2MB-body":
            await post(client, tally, content=b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
        elif kind == "1MB-text":
            await post(client, tally, json={"prompt": "word " * (1 << 18)})
        elif kind == "huge-answer":      # ~430 MB of JSON if built: must be refused up front
            code = await post(client, tally, json={"prompt": LONG, "echo": True, "logprobs": 20, "n": 128})
            stats["huge-answer not 400"] += code is not None and code != 400
        elif kind == "big-answer":       # ~20 MB, under the cap: built off the loop
            await post(client, tally, json={"prompt": LONG[:2000], "echo": True, "logprobs": 20, "n": 16})
        elif kind.startswith("hang-up"):
            tasks.append(asyncio.create_task(hang_up(url, stats, stream=kind.endswith("stream"))))
        elif kind == "forged-host":
            await forged_host(client, tally, stats)
        elif kind == "bad-sampling":
            code = await post(client, tally, content=b'{"prompt": [1, 2, 3], ' + rng.choice(BAD_SAMPLING) + b"}",
                              headers={"content-type": "application/json"})
            stats["bad-sampling not 400"] += code is not None and code != 400
        else:
            tasks.append(asyncio.create_task(slowloris(host, port, stats, trickle=kind.endswith("trickle"))))
        await asyncio.sleep(rng.uniform(0.2, 1.0))
    await asyncio.gather(*tasks)


async def faults(client, stop: asyncio.Event, every_s: float, rng: random.Random, log: list):
    n = 0
    while not stop.is_set():
        await asyncio.sleep(every_s)
        workers = (await client.get("/health")).json().get("workers", {})
        alive = [name for name, w in workers.items() if w["alive"]]
        if not alive or stop.is_set():
            continue
        name = rng.choice(alive)
        pid = workers[name]["pid"]
        t0 = time.monotonic()
        watch = asyncio.create_task(watch_health(client, t0))
        if n % 2 == 0:
            os.kill(pid, signal.SIGKILL)
            log.append(f"kill -9 {name}")
        else:
            os.kill(pid, signal.SIGSTOP)
            resume_s = rng.uniform(2.0, 9.0)
            await asyncio.sleep(resume_s)
            try:
                os.kill(pid, signal.SIGCONT)
                log.append(f"SIGSTOP {name}, SIGCONT after {resume_s:.1f}s")
            except ProcessLookupError:
                log.append(f"SIGSTOP {name} (restarted before the SIGCONT due at {resume_s:.1f}s)")
        red, green = await watch
        log[-1] += ((f" -> /health red after {red - t0:.1f}s, " + (f"green again after {green - t0:.1f}s" if green
                                                                  else "NOT green again within 120 s")) if red else
                    " -> /health stayed green")
        n += 1


async def watch_health(client, t0: float, red_within_s: float = 15, green_within_s: float = 120):
    """When /health first turns red after t0 (None if it stays green), and then green again."""
    red = green = None
    while time.monotonic() < t0 + (green_within_s if red else red_within_s):
        ok = (await client.get("/health")).status_code == 200
        if red is None and not ok:
            red = time.monotonic()
        elif red is not None and ok:
            green = time.monotonic()
            break
        await asyncio.sleep(0.1)
    return red, green


async def probe_health(url: str, stop: asyncio.Event, latencies: list):
    """/health's latency all along, on a connection of its own (answered 200 or 503: both count)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                await client.get("/health")
                latencies.append(time.monotonic() - t0)
            except httpx.HTTPError:
                latencies.append(float("inf"))
            await asyncio.sleep(0.2)


def percentile(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def run(srv: ServerProcess, args) -> tuple:
    rng = random.Random(args.seed)
    good, bad, stats, log, latencies = Tally(), Tally(), collections.Counter(), [], []
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        tasks = [asyncio.create_task(load(client, good, stop, random.Random(rng.random()))) for _ in range(args.clients)]
        tasks.append(asyncio.create_task(hostile(client, srv.url, bad, stats, stop, random.Random(rng.random()))))
        tasks.append(asyncio.create_task(faults(client, stop, args.fault_every_s, random.Random(rng.random()), log)))
        tasks.append(asyncio.create_task(probe_health(srv.url, stop, latencies)))
        await asyncio.sleep(args.duration_s)
        stop.set()
        await asyncio.gather(*tasks)
        end = time.monotonic() + 60             # abandoned work is cancelled: nothing stays pending
        while (health := (await client.get("/health")).json())["pending"] and time.monotonic() < end:
            await asyncio.sleep(0.2)
        metrics = (await client.get("/metrics")).text
    aborted = sum(float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("asap:requests_total{") and 'outcome="aborted"' in line)
    return good, bad, stats, log, health, latencies, aborted


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=90.0)
    p.add_argument("--fault-every-s", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="tiny-deepseek-v3")
    args = p.parse_args()
    log_path = Path(tempfile.mkdtemp(prefix="asap-chaos-")) / "server.log"
    serve_args = [args.model, "--engine", "async", "--attention-workers", "2", "--expert-workers", "2"]
    print(f"asap chaos: asap serve {' '.join(serve_args)} (defaults otherwise), {args.duration_s:.0f}s, "
          f"{args.clients} load clients, a fault every {args.fault_every_s:.0f}s; real compute on CPU, timings noisy")
    srv = ServerProcess(serve_args, log_path)
    try:
        good, bad, stats, log, health, latencies, aborted = asyncio.run(run(srv, args))
    finally:
        code = srv.stop()
    for line in log:
        print(f"  fault: {line}")
    print(f"load requests:    {good.line()}")
    print(f"hostile requests: {bad.line()}")
    print("hostile clients:  " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    print(f"/health latency over {len(latencies)} probes: p50 {percentile(latencies, 0.5) * 1e3:.0f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1e3:.0f} ms, max {max(latencies, default=0) * 1e3:.0f} ms")
    print(f"server: {health['restarts']} restarts, health at the end {health['status']!r}, pending at the end "
          f"{health['pending']}, {aborted:.0f} requests counted aborted, exit code {code}; "
          f"tracebacks in its log: {srv.log().count('Traceback')} (log: {log_path})")
    for why in (good.lost_examples + bad.lost_examples)[:5]:
        print(f"  lost: {why}")
    broken = (good.lost or bad.lost or stats["slowloris never dropped"] or code or health["pending"] or
              bad.status[500] or stats["forged-host leaked"] or stats["huge-answer not 400"] or
              stats["bad-sampling not 400"])
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
