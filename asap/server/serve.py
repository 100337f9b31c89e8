"""The server process: load the model, listen, serve until SIGTERM/SIGINT, stop everything, exit 0.

Shutdown order: stop accepting connections -> finish the requests in flight
(up to shutdown_timeout_s; the rest answer 503 JSON) -> stop the supervisor -> stop the workers
(attention, then experts: about a second). Connection limits (slow or idle clients): connections.py.
"""
from __future__ import annotations

import contextlib
import signal
import socket

import uvicorn

import asap
from asap.config import RuntimeConfig
from asap.model.tokenizer import load_tokenizer
from asap.server.app import create_app
from asap.server.config import ServerConfig
from asap.server.connections import ConnectionConfig, ShutdownGuard, guarded_protocol


class _Server(uvicorn.Server):
    """Tells the supervisor the moment shutdown starts, so it does not restart workers that a
    process-group-wide signal (Ctrl-C, `kill -- -PGID`) may be killing at the same time."""

    def __init__(self, supervisor, config: uvicorn.Config):
        super().__init__(config)
        self.supervisor = supervisor

    def handle_exit(self, sig, frame):
        self.supervisor.draining = True
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def _exit_zero_on_signal():
    """uvicorn re-raises the signal that stopped it once it has shut down gracefully; with the default
    handlers that would kill us before the workers are stopped, and exit non-zero. Catch it instead."""
    saved = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def serve(model: str, cfg: ServerConfig, runtime: RuntimeConfig, limits: ConnectionConfig | None = None) -> int:
    limits = limits or ConnectionConfig()
    engine_kwargs = {} if cfg.engine == "reference" else {"runtime": runtime}
    llm = asap.LLM(model, engine=cfg.engine, dtype=cfg.dtype, device=cfg.device, **engine_kwargs)
    try:
        name = cfg.served_model_name or model
        sock = _listen(cfg.host, cfg.port)
        host, port = sock.getsockname()[:2]
        bound = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        app = create_app(llm, cfg, name, load_tokenizer(llm.model_dir), public_url=cfg.public_url or bound)
        config = uvicorn.Config(ShutdownGuard(app), log_level=cfg.log_level, access_log=cfg.access_log,
                                timeout_graceful_shutdown=cfg.shutdown_timeout_s,
                                timeout_keep_alive=limits.keep_alive_s, http=guarded_protocol(limits))
        print(f"asap serve: {name} on the {cfg.engine} engine, listening on {bound}", flush=True)
        with _exit_zero_on_signal():
            _Server(app.state.service.supervisor, config).run(sockets=[sock])
    finally:
        llm.close()
    print("asap serve: stopped", flush=True)
    return 0
