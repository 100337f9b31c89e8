"""The errors an engine's futures and methods raise, by what the caller can do about them.

EngineUnavailable: retriable. A worker died, missed its heartbeats (hung, stopped, deadlocked), or the
    engine is restarting or shutting down; the same request can succeed once the engine is back
    (the server answers 503 + Retry-After).
EngineClosed: the engine was closed; nothing will run on it again.
"""
from __future__ import annotations


class EngineUnavailable(RuntimeError):
    retriable = True
    retry_after_s = 1


EngineUnhealthy = EngineUnavailable        # its name before heartbeats; kept for callers that import it


class EngineClosed(RuntimeError):
    retriable = False

    def __init__(self, message: str = "engine is closed"):
        super().__init__(message)
