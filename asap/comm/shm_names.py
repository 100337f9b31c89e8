"""Names of the shared-memory transport's segments and semaphores, and the sweep of dead owners' leftovers.

A name carries the creating process's pid: asap<pid>_<token>_<src>_<dst> for a ring segment,
sem.asap<pid>_<token>_d<rank> / _s<rank> for its semaphores (in /dev/shm). A segment whose
creator is dead was leaked by a hard kill (no cleanup ran), so any later start may unlink it.
"""
from __future__ import annotations

import os
import re
import secrets

_SHM_DIR = "/dev/shm"
_NAME = re.compile(r"(?:sem\.)?asap(\d+)_[0-9a-f]{8}_(?:\d+_\d+|[ds]\d+)")


def new_prefix() -> str:
    """A fresh name prefix owned by this process."""
    return f"asap{os.getpid()}_{secrets.token_hex(4)}"


def sweep_dead_segments(shm_dir: str = _SHM_DIR) -> list[str]:
    """Unlink the ring segments and semaphores whose creating process is gone; returns their names."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    gone = []
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            gone.append(name)
        except OSError:
            pass
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # someone else's process: alive
        pass
    return True
