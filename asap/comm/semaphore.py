"""Named POSIX semaphores (sem_open), for the shm transport's wake-ups.

Unlike multiprocessing's semaphores they carry a name we choose, so the
creator's pid is in it (/dev/shm/sem.asap<pid>_...) and a start-up sweep can
remove the ones a SIGKILLed process group left behind; they pickle by name at
any time, not only while spawning; and no resource-tracker process is involved.
Waits go through ctypes, which releases the GIL, so other threads keep running.
"""
from __future__ import annotations

import ctypes
import errno
import os
import time

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sem_open.restype = ctypes.c_void_p
_libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
for _f in ("sem_post", "sem_wait", "sem_trywait", "sem_close"):
    getattr(_libc, _f).argtypes = [ctypes.c_void_p]
_libc.sem_clockwait.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_libc.sem_unlink.argtypes = [ctypes.c_char_p]
_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _fail(what: str, name: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what} {name}: {os.strerror(e)}")


class NamedSemaphore:
    """acquire(block, timeout) / release() like multiprocessing.Semaphore. Create once (create=True);
    every process that unpickles it opens the same semaphore; the creator unlinks it."""

    def __init__(self, name: str, create: bool = False):
        self.name = name
        flags = (os.O_CREAT | os.O_EXCL) if create else 0
        self._sem = _libc.sem_open(name.encode(), flags, 0o600, 0)
        if not self._sem:                      # SEM_FAILED is NULL in glibc
            raise _fail("sem_open", name)

    def __getstate__(self):
        return {"name": self.name}

    def __setstate__(self, state):
        self.__init__(state["name"])

    def release(self) -> None:
        if not self._sem:
            raise ValueError(f"semaphore {self.name} is closed")
        if _libc.sem_post(self._sem):
            raise _fail("sem_post", self.name)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if not self._sem:
            raise ValueError(f"semaphore {self.name} is closed")
        if not block or (timeout is not None and timeout <= 0):
            if _libc.sem_trywait(self._sem) == 0:
                return True
            if ctypes.get_errno() in (errno.EAGAIN, errno.EINTR):
                return False
            raise _fail("sem_trywait", self.name)
        if timeout is None:
            while _libc.sem_wait(self._sem):
                if ctypes.get_errno() != errno.EINTR:
                    raise _fail("sem_wait", self.name)
            return True
        end = time.clock_gettime(time.CLOCK_MONOTONIC) + timeout
        ts = _Timespec(int(end), int((end % 1) * 1e9))
        while _libc.sem_clockwait(self._sem, _CLOCK_MONOTONIC, ctypes.byref(ts)):
            e = ctypes.get_errno()
            if e == errno.ETIMEDOUT:
                return False
            if e != errno.EINTR:                # EINTR (a signal): wait on, to the same deadline
                raise _fail("sem_clockwait", self.name)
        return True

    def close(self) -> None:
        if self._sem:
            _libc.sem_close(self._sem)
            self._sem = None

    @staticmethod
    def unlink(name: str) -> None:
        _libc.sem_unlink(name.encode())       # already gone is fine
