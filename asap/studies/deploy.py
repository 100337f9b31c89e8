"""A tuned configuration (asap.studies.config.EngineConfig) as what runs it: the runtime's RuntimeConfig of each
deployment, and the `asap serve` command line a user types for it.

One instance of a configuration is one deployment, or two for a sync fleet (a narrow DP deployment and a wide
one for the long prompts, as `asap.sim.run.split_by_length` simulates them). Instances and the sync fleet's
split by length sit in front of the deployments (a load balancer / a length-aware proxy), which ASAP does not
ship: `deployments` says what each one serves.
"""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from asap.config import RuntimeConfig
from asap.pipeline.depth import expert_batch_cap
from asap.sim.spec import EngineSpec


@dataclass(frozen=True)
class Deployment:
    engine: str                 # "sync" | "async"
    devices: int
    serves: str                 # which prompts it takes, in words
    runtime: RuntimeConfig


def expert_workers(c, devices: int) -> int:
    """The expert side's processes for `c` on `devices` devices (one instance): sync, a rank per attention TP
    group (each holds its EP shard); async, an expert worker per device of the pool (co-located: every device)."""
    if c.engine == "sync":
        return devices // c.attention_tp
    return devices if c.colocated else devices - c.attention_workers * c.attention_tp


def runtime_config(c, devices: int, num_experts: int, **settings) -> RuntimeConfig:
    """The RuntimeConfig of one instance of `c` on `devices` devices (a sync fleet: use `deployments`);
    settings: the mechanics (compute, hardware, dilation, timeouts, ...). Redundant experts left to the tuner's
    default (None) become the fewest extra copies that give every expert worker the same slot count, as the
    simulator takes them."""
    if c.engine == "sync" and c.wide_replicas:
        raise ValueError("a sync fleet is two deployments: use deployments()")
    workers = expert_workers(c, devices)
    redundant = c.redundant_experts if c.redundant_experts is not None else (-num_experts) % workers
    common = dict(token_budget=c.token_budget, router=c.router, order=c.order, redundant_experts=redundant,
                  attention_tp=c.attention_tp, **settings)
    if c.engine == "sync":
        return RuntimeConfig(devices=devices, attention_workers=1, expert_workers=max(1, workers - 1),
                             microbatches=2 if c.two_batch_overlap else 1, **common)
    adaptive = c.microbatches == "adaptive"
    fleet = dict(wide_replicas=c.wide_replicas, wide_tp=c.wide_tp, wide_from_tokens=c.wide_from_tokens,
                 wide_token_budget=c.wide_token_budget or 0) if c.wide_replicas else {}
    narrow = (devices - c.wide_replicas * c.wide_tp) // c.attention_tp if c.wide_replicas else c.attention_workers
    if c.short_replicas:
        fleet.update(short_replicas=c.short_replicas, short_below_tokens=c.short_below_tokens)
    wait = {} if c.max_wait_s is None else {"expert_max_wait_ms": c.max_wait_s * 1e3}
    # the expert batch cap the tuner simulated (EngineConfig leaves EngineSpec's), named only where the runtime's
    # own rule (4 x the budget) gives another
    cap = EngineSpec.max_batch_tokens
    batch = {} if cap == expert_batch_cap(c.token_budget) else {"expert_batch_tokens": cap}
    return RuntimeConfig(attention_workers=narrow, expert_workers=workers,
                         devices=devices if c.colocated else c.attention_workers * c.attention_tp + workers,
                         microbatches=2 if adaptive else int(c.microbatches), adaptive_depth=adaptive,
                         colocated=c.colocated, aggregation_window_ms=c.window_s * 1e3, selector=c.selector,
                         **fleet, **wait, **batch, **common)


def deployments(c, devices: int, num_experts: int, **settings) -> list[Deployment]:
    """Each deployment of ONE instance of `c` (the configuration runs c.instances of them side by side, each on
    devices // c.instances devices)."""
    per = devices // c.instances
    if c.engine == "sync" and c.wide_replicas:
        wide = c.wide_replicas * c.wide_tp
        lane = c.short_replicas * c.attention_tp
        narrow = dataclasses.replace(c, wide_replicas=0, short_replicas=0)
        long = dataclasses.replace(narrow, attention_tp=c.wide_tp, token_budget=c.wide_token_budget or c.token_budget)
        cut = f"{c.wide_from_tokens} tokens"
        low = f"of {c.short_below_tokens} to {cut}" if lane else f"under {cut}"
        out = [Deployment("sync", per - wide - lane, f"prompts {low}",
                          runtime_config(narrow, per - wide - lane, num_experts, **settings)),
               Deployment("sync", wide, f"prompts of {cut} or more",
                          runtime_config(long, wide, num_experts, **settings))]
        if lane:
            out.append(Deployment("sync", lane, f"prompts under {c.short_below_tokens} tokens",
                                  runtime_config(narrow, lane, num_experts, **settings)))
        return out
    return [Deployment(c.engine, per, "all prompts", runtime_config(c, per, num_experts, **settings))]


# the fields `serve_command` prints: the layout and scheduling (the rest are mechanics the user picks)
_LAYOUT = ("attention_workers", "expert_workers", "devices", "attention_tp", "token_budget", "microbatches",
           "adaptive_depth", "router", "order", "selector", "expert_max_wait_ms", "aggregation_window_ms", "expert_batch_tokens",
           "redundant_experts", "colocated", "wide_replicas", "wide_tp", "wide_from_tokens", "wide_token_budget",
           "short_replicas", "short_below_tokens", "compute", "hardware")


def serve_command(model: str, d: Deployment) -> str:
    """The `asap serve` command line of deployment `d`: every layout field not at RuntimeConfig's default
    (sync: only the fields sync reads)."""
    default = RuntimeConfig()
    names = _LAYOUT if d.engine == "async" else ("devices", "attention_tp", "token_budget", "microbatches",
                                                 "router", "order", "redundant_experts", "compute", "hardware")
    args = ["asap", "serve", model, "--engine", d.engine]
    for name in names:
        value = getattr(d.runtime, name)
        if value == getattr(default, name) and not (name == "devices" and d.engine == "sync"):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        else:
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(args)


def deployment_lines(c, devices: int, model: str, hardware: str) -> list[str]:
    """How to run `c` on `devices` devices, as lines a user reads: each deployment's `asap serve` command (a
    layout with attention TP > 1 runs emulated on `hardware`'s cost table: real-compute TP is not built), and
    what sits in front of them."""
    from asap.sim.run import get_model
    wide = c.wide_tp if c.wide_replicas else 1
    emulated = max(c.attention_tp, wide) > 1
    settings = dict(compute="emulated", hardware=hardware) if emulated else {}
    parts = deployments(c, devices, get_model(model).num_experts, **settings)
    out = []
    if c.instances > 1:
        per = devices // c.instances
        out.append(f"{c.instances} independent instances of {per} device{'s' if per > 1 else ''} behind a load "
                   f"balancer; each runs:")
    for d in parts:
        out.append(f"  {serve_command(model, d)}" + (f"    # {d.serves}" if len(parts) > 1 else ""))
    if len(parts) > 1:
        out.append("  a length-aware proxy in front sends each prompt to its deployment (ASAP does not ship one)")
    if emulated:
        out.append("  (attention TP > 1 runs with emulated compute only: real-compute tensor parallelism is not built)")
    return out
