"""Device memory in the simulator: weight bytes per device, the check that a layout fits, the fewest expert
workers that hold the experts, and the prefix-cache capacity the memory left over gives a replica."""
from __future__ import annotations

import math

from asap.config import ModelConfig
from asap.cost.hardware import Hardware
from asap.cost.ops import ACT_BYTES
from asap.scheduler.prefix_cache import BLOCK_TOKENS

MEMORY_USABLE = 0.9     # fraction of device memory for weights; the rest for KV, activations, buffers
CACHE_RESERVE = 1 - MEMORY_USABLE   # fraction of device memory a prefix cache leaves for activations, buffers


def expert_bytes(model: ModelConfig, hw: Hardware) -> float:
    return sum(model.moe_layers) * model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size \
        * hw.weight_bytes


def attention_bytes(model: ModelConfig, hw: Hardware) -> float:
    p = model.num_params()
    return p["attention_side"] * hw.weight_bytes


def min_expert_workers(model: ModelConfig, hw: Hardware) -> int:
    return max(1, math.ceil(expert_bytes(model, hw) / (MEMORY_USABLE * hw.memory_bytes)))


def check_memory(engine: str, model: ModelConfig, hw: Hardware, devices: int, experts: int,
                 attention_tp: int = 1) -> None:
    """devices: the devices of one instance (sync) or of the system (async); attention weights are split
    over attention_tp devices."""
    usable = MEMORY_USABLE * hw.memory_bytes
    need_e, need_a = expert_bytes(model, hw), attention_bytes(model, hw) / attention_tp
    if engine == "sync":
        per_rank = need_a + need_e / devices
        if per_rank > usable:
            raise ValueError(f"sync on {devices} x {hw.name}: each rank needs {per_rank / 1e9:.1f} GB of weights "
                             f"(> {usable / 1e9:.1f} GB usable); use more devices")
    else:
        if need_a > usable or need_e / experts > usable:
            raise ValueError(f"async on {hw.name}: {experts} expert workers hold {need_e / experts / 1e9:.1f} GB "
                             f"each, attention {need_a / 1e9:.1f} GB (usable {usable / 1e9:.1f} GB); "
                             f"need >= {min_expert_workers(model, hw)} expert workers")


def prefix_cache_capacity(engine: str, model: ModelConfig, hw: Hardware, devices: int, attention_tp: int = 1) -> int:
    """Prefix-cache blocks (BLOCK_TOKENS tokens each) of one replica: a sync DP group or an async attention
    replica, each of attention_tp devices. `devices`: the devices of one sync instance (its EP width);
    unused for async, whose attention devices hold no experts.

        free per device = memory - weights per device - CACHE_RESERVE x memory
            weights per device: sync  attention / tp + experts / devices;  async  attention / tp
        blocks = floor(free per device x kv_split / (kv_bytes_per_token x BLOCK_TOKENS))
            kv_bytes_per_token = cached elements per token and layer x ACT_BYTES x layers
            kv_split: 1 for MLA (each TP device holds the whole latent), min(tp, KV heads) for GQA

    DeepSeek-V3 on cloudmatrix384 (64 GB per die, FP8 weights): 576 x 2 x 61 = 70,272 B per token, 36.0 MB
    per block; sync DP32 x TP1 leaves 64 - 6.4 - 17.1 - 20.4 = 20.0 GB -> 557 blocks (285K tokens) per DP
    rank. Redundant (EPLB) expert copies and the KV of requests in flight are not subtracted.
    """
    a = model.attention_cost()
    weights = attention_bytes(model, hw) / attention_tp
    if engine == "sync":
        weights += expert_bytes(model, hw) / devices
    free = hw.memory_bytes * (1 - CACHE_RESERVE) - weights
    kv_split = 1 if a.kv_layout == "mla" else min(attention_tp, a.kv_heads)
    per_token = a.kv_cache_elems * ACT_BYTES * model.num_layers
    return max(0, math.floor(free * kv_split / (per_token * BLOCK_TOKENS)))
