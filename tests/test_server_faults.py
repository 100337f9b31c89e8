"""Promise: when an expert worker is killed (SIGKILL) or hung (SIGSTOP) under load, the requests in flight
get 503 + Retry-After within the heartbeat timeout (not comm_timeout_s), /health turns 503, the server
restarts its workers (reloading their weights) and is healthy and serving again, with no request left
without a response. Past --shutdown-timeout-s, unfinished requests get 503 JSON and the log no traceback."""
import asyncio
import os
import signal
import time

import httpx
import pytest

from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(240)
COMM_TIMEOUT_S = 60.0                   # the default: a hung peer must be found by its heartbeats, not this
HEARTBEAT_TIMEOUT_S = 2.0
FAIL_WITHIN_S = HEARTBEAT_TIMEOUT_S + 4  # the bound on how long an in-flight request may hang after the fault
PROMPT = [(3 * i) % 500 for i in range(1024)]   # long: requests spend most of their time mid-pipeline


async def scenario(url: str, sig: int, clients: int = 4):
    results, health, stop = [], [], asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def load():
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = await client.post("/v1/completions", json={"prompt": PROMPT, "return_kv": False})
                    results.append((t0, time.monotonic(), r.status_code, r.text, r.headers.get("retry-after")))
                except httpx.HTTPError as e:
                    results.append((t0, time.monotonic(), f"{type(e).__name__}: {e}", "", None))
                if results[-1][2] != 200:
                    await asyncio.sleep(0.2)

        before = (await client.get("/health")).json()
        loops = [asyncio.create_task(load()) for _ in range(clients)]
        while len(results) < 2 * clients:               # load is flowing
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        victim = before["workers"]["expert0"]["pid"]
        os.kill(victim, sig)
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
        try:
            os.kill(victim, signal.SIGCONT)              # a stopped worker resumed late must change nothing
        except ProcessLookupError:
            pass                                         # the restart killed it
    return before, killed_at, results, health, after


def transitions(health, t0):
    out = []
    for t, status, body in health:
        if not out or out[-1][1:] != (status, body["status"], body["restarts"]):
            out.append((round(t - t0, 2), status, body["status"], body["restarts"]))
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_dead_or_hung_expert_worker_fails_in_flight_requests_and_the_server_recovers(tmp_path, sig):
    args = ["tiny-deepseek-v3", "--engine", "async", "--attention-workers", "1", "--expert-workers", "1",
            "--comm-timeout-s", str(COMM_TIMEOUT_S), "--heartbeat-timeout-s", str(HEARTBEAT_TIMEOUT_S),
            "--heartbeat-interval-s", "0.2"]
    with ServerProcess(args, tmp_path / "server.log") as srv:
        before, killed_at, results, health, after = asyncio.run(scenario(srv.url, sig))
        assert srv.proc.poll() is None

    assert all(isinstance(status, int) for _, _, status, _, _ in results), "a request got no HTTP response"
    assert {status for _, _, status, _, _ in results} <= {200, 503}
    in_flight = [(end, status, text) for start, end, status, text, _ in results if start < killed_at < end]
    assert in_flight and all(end - killed_at < FAIL_WITHIN_S for end, _, _ in in_flight), \
        [(round(end - killed_at, 2), status) for end, status, _ in in_flight]
    assert any(status == 503 for _, status, _ in in_flight), in_flight
    assert all(retry == "1" for _, _, status, _, retry in results if status == 503)

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
    after_recovery = [(round(start - killed_at, 2), status, text[:80]) for start, _, status, text, _ in results
                      if start > recovered_at]
    assert any(status == 200 for _, status, _ in after_recovery), (after_recovery, transitions(health, killed_at))


def test_requests_past_the_shutdown_timeout_get_503_json_and_no_traceback(tmp_path):
    args = ["tiny-deepseek-v3", "--engine", "async", "--attention-workers", "1", "--expert-workers", "1",
            "--shutdown-timeout-s", "1"]
    prompt = [(5 * i) % 500 for i in range(4096)]

    async def run(srv):
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            requests = [asyncio.create_task(client.post("/v1/completions", json={"prompt": prompt}))
                        for _ in range(8)]                   # several seconds of work: more than the 1 s allowed
            while (await client.get("/health")).json()["pending"] < 8:
                await asyncio.sleep(0.02)
            srv.signal(signal.SIGTERM)
            return await asyncio.gather(*requests)

    srv = ServerProcess(args, tmp_path / "server.log")
    try:
        responses = asyncio.run(run(srv))
        code = srv.wait(60)
    finally:
        srv.stop()
    statuses = [r.status_code for r in responses]
    assert 503 in statuses and set(statuses) <= {200, 503}, statuses
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"]["type"] in ("unavailable_error", "overloaded_error"), r.text
            assert r.headers.get("retry-after") == "1"
    assert code == 0
    assert "Traceback" not in srv.log() and "CancelledError" not in srv.log(), srv.log()


def test_a_request_cut_off_at_shutdown_takes_no_late_engine_result():
    """cut_off answers a waiting request first; the engine's result arriving afterwards is dropped quietly."""
    from concurrent.futures import Future

    from asap.server.service import _follow

    async def run():
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        engine_future = Future()
        wait = _follow(engine_future)
        wait.set_exception(RuntimeError("cut off"))
        engine_future.set_result("late")             # as the engine thread would, after the cut-off
        await asyncio.sleep(0.05)
        follow_ok = _follow(Future())
        return errors, wait, engine_future, follow_ok

    errors, wait, engine_future, _ = asyncio.run(run())
    assert errors == [], errors
    assert isinstance(wait.exception(), RuntimeError) and engine_future.result() == "late"


def test_a_followed_engine_future_delivers_its_result_and_error():
    from concurrent.futures import Future

    from asap.server.service import _follow

    async def run():
        ok, bad = Future(), Future()
        w_ok, w_bad = _follow(ok), _follow(bad)
        ok.set_result(7)
        bad.set_exception(ValueError("x"))
        await asyncio.wait([w_ok, w_bad], timeout=5)
        return w_ok, w_bad

    w_ok, w_bad = asyncio.run(run())
    assert w_ok.result() == 7 and isinstance(w_bad.exception(), ValueError)
