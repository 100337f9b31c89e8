"""`asap serve` settings: one frozen dataclass, whose field help is also the CLI help."""
from __future__ import annotations

from dataclasses import dataclass

from asap.config import _f

ENGINES = ("async", "sync", "reference")


@dataclass(frozen=True)
class ServerConfig:
    engine: str = _f("async", "engine behind the server: async, sync or reference")
    dtype: str = _f("auto", "model dtype: auto (the checkpoint's torch_dtype; float32 when it names none), "
                            "float32, bfloat16 or float16")
    device: str = _f("cpu", "torch device of the workers")
    host: str = _f("127.0.0.1", "address to listen on")
    port: int = _f(8000, "port to listen on (0 = any free port; the chosen one is printed)")
    served_model_name: str = _f("", "model name in the API (default: the model argument)")
    max_pending: int = _f(256, "requests admitted at once (waiting + running); beyond it: 503 + Retry-After")
    request_timeout_s: float = _f(300.0, "an admitted request that takes longer gets 504")
    kv_ttl_s: float = _f(60.0, "a KV cache kept for a remote decode (kv_transfer_params) is dropped this long "
                               "after its prefill if nobody pulls it")
    kv_max_mb: float = _f(1024.0, "memory for unclaimed KV caches; past it the oldest are evicted")
    max_body_kb: int = _f(1024, "largest accepted request body (413 beyond)")
    max_response_mb: float = _f(32.0, "largest response body: a request whose answer would be bigger (n x "
                                      "logprobs x echo x prompts) gets 400 naming this limit, before any work")
    public_url: str = _f("", "the server's URL as decode instances reach it, used in kv_transfer_params.kv_url "
                             "(default: the address it listens on; never taken from a request's Host header)")
    kv_write_timeout_s: float = _f(30.0, "a client pulling a KV cache must take each 1 MiB of it within this "
                                         "long, or the connection is closed and the cache freed")
    enable_docs: bool = _f(False, "serve the interactive API docs (/docs, /redoc) and /openapi.json")
    auto_restart: bool = _f(True, "restart the workers when one dies")
    shutdown_timeout_s: float = _f(30.0, "on SIGTERM/SIGINT, wait this long for requests in flight")
    metrics_window_s: float = _f(10.0, "per-worker busy/stall gauges cover the last this-many seconds")
    api_key: str = _f("", "require `Authorization: Bearer KEY` on every endpoint but /health (env: ASAP_API_KEY)")
    parse_threads: int = _f(2, "threads that parse JSON, tokenise, sample and encode KV off the event loop")
    access_log: bool = _f(False, "log every HTTP request")
    log_level: str = _f("info", "uvicorn log level")

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        for name in ("max_pending", "max_body_kb", "parse_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_timeout_s", "kv_ttl_s", "shutdown_timeout_s", "metrics_window_s", "max_response_mb",
                     "kv_write_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.kv_max_mb < 0:
            raise ValueError(f"kv_max_mb must be >= 0, got {self.kv_max_mb}")
        if self.public_url and not (self.public_url.startswith(("http://", "https://"))
                                    and self.public_url.split("://", 1)[1].strip("/")):
            raise ValueError(f"public_url must be an http(s) URL such as http://10.0.0.5:8000, got {self.public_url!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
