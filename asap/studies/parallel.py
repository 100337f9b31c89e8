"""Run independent simulations side by side: tuning candidates, both engines' searches of a headline row.

    with make_executor("process", jobs=4) as ex:          # or "serial", or "ray"
        results = ex.map(simulate_one, tasks)             # in the order of `tasks`, whatever order they finish in

Three executors, one contract (`Executor.map`): `fn` must be a module-level function and every task plain
picklable data. A simulation is deterministic and shares no state with another, so the results are the very
objects a serial loop would return (tests/test_sim_parallel.py checks a whole tune serial vs parallel):
- serial:  a plain loop in this process;
- process: a local pool of `jobs` worker processes (default: the cores this process may use), started once and reused
           (spawned, not forked: a forked child of a process that loaded torch may deadlock; so a script that
           makes one needs Python's `if __name__ == "__main__":` guard, as `asap` and `python -m` have);
           a worker exits within a second of its parent's death (`_exit_with_parent`), so a run stopped by a
           signal leaves no simulation running;
- ray:     tasks on a Ray cluster (`pip install 'asap-prefill[ray]'`): the one at RAY_ADDRESS if set, else a
           local one with `jobs` CPUs. For users who outgrow one machine.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Iterable, Protocol

EXECUTORS = ("serial", "process", "ray")


class Executor(Protocol):
    jobs: int

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any]) -> list:
        """[fn(t) for t in tasks], in order."""
        ...

    def close(self) -> None: ...


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        pass


class Serial(_Closing):
    jobs = 1

    def map(self, fn, tasks) -> list:
        return [fn(t) for t in tasks]


class ProcessPool(_Closing):
    def __init__(self, jobs: int):
        self.jobs = jobs
        self._pool = None

    def map(self, fn, tasks) -> list:
        tasks = list(tasks)
        if len(tasks) <= 1:             # no worker round trip for a lone task: it runs the same here
            return [fn(t) for t in tasks]
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_exit_with_parent, initargs=(os.getpid(),))
        return list(self._pool.map(fn, tasks))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """A pool worker's initializer: a daemon thread ends the worker once `parent` is gone (the worker is
    re-parented). A pool's own shutdown never comes when its parent is killed by a signal, and a worker in
    the middle of a simulation would otherwise run it to the end, and the next."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class RayExecutor(_Closing):
    def __init__(self, jobs: int | None):
        try:
            import ray
        except ImportError:
            raise ValueError("--executor ray needs Ray: pip install 'asap-prefill[ray]'") from None
        self._ray, self._started = ray, False
        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS"):
                ray.init(address=os.environ["RAY_ADDRESS"])
            else:
                ray.init(num_cpus=jobs, include_dashboard=False)
            self._started = True
        self.jobs = int(ray.cluster_resources().get("CPU", 1))
        self._remote: dict = {}

    def map(self, fn, tasks) -> list:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(fn)
        return self._ray.get([remote.remote(t) for t in tasks])

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_executor(kind: str = "process", jobs: int | None = None) -> Executor:
    """kind: serial | process | ray; jobs: worker processes (process: default the machine's cores; 1 = serial)."""
    if kind not in EXECUTORS:
        raise ValueError(f"unknown executor {kind!r}; choose one of {', '.join(EXECUTORS)}")
    if jobs is not None and not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    if kind == "ray":
        return RayExecutor(jobs)
    jobs = jobs or cores()
    return Serial() if kind == "serial" or jobs == 1 else ProcessPool(jobs)


def cores() -> int:
    """The cores this process may run on (its affinity, where the OS says; else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def add_arguments(parser) -> None:
    """--jobs and --executor, for every command that runs a search."""
    parser.add_argument("--jobs", type=int, default=None,
                        help="simulations run side by side (default: the cores this process may use; 1 = one "
                             "after another); results are the same for any value")
    parser.add_argument("--executor", default="process", choices=EXECUTORS,
                        help="where they run: serial, a local process pool (default), or a Ray cluster "
                             "(RAY_ADDRESS, else a local one; needs the 'ray' extra)")


def from_args(a) -> Executor:
    return make_executor(a.executor, a.jobs)


class Progress:
    """One line to stderr per simulation a search runs: what, at which rate, its outcome, elapsed wall time.
    Picklable (a start time and a label), so workers in other processes print on the same clock."""

    def __init__(self, label: str, start: float | None = None):
        self.label, self.start = label, time.time() if start is None else start

    def __call__(self, what: str) -> None:
        print(f"[SIMULATED] {self.label}: {what} ({time.time() - self.start:.0f} s)", file=sys.stderr, flush=True)
