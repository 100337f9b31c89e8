"""One simulated engine, typed: what asap.sim.run.build_engine builds and asap.sim.run.run runs.

Every way of naming an engine for the simulator ends here: run()'s keywords,
the tuner's EngineConfig (asap.studies.config.EngineConfig.spec) and a runtime's
RuntimeConfig (asap.sim.from_runtime.engine_spec). Values are checked once,
in __post_init__, so a bad one is refused before any simulation starts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineSpec:
    engine: str = "async"                   # "async" | "sync"
    model: Any = "deepseek-v3"              # preset name, HF config.json dict, or ModelConfig
    hardware: str = "cloudmatrix384"
    devices: int = 32                       # all instances together
    attention_workers: int | None = None    # async: replicas per instance (None: balanced_split)
    instances: int = 1                      # independent instances (devices split evenly; sync's DP+EP units)
    token_budget: int = 16384               # per replica / DP group step (SGLang's chunked_prefill_size / dp_size)
    attention_tp: int = 1                   # devices per attention replica (async) / DP group (sync)
    router: Any = "queue-aware"             # name (asap.scheduler.router.ROUTERS) or a Router
    order: str = "fcfs"
    max_queue: int = 1024
    selector: Any = "oldest"                # async expert batching: name or a Selector
    max_batch_tokens: int = 65536
    window_s: float = 0.0
    max_wait_s: float | None = None         # selector "fullest": its age bound (None: FullestLayer's default)
    microbatches: int | str = 2             # async: per step, or "adaptive"
    colocated: bool = False                 # async: every device an attention replica's (of attention_tp) and an
                                            # expert shard's (1/devices of the experts); no separate expert pool
    wide_replicas: int = 0                  # a length-aware fleet: this many replicas (async co-located) / DP groups
    wide_tp: int = 8                        # (sync: one deployment of its own) of wide_tp devices take the prompts of
    wide_from_tokens: int = 32768           # >= wide_from_tokens; the rest of the instance's devices are replicas / DP
                                            # groups of attention_tp (asap.scheduler.length_router; asap.sim.run)
    wide_token_budget: int | None = None    # the wide group's chunk (None: token_budget)
    short_replicas: int = 0                 # a short-prompt lane: this many of the narrow replicas (async) / DP groups
    short_below_tokens: int = 4096          # (sync: a deployment of its own) take only prompts under this length
    two_batch_overlap: bool = True          # sync
    expert_loads: Any = None                # [moe_layer][expert] routing loads (e.g. RoutingStats.loads())
    zipf: float = 0.0                       # else: Zipf-skewed loads (0 = uniform)
    expert_load: str | None = None          # "drawn" per-batch loads or "expected" (None: asap.sim.experts default)
    expert_skew: float | None = None        # drawn: per-batch popularity drift (None: the calibrated default)
    redundant_experts: int | None = None
    seed: int = 0
    prompt_len: float | None = None         # async's balanced_split input (None: run() takes the requests')
    trace_window: tuple[float, float] | None = None
    prefix_cache: bool = False
    prefix_cache_blocks: int | None = None  # the cache's capacity (None: what memory leaves, prefix_cache_capacity)

    def __post_init__(self):
        if self.prefix_cache_blocks is not None and not self.prefix_cache:
            raise ValueError("prefix_cache_blocks overrides the prefix cache's capacity: set prefix_cache=True too")
        if self.engine not in ("async", "sync"):
            raise ValueError(f"engine must be 'async' or 'sync', got {self.engine!r}")
        if not (isinstance(self.attention_tp, int) and self.attention_tp >= 1):
            raise ValueError(f"attention_tp must be an int >= 1, got {self.attention_tp!r}")
        if self.colocated and self.engine != "async":
            raise ValueError("colocated is an async layout (sync DP+EP is co-located by construction)")
        if self.colocated and self.attention_workers is not None and \
                self.attention_workers * self.attention_tp != self.devices // self.instances:
            raise ValueError(f"colocated: every device hosts attention, so attention_workers x attention_tp must be "
                             f"the instance's {self.devices // self.instances} devices (or leave attention_workers unset)")
        if self.wide_replicas:
            per = self.devices // max(1, self.instances)
            if self.engine == "async" and not self.colocated:
                raise ValueError("wide_replicas (a length-aware fleet) is built for sync and async's co-located "
                                 "layout only")
            if self.attention_workers is not None:
                raise ValueError("wide_replicas: the narrow replicas are the devices left; leave attention_workers unset")
            narrow = per - self.wide_replicas * self.wide_tp
            if self.wide_replicas < 0 or narrow < self.attention_tp or narrow % self.attention_tp:
                raise ValueError(f"wide_replicas={self.wide_replicas} x TP{self.wide_tp} must leave a positive "
                                 f"multiple of attention_tp={self.attention_tp} of the instance's {per} devices")
            if self.wide_from_tokens < 1:
                raise ValueError(f"wide_from_tokens must be >= 1, got {self.wide_from_tokens}")
            if self.wide_token_budget is not None and self.wide_token_budget < 1:
                raise ValueError(f"wide_token_budget must be >= 1, got {self.wide_token_budget}")
        if self.short_replicas:
            if self.short_replicas < 0 or self.short_below_tokens < 1:
                raise ValueError(f"need short_replicas >= 0 and short_below_tokens >= 1, got {self.short_replicas}, "
                                 f"{self.short_below_tokens}")
            if self.engine == "sync" and not self.wide_replicas:
                raise ValueError("short_replicas: a sync short-prompt lane is built for length-aware fleets "
                                 "(wide_replicas > 0) only")
            if self.wide_replicas and self.short_below_tokens >= self.wide_from_tokens:
                raise ValueError(f"short_below_tokens={self.short_below_tokens} must be under wide_from_tokens="
                                 f"{self.wide_from_tokens}")
        if not (isinstance(self.instances, int) and self.instances >= 1) or self.devices % self.instances:
            raise ValueError(f"instances={self.instances!r} must be an int >= 1 that divides devices={self.devices}")

    def replace(self, **changes) -> "EngineSpec":
        return dataclasses.replace(self, **changes)


def spec_of(engine="async", model_cfg="deepseek-v3", hardware="cloudmatrix384", devices: int = 32,
            attention_workers: int | None = None, **kw) -> EngineSpec:
    """An EngineSpec from run()'s positional arguments and keywords (model_cfg is the spec's `model`); an
    EngineSpec given as `engine` is returned as it is (no other argument allowed with it)."""
    if isinstance(engine, EngineSpec):
        if kw or attention_workers is not None:
            raise TypeError("run(requests, spec): give every setting in the EngineSpec, not beside it")
        return engine
    unknown = set(kw) - {f.name for f in dataclasses.fields(EngineSpec)}
    if unknown:
        raise TypeError(f"unknown simulator setting(s) {sorted(unknown)}; see asap.sim.spec.EngineSpec")
    return EngineSpec(engine, model_cfg, hardware, devices, attention_workers, **kw)
