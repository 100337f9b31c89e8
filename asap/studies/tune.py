"""One tuner for both engines (every figure SIMULATED): the best configuration of sync and of async for a
model, hardware, workload, SLO and device count, found with the same search and the same budget.

Configuration spaces (`space`), the knobs an operator of each engine would search:
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
        pool on all the devices.
Search, the same rule and budget for both engines (the space is too large to rate-search every candidate):
1. screen (`_screen`): every primary candidate (TBO on / k=2, queue-aware) is simulated at one rate on a
   short sample, the passing ones again at 1.5x the rate while more than SCREEN_KEEP pass (with twice the
   requests where they still tie at the sample's burst limit); then the secondary variants (TBO / router /
   k / expert window / selector) of the best SCREEN_KEEP are screened the same way;
2. the best FINALISTS screened candidates get a coarse rate search (tol COARSE_TOL), the best REFINE of
   them a fine one (tol FINE_TOL).
A candidate's answer counts only if its search is valid (asap.measure.rate_search: converged, not a burst).
Each candidate simulates the first n requests, n sized so the arrivals at its closed-batch capacity still
span 10x the mean SLO budget (fewer requests where the burst rule allows); a search that hits the burst
limit is rerun with 2n. `criterion="every-bucket"` makes the pass rule ">= target in every prompt-length
bucket" (asap.measure.buckets) instead of ">= target of all requests"; the "-sustained" variants of both also
require the run to drain within its longest TTFT budget after its last arrival and the target to hold in each
third of the run by arrival (asap.measure.sustain), so a rate at which a queue grows until the run ends (one
group's, or everyone's) does not pass. A queue that grows slower than the sample still passes each third of
it, so under those criteria, given `longer` (the same workload continued), each refined maximum is confirmed
on CONFIRM x its requests: simulated there at the rate found, and where it fails there, searched down on
them (`_confirm`); the engine's best is the best confirmed maximum, reported with the longer sample's size.
With `vet` (off by default here; on by default under `asap sim headline --sustained`), the screen's
leaders are first re-ranked on that longer sample (`_vet`), then the secondary variants of the SCREEN_KEEP
best vetted are vetted beside them; leaders that pass the vet's whole grid have it raised while more than
FINALISTS tie at its top; each of the FINALISTS best vetted is then searched (tol FINE_TOL) on the vet's
sample from its vetted bracket, instead of the coarse and fine searches on the short one, and confirmed on CONFIRM x the vet's
sample as above (where the workload has that many requests): the screen's short sample can rank a
candidate whose queue grows slowly (a length-aware fleet with too few devices for its long prompts) far
above one that sustains more, which the confirmation of the finalists alone cannot undo; the secondary
knobs screened for the short sample's best are not those of the best the vet finds; and a maximum searched
on the short sample is a floor the downward-only confirmation keeps even where the longer sample sustains
more (the 32-die conversation row's async fleet: 2.62 req/s on 750 requests, 2.80 on 1,500).
`tune(..., prefix_cache=True)` gives every candidate of either engine the same prefix cache (one per replica
/ DP group, asap.scheduler.prefix_cache; off by default) and reports its token hit rate at the best rate.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from asap.measure.buckets import by_length, min_bucket_attainment
from asap.measure.metrics import summarize
from asap.measure.rate_search import burst_limit, find_max_rate
from asap.measure.sustain import sustained_value
from asap.cost.hardware import get_hardware
from asap.cost.model import CostModel
from asap.pipeline.plan import token_weighted_length
from asap.scheduler.request import Request
from asap.studies.experiments import at_rate
from asap.sim.memory import check_memory, min_expert_workers
from asap.studies.parallel import Executor, Progress, Serial
from asap.sim.run import balanced_split, get_model, run
from asap.sim.spec import EngineSpec

COARSE_TOL, FINE_TOL, REFINE = 0.2, 0.05, 2
CONFIRM = 2                 # "-sustained" criteria: each refined maximum is confirmed on CONFIRM x its requests
FINALISTS = 3               # screened candidates that get a rate search (REFINE of them a fine one)
SCREEN_KEEP = 4             # primary candidates whose secondary variants are screened; and the pool a raise stops at
SCREEN_STEP, SCREEN_ROUNDS = 1.5, 4     # the screen's rate raises (and steps back)
SCREEN_MAX_RAISE = SCREEN_STEP ** 2     # n is sized for two raises; the burst limit caps the rest
CRITERIA = {"requests": "slo_attainment", "every-bucket": "min_bucket_attainment",
            "requests-sustained": "sustained_attainment", "every-bucket-sustained": "sustained_min_bucket_attainment"}


def pass_values(results, slo_attainment: float | None) -> dict:
    """The values the criteria compare with the target, but slo_attainment (summarize's, passed in): the worst
    length bucket's attainment, and both again as the run sustains them (asap.measure.sustain.sustained_value:
    no higher than the worst arrival third's attainment, zero where the run did not drain in time)."""
    worst = min_bucket_attainment(results)
    return {"min_bucket_attainment": worst, "sustained_attainment": sustained_value(results, slo_attainment),
            "sustained_min_bucket_attainment": sustained_value(results, worst)}
TARGET = 0.9


@dataclass(frozen=True)
class EngineConfig:
    engine: str                         # "sync" | "async"
    attention_tp: int = 1
    token_budget: int = 16384           # tokens per step of one DP group (sync) / replica (async)
    instances: int = 1                  # independent instances (devices split evenly)
    attention_workers: int | None = None    # async: attention replicas A per instance (each attention_tp devices)
    microbatches: "int | str" = 2       # async micro-batches per step
    two_batch_overlap: bool = True      # sync
    router: str = "queue-aware"
    redundant_experts: int | None = None
    prefix_cache: bool = False          # a prefix cache per replica / DP group (the same policy for both)
    colocated: bool = False             # async: every device a replica's attention and an expert shard
    wide_replicas: int = 0              # colocated: a length-aware fleet, wide_replicas x TP wide_tp take the
    wide_tp: int = 8                    # prompts of >= wide_from_tokens (asap.scheduler.length_router)
    wide_from_tokens: int = 32768
    wide_token_budget: int | None = None    # the wide group's chunk (None: token_budget)
    window_s: float = 0.0               # async: the expert side holds a batch up to this long to merge same-layer work
    selector: str = "oldest"            # async: expert work selection (asap.scheduler.expert_select.SELECTORS)
    max_wait_s: float | None = None     # async, selector "fullest": its age bound (None: its default)

    def _spec_fields(self) -> dict:
        """The EngineSpec fields this configuration sets (the rest keep the spec's defaults)."""
        kw = dict(attention_tp=self.attention_tp, token_budget=self.token_budget, router=self.router,
                  redundant_experts=self.redundant_experts, instances=self.instances)
        if self.prefix_cache:
            kw.update(prefix_cache=True)
        if self.engine == "sync":
            kw.update(two_batch_overlap=self.two_batch_overlap)
        else:
            kw.update(microbatches=self.microbatches)
            if self.colocated:
                kw.update(colocated=True)
            if self.window_s:
                kw.update(window_s=self.window_s)
            if self.selector != "oldest":
                kw.update(selector=self.selector)
            if self.max_wait_s is not None:
                kw.update(max_wait_s=self.max_wait_s)
        if self.wide_replicas:
            kw.update(wide_replicas=self.wide_replicas, wide_tp=self.wide_tp, wide_from_tokens=self.wide_from_tokens,
                      wide_token_budget=self.wide_token_budget)
        return kw

    def spec(self, model, hardware: str, devices: int, **settings) -> EngineSpec:
        """This configuration as the simulator's typed engine (asap.sim.spec.EngineSpec); settings: the rest
        (zipf, trace_window, ...)."""
        return EngineSpec(self.engine, model, hardware, devices, self.attention_workers, **self._spec_fields(), **settings)

    def describe(self, devices: int) -> str:
        return (self._describe(devices) + (f", {self.router} router" if self.router != "queue-aware" else "")
                + (f", expert window {self.window_s * 1e3:g} ms" if self.window_s else "")
                + (f", {self.selector} expert batches" if self.selector != "oldest" else "")
                + (f" (age bound {self.max_wait_s * 1e3:g} ms)" if self.max_wait_s is not None else "")
                + (", prefix cache" if self.prefix_cache else ""))

    def _wide_chunk(self) -> str:
        return f" (chunk {self.wide_token_budget})" if self.wide_token_budget not in (None, self.token_budget) else ""

    def _describe(self, devices: int) -> str:
        if self.engine == "sync" and self.wide_replicas:
            per = devices // self.instances
            wide = self.wide_replicas * self.wide_tp
            return (f"sync {self.instances}x fleet[DP{(per - wide) // self.attention_tp} x TP{self.attention_tp}, "
                    f"EP{per - wide} + DP{self.wide_replicas} x TP{self.wide_tp}, EP{wide} for prompts >= "
                    f"{self.wide_from_tokens // 1024}K{self._wide_chunk()}], chunk {self.token_budget}/group, "
                    f"TBO {'on' if self.two_batch_overlap else 'off'}")
        if self.engine == "sync":
            per = devices // self.instances
            return (f"sync {self.instances}x[DP{per // self.attention_tp} x TP{self.attention_tp}, EP{per}], "
                    f"chunk {self.token_budget}/group, TBO {'on' if self.two_batch_overlap else 'off'}")
        per = devices // self.instances
        inst = f"{self.instances}x" if self.instances > 1 else ""
        if self.colocated and self.wide_replicas:
            narrow = (per - self.wide_replicas * self.wide_tp) // self.attention_tp
            return (f"async co-located {inst}[A={narrow} x TP{self.attention_tp} + {self.wide_replicas} x "
                    f"TP{self.wide_tp} for prompts >= {self.wide_from_tokens // 1024}K{self._wide_chunk()}, experts on "
                    f"all {per}], chunk "
                    f"{self.token_budget}/replica, k={self.microbatches}")
        if self.colocated:
            return (f"async co-located {inst}[A={per // self.attention_tp} x TP{self.attention_tp}, experts on all "
                    f"{per}], chunk {self.token_budget}/replica, k={self.microbatches}")
        E = per - self.attention_workers * self.attention_tp
        return (f"async {inst}[A={self.attention_workers} x TP{self.attention_tp} + E={E}], chunk {self.token_budget}"
                f"/replica, k={self.microbatches}")


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
          fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS) -> list[EngineConfig]:
    """The candidate configurations of `engine` on `devices` devices (feasible ones only).

    Primary knobs (always): instance size (every divisor of N that holds the model), attention TP, chunk;
    async also its A:E split (the cost model's balance point, and 25% more replicas, or 20% fewer where
    memory is full). Secondary knobs (full=True): sync two-batch overlap off and the round-robin router;
    async micro-batch depth 1 / 3, the round-robin router, an expert batching window of 2 / 5 ms and the fullest-layer
    expert selector. The first candidate of each engine is its
    default (TBO on / k=2, queue-aware). fleet_fractions: the wide group's shares of an instance that the
    length-aware fleets try (`_fleets`), the same for both engines."""
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
        out += [v for c in out for v in secondary(c)]
    return out


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


def secondary(c: EngineConfig) -> list[EngineConfig]:
    """The variants of a primary candidate in its secondary knobs (sync: TBO, router; async: micro-batch depth,
    router, expert window, expert selector)."""
    rr = [dataclasses.replace(c, router=r) for r in ROUTERS if r != c.router]
    if c.engine == "sync":
        return [dataclasses.replace(c, two_batch_overlap=not c.two_batch_overlap)] + rr
    return [dataclasses.replace(c, microbatches=k) for k in MICROBATCHES if k != c.microbatches] + rr \
        + [dataclasses.replace(c, window_s=w) for w in WINDOWS if w != c.window_s] \
        + [dataclasses.replace(c, selector=s) for s in SELECTORS if s != c.selector]


@dataclass
class Tuned:
    engine: str
    devices: int
    best: EngineConfig | None
    max_slo_rate: float | None          # req/s, only from a valid search
    ttft_p90_s: float | None            # P90 TTFT at that rate
    tokens_per_s_per_device: float | None
    candidates: list[dict] = field(default_factory=list)
    num_sims: int = 0
    reason: str | None = None
    num_requests: int | None = None     # requests the best candidate's search simulated
    prefix_hit_rate: float | None = None    # prompt tokens served from the prefix caches at the best rate
    # no best: a candidate whose search is not valid passed at this rate, at or above the best certified maximum
    lower_bound: float | None = None
    lower_bound_config: EngineConfig | None = None  # the candidate that passed there
    buckets: dict | None = None         # attainment per prompt-length bucket at the best rate (asap.measure.buckets)
    criterion: str = "requests"
    num_screened: int = 0               # candidates the screen simulated (and, with vet, those only vetted)
    # "-sustained" with `longer`: the best's maximum on its search's requests, before the confirmation on
    # num_requests (CONFIRM x as many); None where no confirmation ran
    search_rate: float | None = None


def tune(requests: list[Request], engine: str, devices: int, model="deepseek-v3", hardware="cloudmatrix384", *,
         candidates: list[EngineConfig] | None = None, target: float = TARGET, zipf: float = 0.0,
         start_rate: float | None = None, refine: int = REFINE, verbose: bool = False,
         prefix_cache: bool = False, criterion: str = "requests", screen: bool | None = None,
         cache: dict | None = None, executor: Executor | None = None, progress: Progress | None = None,
         fleet_fractions: tuple[float, ...] = FLEET_FRACTIONS, longer: list[Request] | None = None,
         vet: bool = False) -> Tuned:
    """Best configuration of `engine` for `requests` (with deadlines) on `devices` devices.
    start_rate: where the first search starts (req/s; default: from a closed batch).
    prefix_cache: every candidate (given or from `space`) runs with the prefix cache on.
    criterion: "requests" (>= target of all requests within SLO) or "every-bucket" (>= target in every
    prompt-length bucket, asap.measure.buckets), or either with "-sustained" (and drained in time).
    screen: screen the candidates before the rate searches (default: when there are more than FINALISTS).
    cache: a dict shared by calls on the same requests (e.g. both criteria): simulations are not repeated.
    executor (asap.studies.parallel): runs the screen's simulations and the fine searches side by side; the
    result is the same as a serial run's (default). progress: prints a line per simulation (to stderr).
    fleet_fractions: the wide group's shares the length-aware fleets of the space try (asap.studies.tune.space).
    longer: the same workload continued (more requests, the first len(requests) of them `requests`); under a
    "-sustained" criterion each refined maximum found on n requests is confirmed on its first CONFIRM x n
    (`_confirm`), and the best confirmed one wins. Ignored under the other criteria.
    vet: with `longer` under a "-sustained" criterion, the screen's leaders are re-ranked on the confirmation
    sample before the finalists are chosen (`_vet`; with the space's candidates, the secondary variants of the
    SCREEN_KEEP best vetted are then vetted too), and every finalist is searched on that sample from its
    vetted bracket and confirmed on CONFIRM x as many (where `longer` has them): the short screen can rank a
    candidate whose queue grows slowly above one that sustains more, and understate one the longer sample
    shows sustaining more."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    key = CRITERIA[criterion]
    if not requests or any(r.deadline is None for r in requests):
        raise ValueError("tune needs requests with deadlines (asap.workload.slo.SLO.apply)")
    confirm = longer is not None and criterion.endswith("-sustained")
    if confirm and (len(longer) <= len(requests) or any(r.deadline is None for r in longer)
                    or any((a.arrival, a.num_tokens) != (b.arrival, b.num_tokens) for a, b in zip(requests, longer))):
        raise ValueError("longer must continue `requests` (the same workload, more of it, with deadlines)")
    prompt_len = token_weighted_length(requests)
    cands = candidates if candidates is not None else space(engine, devices, model, hardware, prompt_len, full=False,
                                                            fleet_fractions=fleet_fractions)
    if prefix_cache:
        cands = list(dict.fromkeys(dataclasses.replace(c, prefix_cache=True) for c in cands))
    if not cands:
        return Tuned(engine, devices, None, None, None, None, reason="no feasible configuration")
    sims = 0
    cache = {} if cache is None else cache
    ex = executor or Serial()

    def task(c: EngineConfig, n: int, rate: float) -> tuple:
        return ((longer if n > len(requests) else requests)[:n], rate, engine, model, hardware, devices, c, zipf,
                progress)

    def measure_for(c: EngineConfig, n: int):
        def measure(rate: float) -> dict:
            nonlocal sims
            k = (engine, devices, c, n, round(rate, 9), zipf)
            if k not in cache:
                sims += 1
                cache[k] = _simulate(task(c, n, rate))
            return cache[k]
        return measure

    def prefetch(points) -> None:
        """Simulate the (candidate, n, rate) points not cached yet side by side (measure then finds them)."""
        nonlocal sims
        todo = {}
        for c, n, rate in points:
            k = (engine, devices, c, n, round(rate, 9), zipf)
            if k not in cache and k not in todo:
                todo[k] = task(c, n, rate)
        for k, summary in zip(todo, ex.map(_simulate, todo.values())):
            cache[k] = summary
            sims += 1

    def searches(jobs) -> list[dict]:
        """Rate searches (find_max_rate), one per (candidate, n, keyword arguments), side by side: each runs
        whole in a worker with the cached simulations of its candidate on n requests, and hands back its
        answer and the simulations it added (the same a serial run makes)."""
        nonlocal sims
        out = []
        for (c, n, kw), (found, added) in zip(jobs, ex.map(_search, [
                (task(c, n, kw["lo"]), {k: v for k, v in cache.items() if k[:4] == (engine, devices, c, n)}, kw)
                for c, n, kw in jobs])):
            out.append(found)
            cache.update(added)
            sims += len(added)
        return out

    def burst_of(n: int) -> float:
        pool = longer if n > len(requests) else requests
        return burst_limit(n, sum(r.deadline - r.arrival for r in pool[:n]) / n)

    screened: dict = {}
    start = start_rate
    vetted = 0          # with vet: the vet's sample size, on which every finalist is searched
    if screen if screen is not None else len(cands) > FINALISTS:
        if start is None:
            start = _closed_batch_rate(requests, engine, devices, model, hardware, cands[0], zipf)
            sims += 1
        screened = _screen(cands, measure_for, burst_of, len(requests), start, target, key, prefetch)
        if candidates is None:      # the secondary knobs of the best primary candidates (asap.studies.tune.space)
            more = [v for c in list(screened)[:SCREEN_KEEP] for v in secondary(c) if v not in screened]
            if prefix_cache:
                more = [dataclasses.replace(v, prefix_cache=True) for v in more]
            screened.update(_screen(more, measure_for, burst_of, len(requests), start, target, key, prefetch))
            screened = dict(sorted(screened.items(), key=lambda kv: kv[1]["score"], reverse=True))
        if vet and confirm:     # the screen's leaders re-ranked on the confirmation sample, finalists searched there
            m = min(len(longer), CONFIRM * max(s["n"] for s in screened.values()))
            screened = _vet(screened, measure_for, m, target, key, prefetch, burst=burst_of(m))
            if candidates is None:  # and the secondary knobs of the vetted best, vetted alike
                more = [v for c in list(screened)[:SCREEN_KEEP] for v in secondary(c) if v not in screened]
                if prefix_cache:
                    more = [dataclasses.replace(v, prefix_cache=True) for v in more]
                screened = _vet(screened, measure_for, m, target, key, prefetch, more=more,
                                burst=burst_of(m))
            vetted = m
        cands = list(screened)[:FINALISTS]
        passed = [s["passed_rate"] for s in screened.values() if s["passed_rate"]]
        start = max(passed) if passed else start
    rows = []
    if vetted:      # each finalist searched on the vet's sample from its vetted bracket, side by side
        jobs = []
        for c in cands:
            sc = screened[c]
            lo = sc.get("vet_rate") or sc["passed_rate"] or 0.5 * start
            hi = sc.get("vet_hi")
            jobs.append((c, vetted, dict(target=target, lo=lo, hi=hi if hi and hi > lo else None, tol=FINE_TOL,
                                         max_iters=10, burst_above=burst_of(vetted), key=key)))
        for c, found in zip(cands, searches(jobs)):
            rows.append({"config": c, "coarse": found, "fine": found, "n": vetted, "vetted": True})
    for c in cands if not vetted else ():
        if start is None:
            cap = _closed_batch_rate(requests, engine, devices, model, hardware, c, zipf) * 2
            sims += 1
        else:
            cap = 2 * start
        n = len(requests)
        while n > 64 and burst_of(n // 2) >= (start or cap):
            n //= 2
        lo = min(start or 0.5 * cap, 0.5 * burst_of(n))
        while True:
            found = find_max_rate(measure_for(c, n), target=target, lo=lo, tol=COARSE_TOL, max_iters=10,
                                  burst_above=burst_of(n), key=key)
            if found["valid"] or "burst" not in (found["reason"] or "") or n >= len(requests):
                break
            n = min(len(requests), 2 * n)
        rows.append({"config": c, "coarse": found, "n": n})
        if found["valid"]:
            start = max(start or 0.0, found["max_slo_rate"])
    ranked = sorted((r for r in rows if r["coarse"]["valid"] and not r.get("vetted")),
                    key=lambda r: -r["coarse"]["max_slo_rate"])
    fine = [(r["config"], r["n"], dict(target=target, lo=r["coarse"]["max_slo_rate"],
                                       hi=r["coarse"]["max_slo_rate"] * (1 + COARSE_TOL), tol=FINE_TOL, max_iters=8,
                                       burst_above=burst_of(r["n"]), key=key)) for r in ranked[:refine]]
    for r, found in zip(ranked[:refine], searches(fine)):
        r["fine"] = found
    valid = [r for r in rows if r.get("fine", {}).get("valid")]
    table = [{"config": dataclasses.asdict(r["config"]), "describe": r["config"].describe(devices),
              "coarse_rate": r["coarse"]["max_slo_rate"] if r["coarse"]["valid"] and not r.get("vetted") else None,
              "coarse_reason": r["coarse"]["reason"], "num_requests": r["n"],
              "fine_rate": r["fine"]["max_slo_rate"] if r.get("fine", {}).get("valid") else None,
              **_screen_cols(screened.get(r["config"]))} for r in rows]
    table += [{"config": dataclasses.asdict(c), "describe": c.describe(devices), "coarse_rate": None,
               "coarse_reason": "screened out", "num_requests": sc["n"], "fine_rate": None, **_screen_cols(sc)}
              for c, sc in screened.items() if c not in cands]
    if verbose:
        for t in table:
            print(f"[SIMULATED]   {t['describe']:<60} coarse {_rate(t['coarse_rate'])} fine {_rate(t['fine_rate'])}"
                  + (f" ({t['coarse_reason']})" if t["coarse_reason"] else ""), flush=True)
    if not valid:
        reasons = sorted({r["coarse"]["reason"] for r in rows if r["coarse"]["reason"]})
        passed = [r for r in rows if r["coarse"]["max_slo_rate"]]     # a rate it passed at: a lower bound
        top = max(passed, key=lambda r: r["coarse"]["max_slo_rate"]) if passed else None
        return Tuned(engine, devices, None, None, None, None, table, sims,
                     num_requests=top["n"] if top else None,
                     lower_bound=top["coarse"]["max_slo_rate"] if top else None,
                     lower_bound_config=top["config"] if top else None, num_screened=len(screened),
                     reason="no candidate has a valid rate: " + "; ".join(reasons))
    best = max(valid, key=lambda r: r["fine"]["max_slo_rate"])
    # A search that is not valid still passed at its highest rate: a lower bound on that candidate's maximum.
    # Where one reaches the best certified maximum, these requests cannot tell which candidate is best, and
    # naming the certified one would report a weaker configuration (and rate) as the engine's best.
    unranked = [r for r in rows if not r["coarse"]["valid"]
                and (r["coarse"]["max_slo_rate"] or 0.0) >= best["fine"]["max_slo_rate"]]
    if unranked:
        top = max(unranked, key=lambda r: r["coarse"]["max_slo_rate"])
        return Tuned(engine, devices, None, None, None, None, table, sims, num_requests=top["n"],
                     lower_bound=top["coarse"]["max_slo_rate"], lower_bound_config=top["config"],
                     num_screened=len(screened), reason=f"{top['config'].describe(devices)} still passes at {top['coarse']['max_slo_rate']:.3g} "
                            f"req/s, at or above the best certified maximum ({best['fine']['max_slo_rate']:.3g} req/s, "
                            f"{best['config'].describe(devices)}), and its search is not valid "
                            f"({top['coarse']['reason']}): more requests are needed to rank them")
    search_rate, pool = None, requests
    if confirm:
        jobs, ms = [], []
        for r in valid:
            m = max(r["n"], min(len(longer), CONFIRM * r["n"]))
            pool, ms = longer, ms + [m]
            # searched on all of `longer` (the vet's sample can be): nothing longer to confirm it on
            jobs.append(None if m == r["n"] else
                        ((longer[:m], r["fine"]["max_slo_rate"], engine, model, hardware, devices, r["config"], zipf,
                          progress), dict(target=target, tol=FINE_TOL, max_iters=10, key=key, burst_above=burst_of(m))))
        confirmed = iter(ex.map(_confirm, [j for j in jobs if j is not None]))
        for r, m, job in zip(valid, ms, jobs):
            found, added = next(confirmed) if job is not None else (dict(r["fine"], held=True), {})
            r["confirmed"], r["m"] = found, m
            cache.update(added)
            sims += len(added)
        for t in table:
            for r in valid:
                if t["config"] == dataclasses.asdict(r["config"]):
                    t["sustained_rate"] = r["confirmed"]["max_slo_rate"] if r["confirmed"]["valid"] else None
                    t["sustained_num_requests"] = r["m"]
        held = [r for r in valid if r["confirmed"]["valid"]]
        if not held:
            return Tuned(engine, devices, None, None, None, None, table, sims, num_screened=len(screened),
                         reason="no refined maximum is sustained on " + ", ".join(
                             f"{r['m']} requests ({r['config'].describe(devices)}: {r['confirmed']['reason']})"
                             for r in valid))
        best = max(held, key=lambda r: r["confirmed"]["max_slo_rate"])
        search_rate = best["fine"]["max_slo_rate"]
        rate, n = best["confirmed"]["max_slo_rate"], best["m"]
        at_best = cache[(engine, devices, best["config"], n, round(rate, 9), zipf)]    # _confirm simulated it
    else:
        rate, n = best["fine"]["max_slo_rate"], best["n"]
        at_best = measure_for(best["config"], n)(rate)
    p90 = at_best["ttft_p90_ms"]
    mean_tokens = sum(r.num_tokens for r in pool[:n]) / n      # cached tokens count as served input
    return Tuned(engine, devices, best["config"], rate, None if p90 is None else p90 / 1e3,
                 rate * mean_tokens / devices, table, sims, num_requests=n,
                 prefix_hit_rate=at_best.get("prefix_token_hit_rate"), buckets=at_best["buckets"],
                 criterion=criterion, num_screened=len(screened), search_rate=search_rate)


def _simulate(task: tuple) -> dict:
    """One simulation of a search, the summary it is ranked by (a module-level function: an executor's task)."""
    reqs, rate, engine, model, hardware, devices, c, zipf, progress = task
    res = run(at_rate(reqs, rate), c.spec(model, hardware, devices, zipf=zipf))
    out = summarize(res.results)
    out["buckets"] = by_length(res.results)
    out |= pass_values(res.results, out["slo_attainment"])
    if "prefix_cache" in res.stats:
        out["prefix_token_hit_rate"] = res.stats["prefix_cache"]["token_hit_rate"]
    if progress is not None:
        within, worst = out["slo_attainment"], out["min_bucket_attainment"]
        progress(f"{c.describe(devices)}: {rate:.4g} req/s, {len(reqs)} requests -> "
                 + ("-" if within is None else f"{within:.1%} within SLO")
                 + ("" if worst is None else f", worst length bucket {worst:.1%}"))
    return out


def _search(job: tuple) -> tuple[dict, dict]:
    """One rate search (find_max_rate) of one candidate, from the simulations `cached` for it: its answer and
    the simulations it added, keyed as tune caches them."""
    task, cached, kw = job
    reqs, _, engine, model, hardware, devices, c, zipf, progress = task
    added: dict = {}

    def measure(rate: float) -> dict:
        k = (engine, devices, c, len(reqs), round(rate, 9), zipf)
        if k not in cached and k not in added:
            added[k] = _simulate((reqs, rate, *task[2:]))
        return cached[k] if k in cached else added[k]
    return find_max_rate(measure, **kw), added


def _confirm(job: tuple) -> tuple[dict, dict]:
    """A refined maximum on CONFIRM x its search's requests (an executor's task): `task` simulates the longer
    sample; where it passes at the rate found, that rate stands ("held"), else the maximum is searched for
    below it on the longer sample (find_max_rate, `kw`). Returns the answer and the simulations added."""
    task, kw = job
    reqs, rate, engine, model, hardware, devices, c, zipf, progress = task
    added: dict = {}

    def measure(r: float) -> dict:
        k = (engine, devices, c, len(reqs), round(r, 9), zipf)
        if k not in added:
            added[k] = _simulate((reqs, r, *task[2:]))
        return added[k]
    first = measure(rate)
    if first[kw["key"]] >= kw["target"]:
        return {"max_slo_rate": rate, "points": [(rate, first)], "valid": True, "reason": None, "held": True}, added
    return dict(find_max_rate(measure, lo=rate / (1 + COARSE_TOL), hi=rate, **kw), held=False), added


def _screen(cands, measure_for, burst_of, num_requests: int, rate: float, target: float, key: str,
            prefetch=None) -> dict:
    """{candidate: {"score", "passed_rate", "rate", "attainment", "ttft_p90_ms", "n"}}, best first.

    The screen (the same rule for both engines): every candidate is simulated once at `rate` on the first n
    requests (n: as few as keep SCREEN_MAX_RAISE x `rate` below the burst limit). While more than
    SCREEN_KEEP candidates pass, the passing ones are simulated again at SCREEN_STEP x the rate (never
    above the burst limit); where a raise leaves none passing, they are tried halfway back; where none
    passes the first time, all are screened again at half the rate (at most SCREEN_ROUNDS more rounds in
    all). Where more than SCREEN_KEEP still pass at the burst limit of n requests, n cannot rank them: the
    passing ones go on with 2n requests (as the rate search does), up to all of them. Score: the highest
    screened rate passed, then attainment and P90 TTFT at the last rate tried."""
    if not cands:
        return {}
    n = num_requests
    while n > 64 and burst_of(n // 2) >= rate * SCREEN_MAX_RAISE:
        n //= 2
    limit = burst_of(n)
    rate = min(rate, limit)
    out: dict = {}
    pool, passed_at = list(cands), None       # passed_at: the last rate some of the pool passed at
    rounds = SCREEN_ROUNDS + 1 + max(0, math.ceil(math.log2(num_requests / n)))   # and a round per doubling of n
    for _ in range(rounds):
        if prefetch is not None:
            prefetch([(c, n, rate) for c in pool])
        for c in pool:
            s = measure_for(c, n)(rate)
            ok = s[key] >= target
            prev = out[c]["passed_rate"] if c in out else None
            out[c] = {"passed_rate": rate if ok else prev, "rate": rate, "attainment": s[key],
                      "ttft_p90_ms": s["ttft_p90_ms"], "n": n}
        passing = [c for c in pool if out[c]["rate"] == rate and out[c]["attainment"] >= target]
        if not passing:
            if passed_at is None:
                rate /= 2                         # the first rate was too high for all: start lower
            else:
                rate = (passed_at + rate) / 2     # the raise went too far: halfway back, the same pool
            continue
        if len(passing) <= SCREEN_KEEP:
            break
        if rate >= limit:                 # a tie at the burst limit: more requests to rank them, if there are
            if n >= num_requests:
                break
            n = min(num_requests, 2 * n)
            limit = burst_of(n)
        pool, passed_at, rate = passing, rate, min(limit, rate * SCREEN_STEP)
    for v in out.values():
        v["score"] = (v["passed_rate"] or 0.0, v["attainment"], -(v["ttft_p90_ms"] or float("inf")))
    return dict(sorted(out.items(), key=lambda kv: kv[1]["score"], reverse=True))


VET_MOST, VET_DEPTH = 32, 2    # the screen's leaders re-ranked on the confirmation sample; bisection steps


def _vet(screened: dict, measure_for, m: int, target: float, key: str, prefetch=None, more=(),
         burst: float | None = None) -> dict:
    """The screen re-ranked on m requests (measure_for(c, m): the confirmation sample), for a "-sustained"
    criterion.

    The screen ranks on a short sample, where a rate at which a queue grows slowly (a length-aware fleet's
    long prompts on too few devices) still passes: on the conversation trace at 32 dies it put a half-wide
    async fleet (2.46 req/s sustained on 1,500 requests) far above a 5/8-wide one (2.74). So the leaders, the
    candidates that passed at least 1/SCREEN_STEP of the highest rate screened (at most VET_MOST, in screen
    order), are each bisected VET_DEPTH times between that rate and the highest, on the longer sample, and
    ranked first by the highest rate of that grid they pass, then by their value at the rate above it; the
    rest follow in screen order. Leaders that pass the whole grid would tie there (in screen order, the order
    the vet exists to distrust): while more than FINALISTS do, the grid is raised for them, to the highest
    screened rate and then SCREEN_STEP x each rate passed (at most SCREEN_ROUNDS times, never above `burst`,
    the burst limit of m requests). The same rule for both engines. Each leader's entry gets vet_rate, the
    lower end of its bracket: the highest vetted rate it passed, or the bracket's floor (hi / SCREEN_STEP, not
    simulated on the longer sample) where it passed none; vet_hi, the upper end (the lowest vetted rate it
    failed, or the next rate of the grid where it failed none); and vet_requests = m.
    more: candidates the screen did not simulate (the secondary variants of the vetted best), vetted as leaders
    on the same grid and ranked with them; their screen columns are None. A leader vetted before is not
    simulated again (its grid is the same, and measure_for's cache holds it)."""
    passed = [s["passed_rate"] for s in screened.values() if s["passed_rate"]]
    if not passed:
        return screened
    hi = max(passed)
    lo = hi / SCREEN_STEP
    more = [c for c in dict.fromkeys(more) if c not in screened]
    screened = screened | {c: {"score": None, "passed_rate": None, "rate": None, "attainment": None,
                               "ttft_p90_ms": None, "n": m} for c in more}
    leaders = [c for c, s in screened.items() if (s["passed_rate"] or 0.0) >= lo][:VET_MOST] + more
    bounds = {c: (lo, hi) for c in leaders}          # each leader's maximum lies in [lo, hi) as far as known
    value = {}                                       # its value at its upper bound's rate, once simulated
    for _ in range(VET_DEPTH):
        mids = {c: math.sqrt(a * b) for c, (a, b) in bounds.items()}
        if prefetch is not None:
            prefetch([(c, m, r) for c, r in mids.items()])
        for c, r in mids.items():
            v = measure_for(c, m)(r)[key]
            if v >= target:
                bounds[c] = (r, bounds[c][1])
            else:
                bounds[c], value[c] = (bounds[c][0], r), v
    # Leaders that passed the whole grid tie (their upper end untested) and would keep the short screen's
    # order, the order the vet exists to distrust: while more than FINALISTS share the top, they are simulated
    # at their upper end, and those passing there at SCREEN_STEP x it, up to the burst limit of m requests.
    for _ in range(SCREEN_ROUNDS):
        top = max(a for a, _ in bounds.values())
        tied = [c for c in leaders if bounds[c][0] == top and c not in value]
        if len(tied) <= FINALISTS:
            break
        rate = bounds[tied[0]][1] if burst is None else min(bounds[tied[0]][1], burst)    # the same for all tied
        if rate <= top:
            break
        if prefetch is not None:
            prefetch([(c, m, rate) for c in tied])
        for c in tied:
            v = measure_for(c, m)(rate)[key]
            if v >= target:
                bounds[c] = (rate, rate * SCREEN_STEP)
            else:
                bounds[c], value[c] = (top, rate), v
    order = sorted(leaders, key=lambda c: (bounds[c][0], value.get(c, 0.0)), reverse=True)
    for c in leaders:
        screened[c] = dict(screened[c], vet_rate=bounds[c][0], vet_hi=bounds[c][1], vet_requests=m)
    return {c: screened[c] for c in order} | {c: s for c, s in screened.items() if c not in bounds}


def _screen_cols(sc: dict | None) -> dict:
    if sc is None:
        return {"screen_rate": None, "screen_attainment": None, "screen_passed_rate": None}
    return {"screen_rate": sc["rate"], "screen_attainment": sc["attainment"], "screen_passed_rate": sc["passed_rate"],
            **({"vet_rate": sc["vet_rate"]} if "vet_rate" in sc else {})}


def _closed_batch_rate(requests, engine, devices, model, hardware, c: EngineConfig, zipf: float) -> float:
    """Half the rate a closed batch of the first requests (all arriving at 0) drains at: a search start."""
    sample = [dataclasses.replace(r, arrival=0.0, deadline=None) for r in requests[:max(2 * devices, 64)]]
    res = run(sample, c.spec(model, hardware, devices, zipf=zipf))
    return 0.5 * len(sample) / max(r.ttft for r in res.results)


def _rate(x) -> str:
    return f"{x:8.3f}" if x is not None else "       -"
