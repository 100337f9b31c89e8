"""Promise (issue 15 points 6 and 8): close(), restart and Ctrl-C stop 2+2 workers in about a second,
attention workers before expert workers, even when a worker is dead or SIGSTOPped; a closed engine
says so (RuntimeError "engine is closed") from every method; a broken model fails the engine's
constructor with the one-line ModelLoadError, not a worker's traceback."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import asap
from asap.engine.errors import EngineClosed
from asap.model.errors import ModelLoadError

pytestmark = pytest.mark.timeout(120)
STOP_WITHIN_S = 2.5          # the design bound is 2 x stop_grace_s (0.5 s) plus process exit; slack for a loaded CI
LONG = [[(7 * i + j) % 500 for j in range(2000)] for i in range(8)]


def _llm(**kw):
    return asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2, token_budget=64, **kw)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:                          # gone, or reaped between open() and read() (ESRCH)
        return False


@pytest.mark.parametrize("engine", ["async", "reference"])
def test_every_method_of_a_closed_engine_says_it_is_closed(engine):
    llm = asap.LLM("tiny-deepseek-v3", engine=engine, **({"attention_workers": 1} if engine == "async" else {}))
    inner = llm.engine
    llm.close()
    llm.close()                                              # idempotent
    for call in (lambda: llm.submit([1, 2, 3]), lambda: llm.prefill([[1, 2, 3]]), llm.healthy):
        with pytest.raises(RuntimeError, match="^engine is closed$"):
            call()
    if engine == "async":
        for call in (lambda: inner.submit(0, [1, 2]), inner.healthy, inner.restart, lambda: inner.rebalance(0),
                     inner.worker_fractions):
            with pytest.raises(EngineClosed, match="^engine is closed$"):
                call()


@pytest.mark.parametrize("fault", ["none", "sigstop-expert", "sigstop-attention", "sigkill-expert"])
def test_close_mid_prefill_is_fast_whatever_state_the_workers_are_in(fault):
    llm = _llm()
    procs = llm.engine.cluster.procs
    pids = [p.pid for p in procs.values()]
    futures = [llm.submit(p) for p in LONG]
    time.sleep(0.5)
    if fault != "none":
        sig, victim = (signal.SIGKILL if "kill" in fault else signal.SIGSTOP), fault.split("-")[1] + "0"
        os.kill(procs[victim].pid, sig)
        time.sleep(0.2)
    t0 = time.monotonic()
    llm.close()
    took = time.monotonic() - t0
    print(f"close() with fault={fault}: {took:.2f}s")
    assert took < STOP_WITHIN_S
    assert not [p for p in pids if _alive(p)]
    for f in futures:                                         # every request got an answer: a result or an error
        assert f.done()


def test_restart_after_an_expert_kill_is_fast():
    with _llm(comm_timeout_s=60) as llm:
        futures = [llm.submit(p) for p in LONG]
        time.sleep(0.5)
        os.kill(llm.engine.cluster.procs["expert0"].pid, signal.SIGKILL)
        for f in futures:
            try:
                f.result(timeout=10)                          # failed by the watchdog, not after comm_timeout_s
            except RuntimeError:
                pass
        t0 = time.monotonic()
        llm.engine.restart()                                  # stops the rest, starts 4 workers, reloads weights
        took = time.monotonic() - t0
        print(f"restart after an expert kill: {took:.2f}s")
        assert took < STOP_WITHIN_S + 2.0                     # stop <= ~1 s, then start-up (a loaded machine: slower)
        assert llm.healthy() and len(llm.prefill([[1, 2, 3]])) == 1


def test_ctrl_c_during_a_prefill_exits_fast(tmp_path):
    # Python keeps SIGINT ignored if it starts that way (a job started with & by a non-interactive shell):
    # give the script the terminal's default, which is what a user's Ctrl-C meets.
    script = textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import asap
        with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=2, expert_workers=2,
                      token_budget=64) as llm:
            futures = [llm.submit(p) for p in {LONG!r}]
            print(" ".join(str(p.pid) for p in llm.engine.cluster.procs.values()), flush=True)
            [f.result() for f in futures]
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 4
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        took = time.monotonic() - t0
        print(f"Ctrl-C during a prefill -> exit: {took:.2f}s")
        assert "KeyboardInterrupt" in proc.stderr.read()
        assert took < STOP_WITHIN_S
        assert not [p for p in pids if _alive(p)]
    finally:
        proc.kill()


# sync: a rank's send into the full ring of a peer that has already exited must give up too (the transport's
# alive check); once, before it had one, a sync rank outlived its engine by more than 15 s.
@pytest.mark.parametrize("engine,layout", [("async", "attention_workers=2, expert_workers=2"), ("sync", "devices=2")])
def test_workers_exit_soon_after_their_engine_process_is_killed(engine, layout):
    """SIGKILL (or a SIGTERM with Python's default handler) leaves no clean-up to run in the engine's process:
    its workers must notice by themselves, mid-step included (an attention worker waiting for a combine
    from experts that have already gone), well before their comm timeout."""
    script = textwrap.dedent(f"""
        import time, asap
        llm = asap.LLM("tiny-deepseek-v3", engine="{engine}", {layout}, compute="emulated", dilation=50,
                       comm_timeout_s=60)
        futures = [llm.submit(num_tokens=2000) for _ in range(4)]
        print(" ".join(str(p.pid) for p in llm.engine.cluster.procs.values()), flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, proc.stderr.read()
        time.sleep(1.0)                               # mid-prefill: the emulated steps take seconds
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()
        while [p for p in pids if _alive(p)] and time.monotonic() - t0 < 15:
            time.sleep(0.1)
        left = [p for p in pids if _alive(p)]
        print(f"{engine}: workers gone {time.monotonic() - t0:.2f}s after the engine was killed")
        assert not left, f"workers {left} outlived their engine by 15 s (comm timeout 60 s)"
    finally:
        proc.kill()
        for p in pids if "pids" in dir() else []:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_a_broken_shard_fails_the_constructor_with_one_line(tmp_path, tiny_dirs):
    broken = tmp_path / "model"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], broken)
    shard = next(broken.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])          # truncated
    with pytest.raises(ModelLoadError) as info:
        asap.LLM(str(broken), engine="async", attention_workers=1, expert_workers=1)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert "safetensors" in message, message


def test_asap_serve_on_a_broken_shard_exits_2_with_one_line(tmp_path, tiny_dirs):
    broken = tmp_path / "model"
    shutil.copytree(tiny_dirs["tiny-deepseek-v3"], broken)
    shard = next(broken.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    proc = subprocess.run([sys.executable, "-m", "asap.cli", "serve", str(broken), "--engine", "async",
                           "--attention-workers", "1", "--expert-workers", "1", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    # Known, not fixed: once in three fresh-clone runs, Python's multiprocessing resource_tracker (a helper
    # process) printed a leaked-semaphore warning after asap's line at interpreter exit. Those lines are not
    # asap's and are left out here; every other line counts.
    lines = [ln for ln in proc.stderr.strip().splitlines()
             if "resource_tracker" not in ln and not ln.strip().startswith("warnings.warn(") and ln.strip()]
    assert len(lines) == 1 and "safetensors" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
