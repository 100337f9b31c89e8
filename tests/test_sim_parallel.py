"""Searches run side by side return exactly what a serial run returns: the same best, rates, table and
simulation count, on a local process pool and on a local Ray."""
import dataclasses
import importlib.util

import pytest

from asap.scheduler.request import Request
from asap.studies.parallel import ProcessPool, Progress, Serial, make_executor
from asap.studies.tune import tune
from asap.workload.slo import SLO

SMALL = dict(model="small-deepseek-v3", hardware="h800")
REQS = SLO(0.005, 1e-6).apply([Request(i, 1000 + 500 * (i % 7), 0.01 * i) for i in range(120)])


def tuned(engine: str, executor) -> dict:
    t = tune(REQS, engine, 4, **SMALL, executor=executor)
    assert t.best is not None and t.num_screened > 3     # the screen ran: there was something to parallelise
    return dataclasses.asdict(t)


@pytest.fixture(scope="module")
def serial():
    return {engine: tuned(engine, Serial()) for engine in ("sync", "async")}


@pytest.mark.timeout(600)
def test_a_process_pool_tunes_exactly_as_a_serial_run(serial):
    with make_executor("process", jobs=2) as ex:
        assert isinstance(ex, ProcessPool)
        for engine in ("sync", "async"):
            assert tuned(engine, ex) == serial[engine]


@pytest.mark.timeout(600)
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (the 'ray' extra)")
def test_a_local_ray_tunes_exactly_as_a_serial_run(serial, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with make_executor("ray", jobs=2) as ex:
        assert ex.jobs == 2
        assert tuned("async", ex) == serial["async"]


def test_progress_lines_name_the_candidate_and_rate(capsys):
    tune(REQS[:40], "sync", 4, **SMALL, progress=Progress("tune"), screen=False,
         candidates=[tune.__globals__["EngineConfig"]("sync", 1, 4096)])
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("[SIMULATED] tune: sync 1x[DP4 x TP1") and " req/s, 40 requests -> " in line
                       and line.endswith(" s)") for line in err)


def test_bad_executor_settings_are_refused():
    with pytest.raises(ValueError, match="serial, process, ray"):
        make_executor("threads")
    with pytest.raises(ValueError, match="jobs"):
        make_executor("process", jobs=0)
    assert isinstance(make_executor("process", jobs=1), Serial)


_ORPHAN_SCRIPT = """
import os, sys, time
from asap.studies.parallel import ProcessPool

def work(path):
    with open(path + "." + str(os.getpid()), "w"):
        pass
    time.sleep(120)

if __name__ == "__main__":
    with ProcessPool(2) as pool:
        pool.map(work, [sys.argv[1]] * 2)
"""


@pytest.mark.timeout(120)
def test_pool_workers_exit_when_their_parent_is_killed(tmp_path):
    """`asap sim headline --jobs N` stopped by a signal: its workers stop too, mid-simulation."""
    import os
    import signal
    import subprocess
    import sys
    import time
    script = tmp_path / "orphans.py"
    script.write_text(_ORPHAN_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path / "pid")])
    try:
        deadline = time.time() + 60
        while len(list(tmp_path.glob("pid.*"))) < 2 and time.time() < deadline:
            time.sleep(0.2)
        pids = [int(p.suffix[1:]) for p in tmp_path.glob("pid.*")]
        assert len(pids) == 2, "the workers did not start"
    finally:
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=30)

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    deadline = time.time() + 15
    while any(map(alive, pids)) and time.time() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for p in left:                      # never leave one behind, even when the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"
