"""The configuration spaces the tuner (asap.studies.tune) searches, the knobs an operator of each engine
would search (every candidate an asap.studies.config.EngineConfig):
- sync  (SGLang / vLLM DP-attention + EP): independent instances of any size that divides N and holds the
        model; in each, attention TP inside a DP group (1 / 4 / 8 / 16, within a node) and EP over the
        instance; the per-DP-group chunk (SGLang's chunked_prefill_size / dp_size: 4K / 8K / 16K / 32K);
        two-batch overlap on / off; the queue-aware router or the peers' default (round-robin); EPLB
        redundant experts;
- async (ASAP): instances of any size that divides N, attention TP per replica (1 / 4 / 8 / 16), the
        per-replica chunk (4K / 8K / 16K / 32K), the A:E split (the cost model's balance point, and 25% more
        attention replicas, or 20% fewer where memory is full), micro-batch depth 1 / 2 / 3, the same routers, an
        expert batching window of 0 / 2 / 5 ms, the expert selector (oldest or fullest layer first); and the
        co-located layout (every die attention and 1/N of the experts, sync's memory per die);
- both:  length-aware fleets of the same shapes (`_fleets`): half of each instance's devices a wide group
        (TP 4 / 8 / 16, 32K chunks) for prompts of >= 32K tokens, the other half narrow (the TPs and chunks
        above). Sync runs them as two deployments behind a length-aware proxy; async co-located, one expert
        pool on all the devices; and the queue order of each replica / DP group (`orders`, QUEUE_ORDERS by
        default: first-come-first-served only; `asap sim headline --orders`), a secondary knob.
"""
from __future__ import annotations

import dataclasses
import math

from asap.cost.hardware import get_hardware
from asap.cost.model import CostModel
from asap.sim.memory import check_memory, min_expert_workers
from asap.sim.run import balanced_split, build_engine, get_model, sync_fleet_parts
from asap.studies.config import EngineConfig

SYNC_TP = (1, 4, 8, 16)                  # attention TP inside a DP group, within a node
ASYNC_TP = (1, 4, 8, 16)                 # attention TP of an async replica, within a node
CHUNKS = (4096, 8192, 16384, 32768)      # tokens per step of one DP group / replica
# the peers' default DP router: SGLang's --load-balance-method round_robin (its DP controller's default);
# vLLM's internal DP load balancing counts queued and running requests per rank, which the queue-aware
# router refines with their work, so queue-aware stands for it
ROUTERS = ("queue-aware", "round-robin")
MICROBATCHES = (1, 2, 3)                 # async micro-batch depth
# async expert batching window (RuntimeConfig.aggregation_window_ms): without a barrier, replicas reach a layer
# at different times and the expert side sees one replica's micro-batch at a time (fixed 4K on 32 co-located
# dies: ~2.4K tokens per batch against sync's ~40K per all-to-all), which reloads the expert weights per batch
WINDOWS = (0.002, 0.005)
# async expert work selection: oldest first, or the fullest layer first (asap.scheduler.expert_select.FullestLayer:
# when work queues up, the most items per expert weight read; fixed 4K on 32 dies, A=17 + E=15: 27.5 -> 31 req/s)
SELECTORS = ("oldest", "fullest")
# length-aware fleets (`_fleets`): the wide group's attention TP, chunk, and the prompt length it takes from
FLEET_WIDE_TP, FLEET_CHUNK, FLEET_FROM = (4, 8, 16), 32768, 32768
FLEET_FRACTIONS = (0.5,)     # the wide group's share of an instance's devices (the default: half)
# each replica's / DP group's queue order (asap.scheduler.replica.ORDERS), a secondary knob of both engines; by
# default first-come-first-served only. vLLM's --scheduling-policy priority (and SGLang's priority scheduling)
# serve waiting requests by a per-request priority, which a proxy can set to the prompt length (sjf) or the
# deadline (edf); srpt and edf-preempt also let a started prompt yield at a chunk boundary (ASAP's scheduler)
QUEUE_ORDERS = ("fcfs",)


def check_search(fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS, orders: tuple[str, ...] = QUEUE_ORDERS,
                 lanes: tuple = ()) -> tuple[tuple[int, int], ...]:
    """Validate the knobs that widen both engines' search alike (`asap sim headline`, `asap plan --tune`) and
    return the lanes as (replicas, below_tokens) int pairs; a ValueError names the bad one."""
    from asap.scheduler.replica import ORDERS
    if not fleet_fractions or any(not 0 < f < 1 for f in fleet_fractions):
        raise ValueError(f"fleet fractions must be shares in (0, 1), got {list(fleet_fractions)!r}")
    if not orders or any(o not in ORDERS for o in orders):
        raise ValueError(f"orders must be some of {', '.join(ORDERS)}, got {list(orders)!r}")
    try:
        pairs = tuple((int(n), int(b)) for n, b in lanes)
    except (TypeError, ValueError):
        raise ValueError(f"lanes must be (replicas, below_tokens) pairs, got {list(lanes)!r}") from None
    if any(n < 1 or b < 1 for n, b in pairs):
        raise ValueError(f"lanes must be (replicas >= 1, below_tokens >= 1) pairs, got {list(lanes)!r}")
    return pairs


def instance_sizes(devices: int, engine: str, model="deepseek-v3", hardware="cloudmatrix384") -> list[int]:
    """Every instance size that divides `devices` and can hold the model (sync: the experts over the
    instance plus attention on a DP group of the widest TP; async: the expert floor plus one replica)."""
    cfg, hw = get_model(model), get_hardware(hardware)
    out = []
    for size in range(1, devices + 1):
        if devices % size:
            continue
        try:
            if engine == "sync":
                check_memory("sync", cfg, hw, size, size, max(tp for tp in SYNC_TP if size % tp == 0))
            elif size <= min_expert_workers(cfg, hw):
                continue
        except ValueError:
            continue
        out.append(size)
    return out


def space(engine: str, devices: int, model="deepseek-v3", hardware="cloudmatrix384",
          prompt_len: float = 4096, full: bool = True,
          fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS,
          orders: tuple[str, ...] = QUEUE_ORDERS, lanes: tuple = ()) -> list[EngineConfig]:
    """The candidate configurations of `engine` on `devices` devices (feasible ones only).

    Primary knobs (always): instance size (every divisor of N that holds the model), attention TP, chunk;
    async also its A:E split (the cost model's balance point, and 25% more replicas, or 20% fewer where
    memory is full). Secondary knobs (full=True): sync two-batch overlap off and the round-robin router;
    async micro-batch depth 1 / 3, the round-robin router, an expert batching window of 2 / 5 ms and the fullest-layer
    expert selector. The first candidate of each engine is its
    default (TBO on / k=2, queue-aware). fleet_fractions: the wide group's shares of an instance that the
    length-aware fleets try (`_fleets`), the same for both engines. orders: the queue orders every candidate
    tries as a secondary knob (`secondary`), the same for both engines; lanes: the short-prompt lanes
    ((replicas, below_tokens) pairs) every candidate tries likewise (none by default; `--lanes`)."""
    cfg, hw = get_model(model), get_hardware(hardware)
    if engine not in ("sync", "async"):
        raise ValueError(f"engine must be 'sync' or 'async', got {engine!r}")
    out = []
    for size in instance_sizes(devices, engine, model, hardware):
        inst = devices // size
        if engine == "sync":
            out += [EngineConfig("sync", tp, budget, instances=inst)
                    for tp in _sync_memory_tps(SYNC_TP, size, cfg, hw) for budget in CHUNKS]
            continue
        e_min = min_expert_workers(cfg, hw)
        for tp in ASYNC_TP:
            if tp > hw.link.node_size or size - e_min < tp:
                continue
            for budget in CHUNKS:
                try:
                    a0 = balanced_split(CostModel(cfg, hw, attn_tp=tp), size, budget, 2, prompt_len)
                except ValueError:
                    continue
                a_max = (size - e_min) // tp
                alt = max(a0 + 1, math.ceil(a0 * 1.25))          # more replicas, or fewer where memory says no
                if alt > a_max:
                    alt = min(a0 - 1, math.floor(a0 * 0.8))
                for a in sorted({a0, alt} if alt >= 1 else {a0}):
                    out.append(EngineConfig("async", tp, budget, instances=inst, attention_workers=a))
        # co-located: every device a replica's attention and 1/size of the experts, so sync's memory per device
        out += [EngineConfig("async", tp, budget, instances=inst, attention_workers=size // tp, colocated=True)
                for tp in _sync_memory_tps(ASYNC_TP, size, cfg, hw) for budget in CHUNKS]
    out += _fleets(engine, devices, cfg, hw, model, hardware, fleet_fractions)
    if full:
        out += [v for c in out for v in secondary(c, orders, lanes)]
    return [c for c in out if not c.short_replicas or buildable(c, devices, model, hardware)]


def _fleets(engine: str, devices: int, cfg, hw, model, hardware,
            fractions: tuple[float, ...] = FLEET_FRACTIONS) -> list[EngineConfig]:
    """Length-aware fleets, the same shapes for both engines: in each instance, a share (`fractions`, default
    half) of the devices forms the wide group (DP groups / replicas of FLEET_WIDE_TP, chunk FLEET_CHUNK) for
    prompts of >= FLEET_FROM tokens, the rest the narrow group (attention TP and chunk as the other
    candidates). Sync: two deployments behind a length-aware proxy, each holding the whole model
    (asap.sim.run.split_by_length), so a group too small for the weights is left out; async: co-located,
    one expert pool on all the devices (asap.scheduler.length_router)."""
    out = []
    for size in instance_sizes(devices, engine, model, hardware):
        inst = devices // size
        for f in fractions:
            wide = int(size * f)           # half: size // 2
            if not 1 <= wide < size:
                continue
            if engine == "sync":
                narrow_tps = _sync_memory_tps(SYNC_TP, size - wide, cfg, hw)
                wide_tps = _sync_memory_tps(FLEET_WIDE_TP, wide, cfg, hw)
            else:
                narrow_tps = [tp for tp in _sync_memory_tps(ASYNC_TP, size, cfg, hw) if (size - wide) % tp == 0]
                wide_tps = [w for w in _sync_memory_tps(FLEET_WIDE_TP, size, cfg, hw) if wide % w == 0]
            out += [EngineConfig(engine, tp, budget, instances=inst, colocated=engine == "async",
                                 wide_replicas=wide // w, wide_tp=w, wide_from_tokens=FLEET_FROM,
                                 wide_token_budget=FLEET_CHUNK)
                    for tp in narrow_tps for w in wide_tps for budget in CHUNKS]
    return out


def _sync_memory_tps(tps, size: int, cfg, hw) -> list[int]:
    """The attention TP sizes that divide `size`, fit a node, and hold sync's weights per device on `size`
    devices (attention / tp + experts / size): sync DP groups and co-located async replicas alike."""
    out = []
    for tp in tps:
        if size % tp or tp > hw.link.node_size:
            continue
        try:
            check_memory("sync", cfg, hw, size, size, tp)
        except ValueError:
            continue
        out.append(tp)
    return out


def secondary(c: EngineConfig, orders: tuple[str, ...] = QUEUE_ORDERS, lanes: tuple = ()) -> list[EngineConfig]:
    """The variants of a primary candidate in its secondary knobs (both: router, the queue `orders`, the
    short-prompt `lanes` ((replicas, below_tokens) pairs; a lane a layout cannot hold is dropped by the caller,
    `buildable`); sync: TBO; async: micro-batch depth, expert window, expert selector)."""
    rr = [dataclasses.replace(c, router=r) for r in ROUTERS if r != c.router] \
        + [dataclasses.replace(c, order=o) for o in orders if o != c.order] \
        + [dataclasses.replace(c, short_replicas=n, short_below_tokens=b) for n, b in lanes
           if (n, b) != (c.short_replicas, c.short_below_tokens) and (c.engine == "async" or c.wide_replicas)]
    if c.engine == "sync":
        return [dataclasses.replace(c, two_batch_overlap=not c.two_batch_overlap)] + rr
    return [dataclasses.replace(c, microbatches=k) for k in MICROBATCHES if k != c.microbatches] + rr \
        + [dataclasses.replace(c, window_s=w) for w in WINDOWS if w != c.window_s] \
        + [dataclasses.replace(c, selector=s) for s in SELECTORS if s != c.selector]


def buildable(c: EngineConfig, devices: int, model="deepseek-v3", hardware="cloudmatrix384") -> bool:
    """Whether the simulator can build `c` on `devices` devices (each of a sync fleet's deployments, each
    holding the weights): a secondary variant such as a short-prompt lane may not fit a layout."""
    try:
        spec = c.spec(model, hardware, devices)
        one = spec.replace(devices=devices // c.instances, instances=1)
        parts = [s for _, _, s in sync_fleet_parts([], one)] if c.engine == "sync" and c.wide_replicas else [one]
        for s in parts:
            build_engine(s)
    except ValueError:
        return False
    return True
