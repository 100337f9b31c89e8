"""Faults and process hygiene (issue: runtime, points 1 and 11)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import asap


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:            # gone, or reaped between open() and read() (ESRCH)
        return False


def _wait_gone(pids, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["expert0", "attention1"])
def test_dead_worker_fails_requests_and_engine_reports_unhealthy(victim):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (2000,), generator=g).tolist() for _ in range(24)]
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, token_budget=64,
                  comm_timeout_s=10) as llm:
        futures = [llm.submit(p) for p in prompts]
        time.sleep(0.5)
        os.kill(llm.engine.cluster.procs[victim].pid, signal.SIGKILL)
        t0 = time.monotonic()
        errors = 0
        for f in futures:
            try:
                f.result(timeout=30)
            except Exception as e:  # noqa: BLE001
                errors += 1
                assert "died" in str(e) or "did not answer" in str(e), e
        assert time.monotonic() - t0 < 30
        assert errors > 0                     # the kill landed while requests were in flight
        assert not llm.healthy()
        with pytest.raises(Exception, match="unhealthy"):
            llm.submit([1, 2, 3]).result(timeout=5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine,kw", [("async", dict(attention_workers=2, expert_workers=1)), ("sync", dict(devices=2))])
def test_close_stops_every_worker(engine, kw):
    llm = asap.LLM("tiny-deepseek-v3", engine=engine, **kw)
    pids = [p.pid for p in llm.engine.cluster.procs.values()]
    assert all(_alive(p) for p in pids)
    llm.prefill([[1, 2, 3]])
    llm.close()
    assert _wait_gone(pids, 2) == []


@pytest.mark.timeout(120)
def test_workers_exit_when_the_engine_process_is_killed(tmp_path):
    script = textwrap.dedent("""
        import sys, time, asap
        llm = asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=1, expert_workers=2)
        print(" ".join(str(p.pid) for p in llm.engine.cluster.procs.values()), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_gone(pids, 10) == []
    finally:
        proc.kill()


def test_bad_prompts_raise_value_error_naming_the_prompt():
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=1, expert_workers=1) as llm:
        for bad, msg in [([], "prompt 1: empty"), ([5, 512], "prompt 1: token id 512 outside"),
                         ([-1], "prompt 1: token id -1"), ([1.5], "prompt 1: token ids must be"),
                         (list(range(5000)), "prompt 1: 5000 tokens exceeds")]:
            with pytest.raises(ValueError, match=msg):
                llm.prefill([[1, 2], bad])
        out = llm.prefill([[1, 2], [3]])           # the engine is unaffected
        assert len(out) == 2 and llm.healthy()
