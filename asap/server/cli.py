"""`asap serve MODEL`: the OpenAI-compatible prefill server (endpoints: asap/server/README.md).

SIGTERM or SIGINT: stop accepting connections, finish the requests in flight
(up to --shutdown-timeout-s), stop the workers, exit 0.
"""
from __future__ import annotations


def register(sub):
    from asap.config import RuntimeConfig, add_config_flags
    from asap.server.config import ServerConfig
    p = sub.add_parser("serve", help="serve prefill over HTTP (OpenAI /v1/completions, KV hand-off, /metrics)",
                       description="The OpenAI-compatible prefill server (vLLM's dialect): each request is "
                                   "prefilled and gets at most one token; decode runs elsewhere from the KV "
                                   "cache it hands off. Endpoints and parameters: asap/server/README.md. Starts "
                                   "in seconds for tiny-* presets (the workers load the weights); runs until "
                                   "SIGTERM or SIGINT, which finish the requests in flight.")
    p.add_argument("model", help="model directory (HF format) or preset name")
    add_config_flags(p, ServerConfig)
    add_config_flags(p, RuntimeConfig)
    from asap.server.connections import ConnectionConfig
    add_config_flags(p, ConnectionConfig)
    p.set_defaults(func=run)


def run(args) -> int:
    from asap.config import RuntimeConfig, config_from_args
    from asap.server.config import ServerConfig
    from asap.server.connections import ConnectionConfig
    from asap.server.serve import serve
    return serve(args.model, config_from_args(ServerConfig, args), config_from_args(RuntimeConfig, args),
                 config_from_args(ConnectionConfig, args))
