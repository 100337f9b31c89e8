"""Bounded admission: at most `capacity` requests inside the engine at once.

A request holds its slot from admission until its engine future resolves, so
a request the HTTP side gave up on (504) still counts until the engine is done
with it, and the bound on engine work holds. Thread-safe: slots are released
from the engine's collector thread.
"""
from __future__ import annotations

import threading


class Admission:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.num_pending = 0
        self.num_admitted = 0
        self._lock = threading.Lock()

    def try_admit(self) -> bool:
        with self._lock:
            if self.num_pending >= self.capacity:
                return False
            self.num_pending += 1
            self.num_admitted += 1
            return True

    def release(self, *_) -> None:
        """Free one slot (usable as a Future done-callback)."""
        with self._lock:
            if self.num_pending <= 0:
                raise RuntimeError("release without a matching admit")
            self.num_pending -= 1
