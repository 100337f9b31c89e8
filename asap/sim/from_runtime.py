"""One map from a RuntimeConfig to the simulator's arguments, so a simulated target is the engine it names.

Every RuntimeConfig field is in exactly one of three groups:
  HONOURED   mapped to a simulator argument below (layout, scheduling, selection, placement, hardware);
  MECHANICS  how the real runtime runs (transport, processes, timeouts, emulation): the simulator
             models the hardware profile's link and compute instead, by design;
  anything else must be at its default: `engine_spec` raises a ValueError naming the field, never
             drops it silently. A new RuntimeConfig field lands here until someone classifies it.
"""
from __future__ import annotations

import dataclasses

from asap.config import RuntimeConfig
from asap.pipeline.depth import MAX_ADAPTIVE_K, expert_batch_cap
from asap.sim.spec import EngineSpec

HONOURED = frozenset({
    "attention_workers", "expert_workers", "devices", "attention_tp", "token_budget", "microbatches", "adaptive_depth", "router",
    "order", "selector", "expert_max_wait_ms", "aggregation_window_ms", "redundant_experts", "max_queue", "hardware", "colocated",
    "wide_replicas", "wide_tp", "wide_from_tokens", "wide_token_budget", "expert_batch_tokens", "short_replicas",
    "short_below_tokens"})
MECHANICS = frozenset({
    "transport", "compute", "emulated_hidden", "dilation", "ring_mb", "comm_timeout_s", "threads_per_worker",
    "master_port", "master_addr", "remote_experts", "heartbeat_interval_s", "heartbeat_timeout_s",
    "stop_grace_s"})
# Honoured only at their default: the simulator has no model of them (yet).
_UNSUPPORTED = {"admission": "the simulator has no SLO admission; use admission='off'",
                "admission_slack": "only used by admission, which the simulator does not model"}


def engine_spec(runtime: RuntimeConfig, engine: str, model="deepseek-v3", devices: int | None = None) -> EngineSpec:
    """The simulated engine (asap.sim.spec.EngineSpec, for asap.sim.run.run / simulate) that reproduces
    `runtime`'s layout and policies for `model` (a preset name, HF config dict or ModelConfig).

    engine "async": runtime.attention_workers replicas + runtime.expert_workers expert workers.
    engine "sync":  `devices` ranks (default runtime.devices), two-batch overlap iff microbatches > 1.
    """
    if engine not in ("async", "sync"):
        raise ValueError(f"engine must be 'async' or 'sync', got {engine!r}")
    defaults = RuntimeConfig()
    for f in dataclasses.fields(RuntimeConfig):
        name, value = f.name, getattr(runtime, f.name)
        if name in HONOURED or name in MECHANICS or value == getattr(defaults, name):
            continue
        why = _UNSUPPORTED.get(name, "it has no simulator counterpart (classify it in asap/sim/from_runtime.py)")
        raise ValueError(f"RuntimeConfig.{name}={value!r} cannot be simulated: {why}")
    common = dict(model=model, hardware=runtime.hardware, token_budget=runtime.token_budget, router=runtime.router,
                  order=runtime.order, max_queue=runtime.max_queue, redundant_experts=runtime.redundant_experts,
                  attention_tp=runtime.attention_tp)
    if engine == "sync":
        return EngineSpec(engine="sync", devices=devices or runtime.devices,
                          two_batch_overlap=runtime.microbatches > 1, **common)
    if runtime.adaptive_depth and runtime.microbatches > MAX_ADAPTIVE_K:
        raise ValueError(f"RuntimeConfig.microbatches={runtime.microbatches} with adaptive_depth cannot be "
                         f"simulated: the simulator's adaptive depth tops out at {MAX_ADAPTIVE_K}")
    fleet = dict(wide_replicas=runtime.wide_replicas, wide_tp=runtime.wide_tp,
                 wide_from_tokens=runtime.wide_from_tokens, wide_token_budget=runtime.wide_token_budget or None) \
        if runtime.wide_replicas else {}
    lane = dict(short_replicas=runtime.short_replicas, short_below_tokens=runtime.short_below_tokens) \
        if runtime.short_replicas else {}
    return EngineSpec(engine="async",
                      devices=sum(runtime.replica_tps) + (0 if runtime.colocated else runtime.expert_workers),
                      colocated=runtime.colocated, **fleet, **lane,
                      attention_workers=None if fleet else runtime.attention_workers, selector=runtime.selector,
                      microbatches="adaptive" if runtime.adaptive_depth else runtime.microbatches,
                      window_s=runtime.aggregation_window_ms / 1000,
                      max_wait_s=runtime.expert_max_wait_s,
                      max_batch_tokens=expert_batch_cap(runtime.token_budget, runtime.expert_batch_tokens), **common)
