"""Run `asap serve` as a child process: for tests and for benchmarking the server end to end.

    with ServerProcess(["tiny-deepseek-v3", "--engine", "async"], log_path) as srv:
        httpx.get(srv.url + "/health")
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

_LISTENING = re.compile(r"listening on (http://\S+)")


def descendants(pid: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        st = _stat(int(entry)) if entry.isdigit() else None
        if st is not None:
            children.setdefault(st[1], []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            st = _stat(child)
            if st is not None:
                out.add((child, st[2]))
                todo.append(child)
    return out


def alive(proc: tuple[int, int]) -> bool:
    """Is this (pid, start time) still running (not gone, not a zombie, not a reused pid)?"""
    st = _stat(proc[0])
    return st is not None and st[0] != "Z" and st[2] == proc[1]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()      # the command name may contain spaces and ')'
    return fields[0], int(fields[1]), int(fields[19])


class ServerProcess:
    def __init__(self, args: list[str], log_path: str | Path, env: dict | None = None, start_timeout_s: float = 120):
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "asap.cli", "serve", *args, "--host", "127.0.0.1", "--port", "0"]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid
        self.url = self._wait_listening(start_timeout_s)

    def _wait_listening(self, timeout_s: float) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            match = _LISTENING.search(self.log())
            if match:
                return match.group(1)
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.log()}")
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server not listening after {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, then SIGKILL to the server and everything below it if it does not exit in time."""
        below = descendants(self.pid)
        self.signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            for proc in below:
                if alive(proc):
                    os.kill(proc[0], signal.SIGKILL)
            code = self.proc.wait()
        self._log.close()
        return code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
