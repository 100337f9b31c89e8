"""`asap ablation`: each optimization on and off, and the sync baseline, on one workload.

Rows (async rows share one A:E layout):
    sync baseline              DP+EP, two-batch overlap, round-robin, fcfs, no redundant experts
    sync + policies            the same with every policy that also applies to sync
    async plain                round-robin, fcfs, k=1 micro-batch, oldest-first, no window,
                               no redundant experts, no admission
    async plain + <one>        one optimization on (OPTIMIZATIONS)
    async all on               every optimization on (k = adaptive depth)
    async all on - <one>       with --leave-one-out: every optimization but one
Per row: SLO-compliant throughput (highest rate with >= 90% of requests within their TTFT SLO,
asap.measure.rate_search.find_max_rate) and P90 TTFT / attainment at one reference rate for all rows
(default: the plain async row's SLO-compliant rate).

Backends: "sim" (default; the discrete-event simulator, SIMULATED, deterministic for a seed) and
"emulated" (the real multi-process runtime, compute replaced by cost-model waits x dilation;
EMULATED, wall-clock, not deterministic). The simulator has no admission of its own: here a router
wrapper applies SLOAdmission's demote mode at arrival, as the runtime's engine does.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from asap.measure.metrics import summarize
from asap.measure.rate_search import find_max_rate
from asap.pipeline.plan import token_weighted_length
from asap.scheduler.admission import SLOAdmission
from asap.scheduler.expert_select import make_selector
from asap.scheduler.router import QueueAwareRouter, make_router
from asap.sim.cost import CostModel
from asap.studies.experiments import TRACE, at_rate
from asap.sim.hardware import get_hardware
from asap.studies.plan import apply_slo, start_rate, unbounded, workload_requests
from asap.sim.run import balanced_split, get_model, run


@dataclass(frozen=True)
class Policies:
    router: str = "round-robin"
    order: str = "fcfs"
    microbatches: "int | str" = 1      # micro-batches per replica step, or "adaptive" (AdaptiveDepth)
    selector: str = "oldest"           # expert work selection
    window: bool = False               # aggregation window (Settings.window_ms) around the selector
    redundant: bool = False            # Settings.redundant extra expert copies per layer (EPLB-style)
    admission: bool = False            # SLO admission, demote mode


@dataclass(frozen=True)
class Optimization:
    name: str
    label: str
    on: dict          # applied to the plain policies
    off: dict         # applied to "all on" to leave this one out


OPTIMIZATIONS = (
    Optimization("queue-aware", "queue-aware routing", {"router": "queue-aware"}, {"router": "round-robin"}),
    Optimization("edf", "EDF replica order", {"order": "edf"}, {"order": "fcfs"}),
    Optimization("ping-pong", "micro-batch ping-pong (k=2)", {"microbatches": 2}, {"microbatches": 1}),
    Optimization("adaptive-depth", "adaptive depth (k=2..4)", {"microbatches": "adaptive"}, {"microbatches": 2}),
    Optimization("deadline-first", "deadline-first expert selection", {"selector": "deadline"},
                 {"selector": "oldest"}),
    Optimization("aggregation-window", "expert aggregation window", {"window": True}, {"window": False}),
    Optimization("redundant-experts", "redundant experts (EPLB)", {"redundant": True}, {"redundant": False}),
    Optimization("admission", "SLO admission (demote)", {"admission": True}, {"admission": False}),
)
PLAIN = Policies()
ALL_ON = Policies("queue-aware", "edf", "adaptive", "deadline", True, True, True)
SYNC_ON = dataclasses.replace(PLAIN, router="queue-aware", order="edf", redundant=True, admission=True)


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    engine: str
    policies: Policies


def configs(leave_one_out: bool = False) -> list[Config]:
    rows = [Config("sync", "sync baseline", "sync", PLAIN),
            Config("sync+policies", "sync + queue-aware, EDF, redundant experts, admission", "sync", SYNC_ON),
            Config("plain", "async plain", "async", PLAIN)]
    rows += [Config(f"+{o.name}", f"async plain + {o.label}", "async", dataclasses.replace(PLAIN, **o.on))
             for o in OPTIMIZATIONS]
    rows.append(Config("all", "async all on", "async", ALL_ON))
    if leave_one_out:
        rows += [Config(f"all-{o.name}", f"async all on - {o.label}", "async", dataclasses.replace(ALL_ON, **o.off))
                 for o in OPTIMIZATIONS]
    return rows


@dataclass(frozen=True)
class Settings:
    backend: str = "sim"
    model: str = "deepseek-v3"
    hardware: str = "cloudmatrix384"
    devices: int = 32                  # sync ranks; async A + E
    attention_workers: int | None = None   # None: the cost model's balance (asap.sim.run.balanced_split)
    workload: str = "trace"            # trace | poisson | gamma arrivals, Mooncake conversation lengths
    num_requests: int = 300
    seed: int = 0                      # arrivals (poisson, gamma) and the Zipf expert skew
    slo: str = "5x"                    # an asap.workload.slo spec: 5x or a time budget (asap.studies.plan.apply_slo)
    max_prompt: int | None = 32768     # clip prompt lengths (the trace's tail reaches 126K tokens)
    length_scale: float = 1.0
    zipf: float = 1.0                  # sim: expert popularity skew (0 = uniform); the runtime routes uniformly
    redundant: int = 32                # extra expert copies per layer when on (rounded up to fill equal slots)
    window_ms: float = 1.0             # aggregation window when on
    admission_slack: float = 2.0
    token_budget: int = 16384
    target: float = 0.9
    tolerance: float = 0.05
    max_iters: int = 12
    ref_rate: float | None = None      # req/s for the P90 column; None: the plain async row's SLO rate
    dilation: float = 1.0              # emulated: op time multiplier
    trace: str = str(TRACE)

    def __post_init__(self):
        if self.backend not in ("sim", "emulated"):
            raise ValueError(f"backend must be sim or emulated, got {self.backend!r}")


SIM = Settings()
EMULATED = Settings(backend="emulated", model="small-deepseek-v3", hardware="h800", devices=4, attention_workers=2,
                    workload="poisson", num_requests=24, max_prompt=4096, length_scale=0.25, zipf=0.0, redundant=2, window_ms=2.0,
                    token_budget=2048, tolerance=0.25, max_iters=5, dilation=50.0)


def fill_slots(num_experts: int, workers: int, at_least: int) -> int:
    """Fewest extra copies >= at_least that give every worker the same number of expert slots."""
    return at_least + (-(num_experts + at_least)) % workers


class AdmittingRouter:
    """Routes with `inner`, then applies SLO admission (demote) with the queue-aware predictor:
    the simulator's stand-in for the engine's admission step (asap/engine/runtime.py submit)."""

    def __init__(self, inner, admission: SLOAdmission, predictor: QueueAwareRouter):
        self.inner, self.admission, self.predictor = inner, admission, predictor

    def route(self, req, loads, now: float) -> int:
        i = self.inner.route(req, loads, now)
        load = next(l for l in loads if l.index == i)
        self.admission.admit(req, self.predictor.predict(req, load, now) - now, now)
        return i


def sim_kwargs(p: Policies, engine: str, s: Settings, cost, expert_workers: int) -> dict:
    """Keyword arguments for asap.sim.run.run: fresh policy objects (they keep state) for one run."""
    router = make_router(p.router, cost.replica_cost_fn())
    if p.admission:
        router = AdmittingRouter(router, SLOAdmission("demote", s.admission_slack),
                                 QueueAwareRouter(cost.replica_cost_fn()))
    E = cost.model.num_experts
    kw = dict(router=router, order=p.order, token_budget=s.token_budget, zipf=s.zipf, seed=s.seed,
              redundant_experts=fill_slots(E, expert_workers, s.redundant if p.redundant else 0))
    if engine == "sync":
        return dict(kw, two_batch_overlap=True)
    selector = make_selector(p.selector, window_s=s.window_ms / 1000 if p.window else 0.0, max_batch_tokens=65536)
    return dict(kw, selector=selector, microbatches=p.microbatches)


def runtime_config(p: Policies, engine: str, s: Settings, attention_workers: int, num_experts: int):
    """The emulated engine's RuntimeConfig for these policies."""
    from asap.config import RuntimeConfig
    workers = s.devices if engine == "sync" else s.devices - attention_workers
    k = p.microbatches
    return RuntimeConfig(attention_workers=attention_workers, expert_workers=s.devices - attention_workers,
                         devices=s.devices, token_budget=s.token_budget,
                         microbatches=2 if engine == "sync" or k == "adaptive" else k, adaptive_depth=k == "adaptive",
                         router=p.router, order=p.order, selector=p.selector,
                         aggregation_window_ms=s.window_ms if p.window else 0.0,
                         redundant_experts=fill_slots(num_experts, workers, s.redundant) if p.redundant else 0,
                         admission="demote" if p.admission else "off", admission_slack=s.admission_slack,
                         compute="emulated", hardware=s.hardware, dilation=s.dilation)


def requests_for(s: Settings) -> list:
    """The workload with deadlines, in hardware time (an emulated target dilates it itself)."""
    reqs = workload_requests(s.workload, s.num_requests, s.seed, s.trace)
    if s.max_prompt is not None or s.length_scale != 1.0:
        reqs = [dataclasses.replace(r, num_tokens=max(16, min(round(r.num_tokens * s.length_scale),
                                                              s.max_prompt or r.num_tokens))) for r in reqs]
    return apply_slo(reqs, s.slo, s.model, s.hardware, s.devices, s.token_budget)


class SimBackend:
    label = "SIMULATED"

    def __init__(self, s: Settings, requests, sim=None):
        self.s, self.sim = s, sim or run
        self.cost = CostModel(get_model(s.model), get_hardware(s.hardware))
        prompt_len = token_weighted_length(requests)
        self.attention_workers = s.attention_workers or balanced_split(self.cost, s.devices, s.token_budget, 2,
                                                                       prompt_len)

    def open(self, c: Config):
        """measure(requests) -> results for one row, and a closer."""
        s, A = self.s, self.attention_workers
        workers = s.devices if c.engine == "sync" else s.devices - A

        def measure(requests):
            kw = sim_kwargs(c.policies, c.engine, s, self.cost, workers)
            return self.sim(requests, c.engine, s.model, s.hardware, s.devices,
                            A if c.engine == "async" else None, **kw).results
        return measure, lambda: None

    def start_rate(self, requests) -> float:
        return start_rate(self.sim, requests, "async", self.s.model, self.s.hardware, self.s.devices,
                          self.attention_workers, token_budget=self.s.token_budget)


class EmulatedBackend:
    label = "EMULATED"

    def __init__(self, s: Settings, requests):
        from asap.bench.targets import model_config
        self.s, self.sim_backend = s, SimBackend(dataclasses.replace(s, backend="sim"), requests)
        self.attention_workers = self.sim_backend.attention_workers
        self.num_experts = model_config(s.model).num_experts

    def open(self, c: Config):
        from asap.bench.targets import EngineTarget
        rt = runtime_config(c.policies, c.engine, self.s, self.attention_workers, self.num_experts)
        target = EngineTarget(c.engine, self.s.model, rt, progress=False, timeout=600.0)
        return target.run, target.close

    def start_rate(self, requests) -> float:
        return self.sim_backend.start_rate(requests)


def ablation(s: Settings = SIM, leave_one_out: bool = False, sim=None, log=None) -> dict:
    """Every configuration's SLO-compliant throughput and P90 TTFT at one reference rate.

    Returns {"label", "settings", "attention_workers", "expert_workers", "ref_rate", "wall_s",
    "rows": [{ROW_KEYS}...]} with rows in `configs` order. `sim` stands in for asap.sim.run.run."""
    t0 = time.perf_counter()
    requests = requests_for(s)
    backend = SimBackend(s, requests, sim) if s.backend == "sim" else EmulatedBackend(s, requests)
    rows = configs(leave_one_out)
    tokens_per_request = sum(r.num_tokens for r in requests) / len(requests)
    lo = backend.start_rate(requests)
    ref = s.ref_rate
    out: dict[str, dict] = {}
    # plain async first: its SLO rate is the default reference rate for every row
    for c in sorted(rows, key=lambda c: c.name != "plain"):
        measure_results, close = backend.open(c)
        try:
            def measure(rate: float) -> dict:
                return summarize(measure_results(at_rate(requests, rate)))
            found = find_max_rate(measure, target=s.target, lo=lo, tol=s.tolerance, max_iters=s.max_iters)
            if ref is None:
                ref = found["max_slo_rate"] or min(rate for rate, _ in found["points"])
            at_ref = dict(found["points"]).get(ref) or measure(ref)
        finally:
            close()
        rate = found["max_slo_rate"]
        out[c.name] = {"name": c.name, "label": c.label, "engine": c.engine,
                       "policies": dataclasses.asdict(c.policies), "max_slo_rate": rate,
                       "tokens_per_s_per_device": rate * tokens_per_request / s.devices,
                       "converged": found["converged"], "unbounded": unbounded(found), "ref_rate": ref,
                       "ttft_p90_ms_at_ref": at_ref["ttft_p90_ms"], "attainment_at_ref": at_ref["slo_attainment"],
                       "points": [{"rate": r, "slo_attainment": m["slo_attainment"], "ttft_p90_ms": m["ttft_p90_ms"]}
                                  for r, m in found["points"]]}
        if log:
            log(f"[{backend.label}] {c.label}: {rate:.3f} req/s")
    plain = out["plain"]["max_slo_rate"]
    for row in out.values():
        row["vs_plain"] = row["max_slo_rate"] / plain if plain else None
    A = backend.attention_workers
    return {"label": backend.label, "settings": dataclasses.asdict(s), "leave_one_out": leave_one_out,
            "attention_workers": A, "expert_workers": s.devices - A, "num_requests": len(requests),
            "mean_prompt_tokens": tokens_per_request, "ref_rate": ref, "wall_s": time.perf_counter() - t0,
            "rows": [out[c.name] for c in rows]}


ROW_KEYS = ("name", "label", "engine", "policies", "max_slo_rate", "tokens_per_s_per_device", "converged",
            "unbounded", "ref_rate", "ttft_p90_ms_at_ref", "attainment_at_ref", "points", "vs_plain")
