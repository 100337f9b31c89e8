"""`asap serve MODEL`: the OpenAI-compatible prefill server (see asap/server/README.md).

SIGTERM or SIGINT: stop accepting connections, finish the requests in flight
(up to --shutdown-timeout-s), stop the workers, exit 0.
"""
from __future__ import annotations

import contextlib
import signal
import socket


def register(sub):
    from asap.cli import add_config_flags
    from asap.config import RuntimeConfig
    from asap.server.config import ServerConfig
    p = sub.add_parser("serve", help="serve prefill over HTTP (OpenAI /v1/completions, KV hand-off, /metrics)")
    p.add_argument("model", help="model directory (HF format) or preset name")
    add_config_flags(p, ServerConfig)
    add_config_flags(p, RuntimeConfig)
    p.set_defaults(func=run)


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


def run(args) -> int:
    import uvicorn

    import asap
    from asap.cli import config_from_args
    from asap.config import RuntimeConfig
    from asap.model.tokenizer import load_tokenizer
    from asap.server.app import create_app
    from asap.server.config import ServerConfig

    cfg, runtime = config_from_args(ServerConfig, args), config_from_args(RuntimeConfig, args)
    engine_kwargs = {} if cfg.engine == "reference" else {"runtime": runtime}
    llm = asap.LLM(args.model, engine=cfg.engine, dtype=cfg.dtype, device=cfg.device, **engine_kwargs)
    try:
        name = cfg.served_model_name or args.model
        app = create_app(llm, cfg, name, load_tokenizer(llm.model_dir))
        sock = _listen(cfg.host, cfg.port)
        host, port = sock.getsockname()[:2]
        server = uvicorn.Server(uvicorn.Config(app, log_level=cfg.log_level, access_log=cfg.access_log,
                                               timeout_graceful_shutdown=cfg.shutdown_timeout_s))
        print(f"asap serve: {name} on the {cfg.engine} engine, listening on http://{host}:{port}", flush=True)
        with _exit_zero_on_signal():
            server.run(sockets=[sock])
    finally:
        llm.close()
    print("asap serve: stopped", flush=True)
    return 0
