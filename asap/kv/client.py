"""asap.kv.pull: fetch one prefilled KV cache over HTTP (GET kv_url, served once) -> tensors.

The wire format is one safetensors file (asap/server/kv_store.py): `layers.{i}.{name}` with the
per-layer names of PrefillOutput.kv, and string metadata (layout mla|gqa, num_layers, num_tokens, ...).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

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


def _url(params: dict, base_url: str | None) -> str:
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be the dict from the prefill response")
    if base_url and params.get("remote_request_id"):
        return f"{base_url.rstrip('/')}/v1/kv/{params['remote_request_id']}"
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
    base_url overrides the host the server saw itself as; api_key defaults to $ASAP_API_KEY."""
    api_key = api_key if api_key is not None else os.environ.get("ASAP_API_KEY")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.stream("GET", _url(params, base_url), headers=headers, timeout=timeout) as r:
        data = r.read()
        if r.status_code != 200:
            raise RuntimeError(f"KV pull failed: HTTP {r.status_code}: {data[:300].decode(errors='replace')}")
    return decode(data)
