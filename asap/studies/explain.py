"""`asap sim explain`: where the time of a simulated run goes, per die (every figure SIMULATED).

For one configuration (asap.studies.config.EngineConfig) at one rate, over a window of the run (by default the
middle third of the arrivals, at most WINDOW_S seconds: a steady state, and a bounded number of spans):
- every unit of dies gets busy / stall / idle seconds that add up to the window:
  - sync: a rank is one DP group (attention TP dies; it also holds 1/N of the experts). busy = its
    attention and expert compute; stall = inside a lock-step forward but not computing (waiting at the
    all-to-all barrier for other ranks, or for the collective); idle = no forward in flight.
  - async: an attention replica (attention TP dies): busy = attention compute; stall = inside one of its
    steps but not computing (waiting for its micro-batches to come back from the experts and the link);
    idle = no step in flight. The expert pool (E dies, which the simulator runs as one pool on each
    batch, its duration set by the most loaded die): busy = expert batches; stall = not busy while some
    replica has a step in flight (starved of work); idle = no step in flight anywhere.
- link time: sync, the collective stream's dispatch and combine time; async, each micro-batch's
  dispatch and combine over its replica's link at every MoE layer (latency + tokens x per-token time,
  the simulated exchange's own figures: asap.sim.exchange.SimExchange);
- expert batch sizes: tokens per expert batch (async: each pool batch; sync: the mean tokens of one
  micro-batch over all ranks, per lock-step forward), and the routed tokens per expert die;
- SLO attainment, overall and per prompt-length bucket (asap.measure.buckets).
A configuration of several independent instances is explained on its first instance (the instance
router's share of the requests). An async step ends when its last micro-batch's last expert batch ends
(the final combine's link time, tens of microseconds, counts as idle).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from asap.measure.buckets import by_length
from asap.measure.metrics import summarize
from asap.measure.sustain import by_arrival_third, drain
from asap.pipeline.plan import token_weighted_length
from asap.scheduler.expert_select import SELECTORS
from asap.scheduler.request import Request
from asap.sim.cost import CostModel
from asap.sim.events import Arrival
from asap.studies.bound import work_bound
from asap.studies.experiments import at_rate
from asap.sim.hardware import get_hardware
from asap.sim.run import build_engine, get_model, instance_tokens_per_s, split_instances, sync_fleet_parts
from asap.sim.simulator import Simulator
from asap.studies.config import EngineConfig
from asap.workload.slo import add_slo_flag, parse_slo

LABEL = "SIMULATED"
WINDOW_S = 30.0


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _clip(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(xs, ys) -> float:
    """Length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _account(busy, active, lo: float, hi: float) -> dict:
    """busy / stall / idle seconds in [lo, hi]: busy = `busy`; stall = `active` not busy; idle = the rest."""
    busy, active = _union(_clip(busy, lo, hi)), _union(_clip(active, lo, hi))
    b = _length(busy)
    stall = _length(active) - _overlap(busy, active)
    return {"busy_s": float(b), "stall_s": float(stall), "idle_s": float((hi - lo) - b - stall)}


def _steps(starts: list[float], spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Step intervals: each from a step's start to the last span end before the next step's start."""
    starts = sorted(set(starts))
    if not starts:
        return []
    ends = [s for s in starts]
    idx = np.searchsorted(np.asarray(starts), [a for a, _ in spans], side="right") - 1
    for k, (_, b) in zip(idx, spans):
        if k >= 0:
            ends[k] = max(ends[k], b)
    return list(zip(starts, ends))


def explain(requests: list[Request], config: EngineConfig, devices: int, rate: float, model="deepseek-v3",
            hardware="cloudmatrix384", window: tuple[float, float] | None = None) -> dict:
    """The breakdown of `config` serving `requests` (with deadlines) at `rate` req/s on `devices` devices.
    A sync length-aware fleet is two deployments (asap.sim.run.sync_fleet_parts): each is explained over the
    same window, under "deployments", with the fleet's overall attainment on top."""
    if not requests or any(r.deadline is None for r in requests):
        raise ValueError("explain needs requests with deadlines (asap.workload.slo.SLO.apply)")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 req/s, got {rate}")
    reqs = at_rate(requests, rate)
    instances = config.instances
    if devices % instances:
        raise ValueError(f"{instances} instances do not divide {devices} devices")
    per = devices // instances
    cfg, hw = get_model(model), get_hardware(hardware)
    prompt_len = token_weighted_length(reqs)
    if instances > 1:       # the first instance's share, as asap.sim.run routes it
        ranks = per // config.attention_tp if config.engine == "sync" or config.colocated \
            else (config.attention_workers or 1)
        tps = instance_tokens_per_s(CostModel(cfg, hw, attn_tp=config.attention_tp), ranks, config.token_budget,
                                    prompt_len)
        reqs = split_instances(reqs, instances, tps)[0]
    if window is None:
        t_a, t_b = reqs[0].arrival, reqs[-1].arrival
        mid = (t_a + t_b) / 2
        half = min(WINDOW_S, (t_b - t_a) / 3) / 2
        window = (mid - half, mid + half)
    lo, hi = window
    if not hi > lo:
        raise ValueError(f"window {window} is empty")
    one = dataclasses.replace(config, instances=1)        # the instance explained
    spec = one.spec(model, hardware, per, prompt_len=prompt_len, trace_window=(lo, hi))
    ceiling = work_bound(requests, devices, CostModel(cfg, hw))["ceiling"][devices]
    head = {"label": LABEL, "engine": config.engine, "devices": devices, "instances": instances,
            "explained_devices": per, "rate": rate, "num_requests": len(reqs), "ceiling": ceiling}
    if config.engine == "sync" and config.wide_replicas:
        parts = [_explain_engine(mine, part, lo, hi, cfg) | {"deployment": name, "describe": _deployment(part)}
                 for name, mine, part in sync_fleet_parts(reqs, spec) if mine]
        results = [x for p in parts for x in p.pop("results")]
        end = max(p.pop("end") for p in parts)
        return head | {"describe": config.describe(devices), "window": (lo, min(hi, end)),
                       "wall_s": min(hi, end) - lo, "summary": summarize(results), "buckets": by_length(results),
                       "by_arrival_third": by_arrival_third(results), "deployments": parts} | drain(results)
    x = _explain_engine(reqs, spec, lo, hi, cfg)
    x |= drain(x["results"])
    x["by_arrival_third"] = by_arrival_third(x.pop("results"))
    end = x.pop("end")
    if config.engine == "async" and config.attention_workers is None and not config.colocated:
        config = dataclasses.replace(config, attention_workers=x["attention_workers"])   # the balanced split
    return head | {"describe": config.describe(devices), "window": (lo, min(hi, end)), "wall_s": min(hi, end) - lo} | x


def _deployment(spec) -> str:
    return f"DP{spec.devices // spec.attention_tp} x TP{spec.attention_tp}, EP{spec.devices}, chunk {spec.token_budget}"


def _explain_engine(reqs: list[Request], spec, lo: float, hi: float, cfg) -> dict:
    """One engine (spec, traced over [lo, hi]) serving reqs: its results, end, summary, buckets, stats and
    the breakdown (units, link, expert batches)."""
    eng = build_engine(spec)
    # trace every rank / replica (the engines trace the first 8 by default, for Chrome traces)
    eng.trace_ranks = eng.trace_replicas = len(eng.schedulers)
    sim = Simulator(eng)
    for r in sorted(reqs, key=lambda r: r.arrival):
        sim.schedule(Arrival(r.arrival, r))
    end = sim.run()
    results = [eng.results[r.id] for r in reqs]
    hi = min(hi, end)
    out = {"results": results, "end": end, "num_requests": len(reqs), "summary": summarize(results),
           "buckets": by_length(results), "stats": eng.stats(), "attention_workers": len(eng.schedulers)}
    if spec.engine == "sync":
        return out | _sync(eng, eng.spans, lo, hi, spec.attention_tp)
    return out | _async(eng, eng.spans, lo, hi, spec, cfg)


def _sync(eng, spans, lo, hi, tp: int) -> dict:
    rank = [s for s in spans if s[0] == "rank"]
    net = [s for s in spans if s[0] == "network"]
    steps = _steps([s[3] for s in rank if s[2].startswith("attn L0 ")], [(s[3], s[4]) for s in rank + net])
    units = []
    for r in range(eng.num_ranks):
        mine = [(s[3], s[4]) for s in rank if s[1] == r]
        units.append({"unit": f"rank {r}", "role": "attention+experts", "dies": tp,
                      **_account(mine, steps, lo, hi)})
    link = _union(_clip([(s[3], s[4]) for s in net], lo, hi))
    st = eng.stats()
    mb_tokens = st["tokens"] / st["num_steps"] / eng.k if st["num_steps"] else 0.0
    dies = eng.num_ranks * tp
    return {"units": units, "link": {"busy_s": _length(link), "seconds": sum(s[4] - s[3] for s in net),
                                     "what": "the collective stream (dispatch + combine all-to-alls)"},
            "expert_batches": {"mean_tokens": mb_tokens, "what": "one micro-batch over all ranks, per forward",
                               "routed_tokens_per_die": mb_tokens * eng.model.top_k / dies}}


def _async(eng, spans, lo, hi, spec, cfg) -> dict:
    """An async engine's units; in a length-aware fleet the wide replicas (the last wide_replicas) are their
    own role, with their own TP."""
    attn = [s for s in spans if s[0] == "attention"]
    exp = [s for s in spans if s[0] == "experts"]
    units, in_step = [], []
    link = 0.0
    for r, rep in enumerate(eng.replicas):
        mine = [s for s in attn if s[1] == r]
        served = [(s[3], s[4]) for s in exp if r in s[5].get("replicas", ())]
        steps = _steps([s[3] for s in mine if s[2].startswith("attn L0 ")], [(s[3], s[4]) for s in mine] + served)
        in_step += steps
        wide = r >= len(eng.replicas) - spec.wide_replicas
        units.append({"unit": f"replica {r}", "role": f"attention >= {spec.wide_from_tokens // 1024}K" if wide
                      else "attention", "dies": spec.wide_tp if wide else spec.attention_tp,
                      **_account([(s[3], s[4]) for s in mine], steps, lo, hi)})
        ex = rep.exchange
        for s in mine:      # each MoE layer's micro-batch goes out and comes back over this replica's link
            layer = int(s[2].split()[1][1:])
            if cfg.moe_layers[layer]:
                link += 2 * ex.latency + s[5].get("tokens", 0) * (ex.disp + ex.comb)
    E = eng.shares.num_workers
    units.append({"unit": "expert pool", "role": "experts, co-located" if eng.colocated else "experts",
                  "dies": E,
                  **_account([(s[3], s[4]) for s in exp], in_step, lo, hi)})
    tokens = np.asarray([s[5].get("tokens", 0) for s in exp], dtype=float)
    batches = {"count": int(len(tokens)), "what": "tokens per expert-pool batch"}
    if len(tokens):
        batches.update(mean_tokens=float(tokens.mean()), p50_tokens=float(np.percentile(tokens, 50)),
                       p90_tokens=float(np.percentile(tokens, 90)), max_tokens=float(tokens.max()),
                       routed_tokens_per_die=float(tokens.mean()) * eng.model.top_k / E)
    return {"units": units, "link": {"seconds": link, "what": "dispatch + combine over every replica's link "
                                                                "(sum over replicas)"},
            "expert_batches": batches}


def _fractions(units: list[dict], wall: float) -> dict:
    out = {}
    for k in ("busy_s", "stall_s", "idle_s"):
        xs = np.asarray([u[k] for u in units]) / wall
        out[k[:-2]] = (float(xs.mean()), float(xs.min()), float(xs.max()))
    return out


def format_explain(x: dict) -> str:
    s = x["summary"]
    lines = [f"[{LABEL}] {x['describe']} on {x['devices']} devices at {x['rate']:.3f} req/s"
             + (f" (first of {x['instances']} instances, {x['explained_devices']} devices)" if x["instances"] > 1 else ""),
             f"[{LABEL}]   window {x['window'][0]:.1f}-{x['window'][1]:.1f} s of the run ({x['wall_s']:.1f} s), "
             f"the run's {x['num_requests']} requests: SLO attainment {s['slo_attainment']:.1%}, P90 TTFT "
             f"{(s['ttft_p90_ms'] or 0) / 1e3:.3g} s",
             f"[{LABEL}]   by prompt length: " + _buckets(x["buckets"]),
             f"[{LABEL}]   by arrival, first / middle / last third of the requests: "
             + " / ".join("-" if a is None else f"{a:.0%}" for a in x["by_arrival_third"])
             + (" (falling: the queue grows over the run, so this rate is not sustained; try more requests)"
                if None not in x["by_arrival_third"] and x["by_arrival_third"][2] < x["by_arrival_third"][0] - 0.1
                else "")]
    if x.get("drain_s") is not None:
        lines.append(f"[{LABEL}]   after the last arrival the run took {x['drain_s']:.3g} s more (the longest TTFT "
                     f"budget: {x['max_budget_s']:.3g} s)"
                     + (": longer than any budget, so work was still queued when arrivals stopped; this rate "
                        "is not sustained" if x["drain_s"] > x["max_budget_s"] else ""))
    if "ceiling" in x:
        lines.append(f"[{LABEL}]   work ceiling (`asap sim bound`): {x['ceiling']:.4g} req/s on {x['devices']} devices; "
                     f"this rate is {x['rate'] / x['ceiling']:.0%} of it"
                     + (" (ABOVE: no engine sustains it; some group's queue grows until the run ends, even where "
                        "the arrival thirds agree)" if x["rate"] > x["ceiling"] else ""))
    if "deployments" not in x:
        return "\n".join(lines + _breakdown(x, x["wall_s"]))
    for d in x["deployments"]:
        lines.append(f"[{LABEL}]   deployment {d['deployment']} ({d['describe']}): {d['num_requests']} requests, "
                     f"SLO attainment {d['summary']['slo_attainment']:.1%}; " + _buckets(d["buckets"]))
        lines += [line.replace(f"[{LABEL}]   ", f"[{LABEL}]     ", 1) for line in _breakdown(d, x["wall_s"])]
    return "\n".join(lines)


def _buckets(buckets: dict) -> str:
    return " | ".join(f"{k} {'-' if b['slo_attainment'] is None else format(b['slo_attainment'], '.0%')} "
                      f"(n={b['num_requests']}, {b['share_of_tokens']:.0%} of tokens)" for k, b in buckets.items())


def _breakdown(x: dict, w: float) -> list[str]:
    """The units' table, the link and the expert batches of one engine."""
    lines = [f"[{LABEL}]   {'unit':<14}{'role':<19}{'dies':>5}{'busy':>8}{'stall':>8}{'idle':>8}   (share of the window)"]
    roles = {}
    for u in x["units"]:
        roles.setdefault(u["role"], []).append(u)
    for role, us in roles.items():
        f = _fractions(us, w)
        if len(us) > 1:
            lines.append(f"[{LABEL}]   {f'mean of {len(us)}':<14}{role:<19}{us[0]['dies']:>5}"
                         + "".join(f"{f[k][0]:>8.1%}" for k in ("busy", "stall", "idle"))
                         + f"   (busy {f['busy'][1]:.0%}-{f['busy'][2]:.0%}, stall {f['stall'][1]:.0%}-{f['stall'][2]:.0%})")
        else:
            lines.append(f"[{LABEL}]   {us[0]['unit']:<14}{role:<19}{us[0]['dies']:>5}"
                         + "".join(f"{f[k][0]:>8.1%}" for k in ("busy", "stall", "idle")))
    ln = x["link"]
    lines.append(f"[{LABEL}]   link: {ln['seconds']:.2f} s ({ln['what']})"
                 + (f", the stream busy {ln['busy_s'] / w:.1%} of the window" if "busy_s" in ln else ""))
    eb = x["expert_batches"]
    if eb.get("mean_tokens") is not None:
        extra = (f", p50 {eb['p50_tokens']:.0f}, p90 {eb['p90_tokens']:.0f}, max {eb['max_tokens']:.0f}, "
                 f"{eb['count']} batches" if "p50_tokens" in eb else "")
        lines.append(f"[{LABEL}]   expert batches ({eb['what']}): mean {eb['mean_tokens']:.0f} tokens{extra}; "
                     f"{eb['routed_tokens_per_die']:.0f} routed tokens per expert die")
    return lines


def config_from_args(a) -> EngineConfig:
    """--config's EngineConfig (JSON, as `asap sim headline` writes each engine's), else the layout flags'."""
    if a.config is not None:
        import json
        try:
            fields = json.loads(a.config)
            if not isinstance(fields, dict):
                raise TypeError("not a JSON object")
            return EngineConfig(**fields)
        except (ValueError, TypeError) as e:
            raise ValueError(f"--config must be a JSON object of EngineConfig fields "
                             f"(asap.studies.config.EngineConfig), e.g. '{{\"engine\": \"sync\", \"attention_tp\": 4}}': {e}")
    if a.engine is None:
        raise ValueError("give --engine (with the layout flags) or --config")
    return EngineConfig(a.engine, attention_tp=a.attention_tp, token_budget=a.chunk, instances=a.instances,
                        attention_workers=a.attention_workers, microbatches=a.microbatches,
                        two_batch_overlap=not a.no_tbo, router=a.router, colocated=a.colocated,
                        window_s=a.expert_window_ms / 1e3, selector=a.expert_selector)


def add_parser(sub) -> None:
    e = sub.add_parser("explain", help="where a simulated run's time goes: busy / stall / idle per die, link, "
                                       "expert batches (SIMULATED)",
                       description="SIMULATED. Run one engine configuration at one rate and print where the time "
                                   "goes: busy / stall / idle per die, the link, the expert batches. About 10-15 s "
                                   "on two cores with the defaults; 16-52 s at 384 dies. A sync length-aware "
                                   "fleet is explained per deployment.")
    e.add_argument("--engine", choices=["sync", "async"], default=None,
                   help="engine to simulate (required unless --config gives it)")
    e.add_argument("--config", default=None, metavar="JSON",
                   help="the whole configuration as JSON, asap.studies.config.EngineConfig's fields, e.g. a row's "
                        "\"config\" in `asap sim headline`'s headline.json (length-aware fleets included); "
                        "replaces --engine and the layout flags below")
    e.add_argument("--devices", type=int, default=32, help="devices of the simulated cluster")
    e.add_argument("--rate", type=float, required=True, help="requests/s")
    e.add_argument("--workload", default="conversation", help="a name of asap.workload.presets or a trace path")
    e.add_argument("--num-requests", type=int, default=750, help="requests of the workload")
    add_slo_flag(e, "2s+1ms/tok")
    e.add_argument("--attention-tp", type=int, default=1, help="tensor-parallel degree of attention")
    e.add_argument("--chunk", type=int, default=16384, help="tokens per step of a DP group / replica")
    e.add_argument("--instances", type=int, default=1, help="independent instances the devices are split into")
    e.add_argument("--attention-workers", type=int, default=None, help="async: A per instance (default: balanced)")
    e.add_argument("--microbatches", type=int, default=2, help="async: micro-batches per step")
    e.add_argument("--colocated", action="store_true", help="async: every die hosts an attention replica's share "
                                                              "and an expert shard (no separate expert pool)")
    e.add_argument("--expert-window-ms", type=float, default=0.0,
                   help="async: the expert side holds a batch up to this long to merge same-layer work")
    e.add_argument("--expert-selector", default="oldest", choices=tuple(SELECTORS),
                   help="async: which ready expert work runs next (fullest: the layer with the most ready tokens)")
    e.add_argument("--no-tbo", action="store_true", help="sync: two-batch overlap off")
    e.add_argument("--router", default="queue-aware", help="request router across replicas / DP groups")
    e.add_argument("--model", default="deepseek-v3", help="model preset (its published config)")
    e.add_argument("--hardware", default="cloudmatrix384", help="hardware profile (asap/sim/profiles)")
    e.add_argument("--json", default=None, help="also write the breakdown here")
    e.set_defaults(run=_run)


def _run(a) -> int:
    import json
    from pathlib import Path

    from asap.workload.presets import workload_requests
    reqs = parse_slo(a.slo).apply(workload_requests(a.workload, a.num_requests))
    x = explain(reqs, config_from_args(a), a.devices, a.rate, a.model, a.hardware)
    print(format_explain(x))
    if a.json:
        Path(a.json).write_text(json.dumps(x, indent=2, default=float) + "\n")
    return 0

