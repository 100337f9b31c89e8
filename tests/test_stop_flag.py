"""Promise: the launcher's stop signal never blocks it, even when a worker is SIGKILLed while polling it (a
multiprocessing.Event takes a lock in is_set(); a reader killed inside it left the launcher's set() hung)."""
import multiprocessing as mp
import os
import signal
import threading
import time

from asap.workers.launcher import StopFlag


def _poll(flag):
    while not flag.is_set():
        pass


def _set_returns_after_killed_readers(flag, ctx, kills: int = 20) -> bool:
    for _ in range(kills):
        p = ctx.Process(target=_poll, args=(flag,), daemon=True)
        p.start()
        time.sleep(0.01)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    done = threading.Event()
    threading.Thread(target=lambda: (flag.set(), done.set()), daemon=True).start()
    return done.wait(5.0)


def test_set_returns_after_readers_are_killed_mid_poll():
    ctx = mp.get_context("fork")
    flag = StopFlag(ctx)
    assert not flag.is_set()
    assert _set_returns_after_killed_readers(flag, ctx)
    assert flag.is_set()
