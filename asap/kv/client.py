"""asap.kv.pull: fetch one prefilled KV cache over HTTP (GET kv_url, served once) -> tensors.

The wire format is one safetensors file (asap/server/kv_store.py): `layers.{i}.{name}` with the
per-layer names of PrefillOutput.kv, and string metadata (layout mla|gqa, num_layers, num_tokens, ...).

The API key goes only to the server the caller names (base_url), never to a host that a response's
kv_transfer_params name: whoever can shape a response (or a forged Host header upstream) would
otherwise receive the key. Redirects are not followed.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import torch
from safetensors.torch import load


@dataclass
class PulledKV:
    layers: list[dict[str, torch.Tensor]]     # per layer: MLA kv_latent, k_rope [T, .]; GQA k, v [T, H, d]
    metadata: dict[str, str]

    @property
    def layout(self) -> str:
        return self.metadata.get("layout", "")

    @property
    def num_tokens(self) -> int:
        return int(self.metadata.get("num_tokens", 0))


_HANDLE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urlsplit(url)
    return u.scheme.lower(), (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(u.scheme.lower())


def _url(params: dict, base_url: str | None) -> str:
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be the dict from the prefill response")
    handle = params.get("remote_request_id")
    if handle is not None and not (isinstance(handle, str) and _HANDLE.fullmatch(handle)):
        raise ValueError("kv_transfer_params.remote_request_id is not a KV handle")
    if base_url and handle:
        return f"{base_url.rstrip('/')}/v1/kv/{handle}"
    if params.get("kv_url"):
        return params["kv_url"]
    host, port, handle = params.get("remote_host"), params.get("remote_port"), params.get("remote_request_id")
    if not (host and port and handle):
        raise ValueError("kv_transfer_params has neither kv_url nor remote_host/remote_port/remote_request_id")
    return f"http://{host}:{port}/v1/kv/{handle}"


def decode(data: bytes) -> PulledKV:
    """safetensors bytes -> PulledKV."""
    import json
    import struct
    header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    tensors = load(data)
    num_layers = int(header.get("__metadata__", {}).get("num_layers", 0)) or \
        1 + max(int(name.split(".")[1]) for name in tensors)
    layers = [{} for _ in range(num_layers)]
    for name, t in tensors.items():
        _, i, key = name.split(".", 2)
        layers[int(i)][key] = t
    return PulledKV(layers, header.get("__metadata__", {}))


def pull(params: dict, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0) -> PulledKV:
    """Fetch the cache that a prefill response's kv_transfer_params point at (once: the server then frees it).
    base_url: the prefill server you trust (e.g. the one you sent the request to); the cache is then fetched
    from it, and only then is the API key (api_key, default $ASAP_API_KEY) sent. Without base_url the URL
    in params is fetched without the key; a key given explicitly without base_url is refused."""
    url = _url(params, base_url)
    if api_key is not None and api_key and not base_url:
        raise ValueError("asap.kv.pull sends the API key only to the server you name: pass base_url= "
                         f"(the prefill server), not just the kv_transfer_params (which name {_origin(url)[1]!r})")
    api_key = api_key if api_key is not None else os.environ.get("ASAP_API_KEY")
    send_key = bool(api_key and base_url and _origin(url) == _origin(base_url))
    headers = {"Authorization": f"Bearer {api_key}"} if send_key else {}
    with httpx.stream("GET", url, headers=headers, timeout=timeout, follow_redirects=False) as r:
        data = r.read()
        if r.status_code != 200:
            hint = "; to send the API key, pass base_url= (the prefill server)" if r.status_code == 401 and \
                not send_key else ""
            raise RuntimeError(f"KV pull failed: HTTP {r.status_code}: {data[:300].decode(errors='replace')}{hint}")
    return decode(data)
