"""Build a simulated engine from plain arguments, run requests through it, return results.

`simulate(requests, engine="async"|"sync", ...)` -> one asap.measure.metrics.RequestResult
per request (request_id, arrival, num_tokens, ttft or error, deadline_s), in request
order, so the benchmark tool can use the simulator as a target. `run(...)` returns
the same plus engine statistics and trace spans. Policies (router, selector) may be
given by name or as objects; objects are used as they are.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from asap.config import ModelConfig
from asap.model.presets import preset_config
from asap.pipeline.plan import token_weighted_length
from asap.scheduler.expert_select import make_selector
from asap.scheduler.length_router import LengthRouter
from asap.scheduler.prefix_cache import merge_stats
from asap.scheduler.request import Request
from asap.scheduler.router import make_router
from asap.sim.async_engine import AsyncEngine
from asap.sim.cost import CostModel
from asap.sim.events import Arrival
from asap.sim.experts import ExpertShares, load_model, plan_experts, zipf_loads
from asap.sim.hardware import get_hardware
from asap.sim.memory import check_memory, min_expert_workers, prefix_cache_capacity
from asap.sim.simulator import Simulator
from asap.sim.spec import EngineSpec, spec_of
from asap.sim.sync_engine import SyncEngine

@dataclass
class SimRun:
    results: list                   # RequestResult per request, in request order
    engine: str
    devices: int
    attention_workers: int
    expert_workers: int
    num_events: int
    wall_s: float
    sim_end_s: float
    stats: dict = field(default_factory=dict)
    spans: list = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.num_events / self.wall_s if self.wall_s else 0.0


def get_model(spec) -> ModelConfig:
    """A ModelConfig, a preset name, or an HF config.json dict."""
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, dict):
        return ModelConfig.from_hf(spec)
    return ModelConfig.from_hf(preset_config(str(spec)))


def uniform_shares(model: ModelConfig, workers: int) -> ExpertShares:
    slots = math.ceil(model.num_experts / workers)
    return ExpertShares(workers, (1.0 / workers,) * sum(model.moe_layers), slots)


def balanced_split(cost: CostModel, devices: int, token_budget: int = 16384, microbatches: int = 2,
                   prompt_len: float = 4096, max_batch_tokens: int = 65536) -> int:
    """Attention replicas A (experts E = devices - A x cost.attn_tp) that balance replica and expert
    throughput.

    Replica rate: k micro-batches of budget/k tokens, each token attending to prompt_len/2 earlier
    tokens on average, ping-pong with the experts: per MoE layer max(k * t_attn, t_attn + dispatch +
    experts + combine). Expert rate: batches of min(max_batch_tokens, A * budget / k) tokens. Uses
    uniform expert loads; memory bounds E from below. `run` passes the requests' token-weighted
    mean prompt length, sum(L^2)/sum(L).
    """
    m, hw = cost.model, cost.hw
    k = max(1, microbatches if isinstance(microbatches, int) else 2)
    mb = max(1, token_budget // k)
    pairs, kv = int(mb * (prompt_len + 1) / 2), int(mb + prompt_len / 2)
    t_moe, t_dense = cost.attention_seconds(True, mb, pairs, kv), cost.attention_seconds(False, mb, pairs, kv)
    n_moe = sum(m.moe_layers)
    e_min = min_expert_workers(m, hw)
    best, best_rate = None, -1.0
    tp = cost.attn_tp
    for A in range(1, (devices - e_min) // tp + 1):
        E = devices - A * tp
        shares = uniform_shares(m, E)
        disp = cost.seconds_per_copy(E, False, devices, hw.dispatch_bytes) * m.top_k
        comb = cost.seconds_per_copy(E, False, devices, hw.combine_bytes) * m.top_k
        batch = min(max_batch_tokens, A * mb)
        t_exp = cost.expert_seconds(0, batch, shares, comb / m.top_k)
        roundtrip = 2 * hw.link.latency_s + mb * (disp + comb) + t_exp * max(1.0, mb / batch)
        replica_s = n_moe * max(k * t_moe, t_moe + roundtrip) + (m.num_layers - n_moe) * k * t_dense
        rate = min(A * k * mb / replica_s, batch / (n_moe * t_exp))
        if rate > best_rate:
            best, best_rate = A, rate
    if best is None:
        raise ValueError(f"{devices} x {hw.name} cannot hold {m.model_type} experts plus an attention replica")
    return best


def build_engine(spec: EngineSpec) -> "AsyncEngine | SyncEngine":
    """An engine ready for Arrival events, for ONE instance of spec.devices devices (spec.instances is
    run()'s business; spec.prompt_len feeds `balanced_split`, 4096 if None)."""
    engine, attention_tp, devices, token_budget = spec.engine, spec.attention_tp, spec.devices, spec.token_budget
    model, hw = get_model(spec.model), get_hardware(spec.hardware)
    attention_costs = None
    if engine == "sync":
        if devices % attention_tp:
            raise ValueError(f"sync: attention_tp={attention_tp} must divide the instance's {devices} devices")
        # one engine rank = one DP group of attention_tp devices; EP spans all the instance's devices.
        # Contention only where comm overlaps compute: with two-batch overlap.
        cost = CostModel(model, hw, attn_tp=attention_tp, rank_devices=attention_tp, overlapped=spec.two_batch_overlap)
        num_attn = num_exp = devices // attention_tp
    elif spec.colocated:
        # every device: one attention_tp-th of a replica and 1/devices of the experts (the sync layout, async)
        if devices % attention_tp:
            raise ValueError(f"colocated: attention_tp={attention_tp} must divide the instance's {devices} devices")
        cost = CostModel(model, hw, attn_tp=attention_tp)
        num_attn, num_exp = devices // attention_tp, devices
        if spec.wide_replicas:      # a length-aware fleet: narrow replicas of attention_tp, then the wide ones
            wide_cost = CostModel(model, hw, attn_tp=spec.wide_tp)
            check_memory("sync", model, hw, devices, devices, spec.wide_tp)
            num_attn = (devices - spec.wide_replicas * spec.wide_tp) // attention_tp
            attention_costs = [cost] * num_attn + [wide_cost] * spec.wide_replicas
            num_attn += spec.wide_replicas
    else:
        cost = CostModel(model, hw, attn_tp=attention_tp)
        prompt_len = 4096 if spec.prompt_len is None else spec.prompt_len
        num_attn = spec.attention_workers or balanced_split(cost, devices, token_budget, spec.microbatches,
                                                            prompt_len, spec.max_batch_tokens)
        num_exp = devices - num_attn * attention_tp
        if num_exp < 1:
            raise ValueError(f"async needs at least one expert worker: devices={devices}, attention={num_attn} "
                             f"replicas x TP {attention_tp}")
    layout = "sync" if spec.colocated else engine     # memory: the weights per device are sync's
    check_memory(layout, model, hw, devices, num_exp if engine == "async" else devices, attention_tp)
    blocks = None
    if spec.prefix_cache:
        blocks = spec.prefix_cache_blocks if spec.prefix_cache_blocks is not None else \
            prefix_cache_capacity(layout, model, hw, devices, attention_tp)
    n_moe = sum(model.moe_layers)
    loads = spec.expert_loads if spec.expert_loads is not None else \
        zipf_loads(n_moe, model.num_experts, spec.zipf, spec.seed)
    if len(loads) != n_moe or any(len(row) != model.num_experts for row in loads):
        raise ValueError(f"expert_loads must be [{n_moe} MoE layers][{model.num_experts} experts]")
    shares = plan_experts(loads, num_exp, spec.redundant_experts,
                          load_model(spec.expert_load, spec.expert_skew, spec.seed), model)
    router = spec.router
    if isinstance(router, str):
        router = make_router(router, cost.replica_cost_fn())
    narrow = num_attn - spec.wide_replicas
    if spec.short_replicas:             # the lane: the first short_replicas narrow replicas, prompts < short_below_tokens
        if not isinstance(spec.router, str):
            raise ValueError("short_replicas needs the router by name (each group gets its own)")
        if spec.short_replicas >= narrow:
            raise ValueError(f"short_replicas={spec.short_replicas} must leave at least one of the {narrow} narrow "
                             "replicas for the other prompts")
        router = LengthRouter(make_router(spec.router, cost.replica_cost_fn()), router,
                              set(range(spec.short_replicas, narrow)), spec.short_below_tokens, one_way=True)
    if attention_costs is not None:     # each group routes with its own costs; the prompt's length picks the group
        wide = make_router(spec.router, attention_costs[-1].replica_cost_fn()) if isinstance(spec.router, str) \
            else router
        router = LengthRouter(router, wide, set(range(narrow, num_attn)), spec.wide_from_tokens)
    if engine == "sync":
        return SyncEngine(cost, num_attn, router, token_budget, shares, order=spec.order, max_queue=spec.max_queue,
                          two_batch_overlap=spec.two_batch_overlap, trace_window=spec.trace_window,
                          prefix_cache_blocks=blocks)
    selector = spec.selector
    if isinstance(selector, str):
        selector = make_selector(selector, window_s=spec.window_s, max_wait_s=spec.max_wait_s,
                                 max_batch_tokens=spec.max_batch_tokens)
    if attention_costs is not None and spec.wide_token_budget is not None:
        token_budget = [token_budget] * (num_attn - spec.wide_replicas) + [spec.wide_token_budget] * spec.wide_replicas
    return AsyncEngine(cost, num_attn, router, token_budget, shares, selector, microbatches=spec.microbatches,
                       order=spec.order, max_queue=spec.max_queue, trace_window=spec.trace_window,
                       prefix_cache_blocks=blocks, colocated=spec.colocated, attention_costs=attention_costs)


def run(requests: list[Request], engine="async", model_cfg="deepseek-v3", hardware="cloudmatrix384",
        devices: int = 32, attention_workers: int | None = None, *, until: float = float("inf"), **kw) -> SimRun:
    """Simulate `requests` (not modified): run(requests, EngineSpec(...)), or with the spec's settings as
    arguments (model_cfg is its `model`). Policies by name or object.

    async: `attention_workers` replicas (default: `balanced_split` for these requests' token-weighted
           mean prompt length) + the rest as expert workers.
    sync:  `instances` independent instances (default 1) of devices / instances devices each; in each,
           DP groups of `attention_tp` devices (attention TP inside the group, its all-reduce from the
           hardware profile) and EP over all the instance's devices. Arrivals are split between
           instances by `split_instances`.
    Settings (asap.sim.spec.EngineSpec): token_budget, attention_tp (async: per replica), router / selector
    (name or object), order, max_queue, max_batch_tokens and window_s (expert batching), microbatches (int or
    "adaptive", async), two_batch_overlap (sync), expert_loads ([moe_layer][expert], e.g.
    RoutingStats.loads()) or zipf (skew), redundant_experts, seed, trace_window=(t0, t1),
    prefix_cache (off by default: a PrefixCache per replica / DP group over the requests' hash_ids,
    capacity `prefix_cache_capacity` unless prefix_cache_blocks says; stats["prefix_cache"] has the hits).
    Experts are placed with asap.scheduler.placement.balanced_placement on the expert workers.
    """
    spec = spec_of(engine, model_cfg, hardware, devices, attention_workers, **kw)
    own = [dataclasses.replace(r, meta=dict(r.meta)) for r in requests]
    if len({r.id for r in own}) != len(own):
        raise ValueError("request ids must be unique")
    if spec.engine == "async" and not spec.colocated and spec.attention_workers is None and spec.prompt_len is None \
            and own:
        spec = spec.replace(prompt_len=token_weighted_length(own))
    if spec.instances != 1:
        return _run_instances(own, spec, until)
    if spec.engine == "sync" and spec.wide_replicas:
        return _run_sync_fleet(own, spec, until)
    eng = build_engine(spec)
    sim = Simulator(eng)
    for r in sorted(own, key=lambda r: r.arrival):
        sim.schedule(Arrival(r.arrival, r))
    end = sim.run(until)
    missing = [r.id for r in own if r.id not in eng.results]
    if missing and until == float("inf"):
        raise RuntimeError(f"simulation ended with {len(missing)} requests unfinished (first: {missing[:5]})")
    results = [eng.results[r.id] for r in own if r.id in eng.results]
    num_attn = len(eng.schedulers)
    num_exp = eng.shares.num_workers
    return SimRun(results, spec.engine, spec.devices, num_attn, num_exp if spec.engine == "async" else spec.devices,
                  sim.num_events, sim.wall_s, end, stats=eng.stats(), spans=eng.spans)


def split_instances(requests: list[Request], instances: int, tokens_per_s: float) -> list[list[Request]]:
    """A least-outstanding-work router across independent instances: each arrival joins the instance with
    the fewest unfinished prompt tokens, estimated as a fluid queue draining `tokens_per_s` per instance;
    ties (idle instances, all estimated drained) go round-robin, not to the lowest index, which would send
    every request of a light load to instance 0."""
    left, last, turn = [0.0] * instances, 0.0, 0
    out: list[list[Request]] = [[] for _ in range(instances)]
    for r in sorted(requests, key=lambda r: r.arrival):
        drained = (r.arrival - last) * tokens_per_s
        last = r.arrival
        left = [max(0.0, x - drained) for x in left]
        i = min(range(instances), key=lambda j: (left[j], (j - turn) % instances))
        turn = i + 1
        left[i] += r.num_tokens
        out[i].append(r)
    return out


def instance_tokens_per_s(cost: CostModel, num_ranks: int, token_budget: int, prompt_len: float) -> float:
    """Attention-side prefill rate of one instance, from the routing cost function (for split_instances)."""
    pairs_ctx = max(0.0, prompt_len / 2 - token_budget / 2)
    return num_ranks * token_budget / cost.replica_cost_fn()([(token_budget, int(pairs_ctx))])


def _run_instances(own, spec: EngineSpec, until) -> SimRun:
    instances, per, tp = spec.instances, spec.devices // spec.instances, spec.attention_tp
    model, hw = get_model(spec.model), get_hardware(spec.hardware)
    prompt_len = token_weighted_length(own) if own else 0.0
    ranks = per // tp if spec.engine == "sync" or spec.colocated else (spec.attention_workers or 1)
    rate = instance_tokens_per_s(CostModel(model, hw, attn_tp=tp), ranks, spec.token_budget, prompt_len)
    one = spec.replace(devices=per, instances=1)
    # an instance without requests is not simulated; with none at all, one empty run gives the shape
    parts = [run(part, one, until=until) for part in split_instances(own, instances, rate) if part] \
        or [run([], one, until=until)]
    first = parts[0]
    return _merged(own, parts, spec, first.attention_workers * instances, first.expert_workers * instances,
                   {"instances": instances, "per_instance": [p.stats for p in parts]})


def _merged(own, parts: list[SimRun], spec: EngineSpec, attention_workers: int, expert_workers: int,
            stats: dict) -> SimRun:
    """One SimRun of independent parts (instances, or a fleet's deployments): results in request order,
    events and wall time summed, the last part's end, prefix-cache statistics merged, the first part's spans."""
    by_id = {res.request_id: res for p in parts for res in p.results}
    caches = [p.stats["prefix_cache"] for p in parts if "prefix_cache" in p.stats]
    if caches:
        stats["prefix_cache"] = merge_stats(caches)
    return SimRun([by_id[r.id] for r in own if r.id in by_id], spec.engine, spec.devices, attention_workers,
                  expert_workers, sum(p.num_events for p in parts), sum(p.wall_s for p in parts),
                  max(p.sim_end_s for p in parts), stats=stats, spans=parts[0].spans)


def split_by_length(requests: list[Request], min_tokens: int, tokens_per_s: tuple[float, float],
                    rank_tokens_per_s: tuple[float, float]) -> tuple[list[Request], list[Request]]:
    """(narrow, wide): a proxy in front of two sync deployments. Prompts of >= min_tokens go to the wide one,
    the rest to the narrow one; a short prompt the narrow one is estimated to make miss its deadline goes to
    the wide one if that one is estimated to meet it. Long prompts never overflow to the narrow deployment:
    one there holds a DP group for seconds and every other group waits for it at each layer's barrier
    (SIMULATED, conversation, 32 dies, 2.375 req/s: 83% within SLO with two-way overflow, 90% without).
    Estimate: a fluid queue per deployment draining `tokens_per_s` (as split_instances), then the prompt on
    one rank (DP group) at `rank_tokens_per_s`."""
    left, last = [0.0, 0.0], 0.0
    out: tuple[list[Request], list[Request]] = ([], [])
    for r in sorted(requests, key=lambda r: r.arrival):
        left = [max(0.0, x - (r.arrival - last) * rate) for x, rate in zip(left, tokens_per_s)]
        last = r.arrival
        g = int(r.num_tokens >= min_tokens)
        finish = [r.arrival + left[i] / tokens_per_s[i] + r.num_tokens / rank_tokens_per_s[i] for i in (0, 1)]
        if g == 0 and r.deadline is not None and finish[0] > r.deadline >= finish[1]:
            g = 1
        left[g] += r.num_tokens
        out[g].append(r)
    return out


def sync_fleet_parts(own: list[Request], spec: EngineSpec) -> list[tuple[str, list[Request], EngineSpec]]:
    """A sync length-aware fleet on one instance's devices as [(name, its requests, its spec)] for its two
    independent sync deployments: the narrow one (DP groups of attention_tp) and the wide one (wide_replicas
    DP groups of wide_tp, EP over its own devices), the requests split by split_by_length. Sync cannot share
    one EP domain between DP groups of different TP (SGLang's DP attention runs one TP size), so an operator
    runs two deployments and a length-aware proxy. With a short-prompt lane (short_replicas), a third
    deployment of that many DP groups of attention_tp takes the narrow deployment's devices and the prompts
    under short_below_tokens, split from the narrow ones the same way (a short prompt the lane is estimated to
    make miss its deadline goes to the narrow deployment)."""
    model, hw = get_model(spec.model), get_hardware(spec.hardware)
    wide_devices = spec.wide_replicas * spec.wide_tp
    lane_devices = spec.short_replicas * spec.attention_tp
    if spec.short_replicas and spec.devices - wide_devices - lane_devices < spec.attention_tp:
        raise ValueError(f"short_replicas={spec.short_replicas} x TP{spec.attention_tp} must leave a narrow DP group")
    base = spec.replace(wide_replicas=0, short_replicas=0)
    narrow = base.replace(devices=spec.devices - wide_devices - lane_devices)
    wide = base.replace(devices=wide_devices, attention_tp=spec.wide_tp, token_budget=spec.wide_token_budget or
                        spec.token_budget, wide_token_budget=None)

    def rates(parts):
        rate, rank = [], []
        for s, mine in parts:
            per_rank = instance_tokens_per_s(CostModel(model, hw, attn_tp=s.attention_tp), 1, s.token_budget,
                                             token_weighted_length(mine) if mine else s.token_budget)
            rate.append(per_rank * (s.devices // s.attention_tp))
            rank.append(per_rank)
        return tuple(rate), tuple(rank)

    pool = base.replace(devices=spec.devices - wide_devices)        # the narrow deployment and the lane together
    lengths = ([r for r in own if r.num_tokens < spec.wide_from_tokens],
               [r for r in own if r.num_tokens >= spec.wide_from_tokens])
    pooled, long = split_by_length(own, spec.wide_from_tokens, *rates(zip((pool, wide), lengths)))
    if not spec.short_replicas:
        return [("narrow", pooled, pool), ("wide", long, wide)]
    lane = base.replace(devices=lane_devices)
    lengths = ([r for r in pooled if r.num_tokens < spec.short_below_tokens],
               [r for r in pooled if r.num_tokens >= spec.short_below_tokens])
    short, rest = split_by_length(pooled, spec.short_below_tokens, *rates(zip((lane, narrow), lengths)))
    return [("narrow", rest, narrow), ("wide", long, wide), ("short", short, lane)]


def _run_sync_fleet(own, spec: EngineSpec, until) -> SimRun:
    """A sync length-aware fleet (sync_fleet_parts), its deployments merged into one run."""
    parts = sync_fleet_parts(own, spec)
    # a deployment without requests is not simulated; with none at all, the narrow one runs empty
    runs = {name: run(p, s, until=until) for name, p, s in parts if p} or {"narrow": run([], parts[0][2], until=until)}
    ranks = sum(s.devices // s.attention_tp for _, _, s in parts)       # every DP group, whether it got work or not
    return _merged(own, list(runs.values()), spec, ranks, spec.devices,
                   {"fleet": {name: dict(p.stats, num_requests=len(p.results)) for name, p in runs.items()}})


def simulate(requests: list[Request], engine: str = "async", model_cfg="deepseek-v3", hardware="cloudmatrix384",
             devices: int = 32, attention_workers: int | None = None, **kw) -> list:
    """Per-request results (asap.measure.metrics.RequestResult: request_id, arrival, num_tokens, ttft, error,
    deadline_s), in request order. Keyword arguments as for `run`."""
    return run(requests, engine, model_cfg, hardware, devices, attention_workers, **kw).results
