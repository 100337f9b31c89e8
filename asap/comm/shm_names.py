"""Names of the shared-memory transport's segments and semaphores, and the sweep of dead owners' leftovers.

A name carries the creating process's pid: asap<pid>_<token>_<src>_<dst> for a ring segment,
sem.asap<pid>_<token>_d<rank> / _s<rank> for its semaphores (in /dev/shm). A segment whose
creator is dead was leaked by a hard kill (no cleanup ran), so any later start may unlink it.

Better still, a name is unlinked as soon as every process that needs it has it open (the engine calls
ShmTransportSpec.unlink_names and unlink_semaphores once its workers report ready): the segment or
semaphore lives on while it is open and vanishes with its last user, so even a SIGKILL of the whole
process group leaves nothing in /dev/shm. That includes multiprocessing's own named semaphores
(sem.mp-*, behind its queues and events), which it otherwise unlinks only at a clean exit.
"""
from __future__ import annotations

import os
import re
import secrets
from multiprocessing import synchronize, util

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


def unlink_semaphores(*objs) -> list[str]:
    """Unlink the names of the multiprocessing semaphores inside `objs` (queues, events, locks, and dicts,
    lists or tuples of them); returns the names. Only once every process that will ever use them has
    opened them (unpickled them): a process started later could not open them by name any more."""
    names = []
    for lock in _semlocks(objs):
        name = lock._semlock.name
        if name is None:                # unlinked already (or a fork-started lock, which has no name)
            continue
        for finalizer in list(util._finalizer_registry.values()):    # its exit-time unlink: cancelled
            if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup and \
                    getattr(finalizer, "_args", None) == (name,):
                finalizer.cancel()
        try:
            synchronize.SemLock._cleanup(name)      # sem_unlink, and the resource tracker forgets it
        except OSError:
            pass
        names.append(name)
    return names


def _semlocks(objs, depth: int = 4, seen=None):
    """The SemLocks reachable from objs through attributes and containers, `depth` levels down."""
    seen = set() if seen is None else seen
    for obj in objs:
        if id(obj) in seen or depth < 0:
            continue
        seen.add(id(obj))
        if isinstance(obj, synchronize.SemLock):
            yield obj
        elif isinstance(obj, dict):
            yield from _semlocks(list(obj.values()), depth - 1, seen)
        elif isinstance(obj, (list, tuple)):
            yield from _semlocks(obj, depth - 1, seen)
        elif type(obj).__module__.startswith("multiprocessing"):    # Queue, Event, Condition, ...
            yield from _semlocks(list(getattr(obj, "__dict__", {}).values()), depth - 1, seen)
