"""Promise (issue 27 point 7): once every party has them open, the shm rings, their semaphores and
multiprocessing's own named semaphores (sem.mp-*) have no name left in /dev/shm, so a SIGKILL of the
whole process group of `asap serve` leaves nothing there, even before any later start sweeps."""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from asap.comm import Header, Kind, ShmTransportSpec
from asap.comm.shm_names import unlink_semaphores

pytestmark = pytest.mark.timeout(180)


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def test_rings_and_semaphores_keep_working_after_their_names_are_unlinked():
    spec = ShmTransportSpec(2, ring_bytes=1 << 16)
    a, b = spec.connect(0), spec.connect(1)
    try:
        ours = {n for n in _shm_names() if spec.prefix in n}
        assert len(ours) == 2 + 4                           # two rings, two semaphores per rank
        spec.unlink_names()
        assert not {n for n in _shm_names() if spec.prefix in n}
        header = Header(kind=Kind.CONTROL, replica=0, layer=3, microbatch=0, seq=1, num_tokens=4)
        a.send(1, header, [torch.arange(4.0)])
        msg = b.recv(timeout=5)
        assert msg is not None and msg.header.layer == 3 and torch.equal(msg.tensors[0], torch.arange(4.0))
    finally:
        a.close(), b.close()
        spec.cleanup()                                       # unlinking twice is harmless


def _echo(q_in, q_out, ready):
    ready.set()
    q_out.put(q_in.get(timeout=30) * 2)


def test_multiprocessing_semaphores_are_unlinked_once_a_child_has_them_open():
    ctx = mp.get_context("spawn")
    q_in, q_out, ready = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_echo, args=(q_in, q_out, ready))
    child.start()
    try:
        assert ready.wait(60)                                # the child has unpickled (opened) them all
        names = unlink_semaphores(q_in, q_out, ready)
        assert len(names) >= 2 * 3 + 1 and not [n for n in names if "sem." + n.lstrip("/") in _shm_names()]
        q_in.put(21)                                         # and they still work, across processes
        assert q_out.get(timeout=30) == 42
    finally:
        child.join(30)
    assert child.exitcode == 0


def _group_maps(pgid: int) -> set[str]:
    """The /dev/shm names that the processes of a process group have mapped and that still have a name."""
    names = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/maps") as f:
                names |= {m.group(1) for m in re.finditer(r"/dev/shm/(\S+)$", f.read(), re.M)}
        except (OSError, ProcessLookupError):
            pass
    return {n for n in names if os.path.exists(f"/dev/shm/{n}")}


def test_a_sigkill_of_the_servers_whole_process_group_leaves_nothing_in_dev_shm(tmp_path):
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "asap.cli", "serve", "tiny-deepseek-v3", "--engine", "async",
           "--attention-workers", "1", "--expert-workers", "1", "--host", "127.0.0.1", "--port", "0"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 150
        while not (m := re.search(r"listening on (http://\S+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.2)
        r = httpx.post(m.group(1) + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 1}, timeout=60)
        assert r.status_code == 200, r.text                  # the unlinked rings and queues carry requests
        mapped = [n for n in os.listdir("/dev/shm") if n.startswith(f"asap{proc.pid}_")]
        named = _group_maps(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)                 # no clean-up runs anywhere in the group
        proc.wait(30)
    assert mapped == [] and named == set(), f"still named in /dev/shm while serving: {mapped} {named}"
