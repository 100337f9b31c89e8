"""`asap sim bound`: the highest rate ANY engine could sustain on a workload, from the cost model's work alone.

Every request must be prefilled, and each of its FLOPs runs at best at the hardware profile's effective rate
for its op. So a request of n prompt tokens costs at least, in device-seconds (all layers):
- attention: its projections, 2 n x proj_params FLOPs at the attn_proj rate, and its causal core, n(n+1)/2
  query-key pairs at the attn_core rate;
- per MoE layer the gate, the shared expert and its top_k routed experts (2 n x params each, at the gate,
  shared_expert and experts rates); per dense layer the dense FFN.
Nothing else is charged: no memory-bound time (as if every weight read were amortised over an infinite
batch), no per-step overhead, no communication (as if fully overlapped), no expert imbalance, attention at
TP1 (TP only adds its all-reduce). A run that keeps every device busy 100% of the time on this work alone
reaches devices / mean(device-seconds per request) req/s: the ceiling. No scheduling, layout or pipeline
can beat it while it serves every request, as both simulated engines do (a missed deadline is served late,
not dropped).

What it is for: a rate above the ceiling cannot be sustained. If a search certifies one, its run was too
short and the queue was still growing when it ended (asap.measure.sustain.by_arrival_third shows it). And
a goal such as "1.9x the baseline" is out of reach for any design where 1.9 x the baseline's rate is above
the ceiling. The per-bucket table shows where the work is: long prompts are few but, attention being
quadratic, carry most of it.
"""
from __future__ import annotations

from asap.cost.model import CostModel
from asap.measure.buckets import BUCKETS, bucket_of
from asap.scheduler.request import Request

LABEL = "SIMULATED (cost model: a work ceiling, not a run)"


def min_device_seconds(cost: CostModel, num_tokens: int) -> float:
    """A lower bound on the device-seconds that prefilling one prompt of `num_tokens` takes (module docstring)."""
    m, r, n = cost.model, cost.rates, num_tokens
    pairs = n * (n + 1) / 2
    attention = m.num_layers * (2 * n * cost.proj_params / r["attn_proj"].flops_per_s
                                + cost.core_flops_per_pair * pairs / r["attn_core"].flops_per_s)
    n_moe = sum(m.moe_layers)
    moe = n_moe * (2 * n * m.hidden_size * m.num_experts / r["gate"].flops_per_s
                   + 2 * n * m.top_k * cost.expert_params / r["experts"].flops_per_s
                   + (2 * n * cost.shared_params / r["shared_expert"].flops_per_s if cost.shared_params else 0.0))
    dense = (m.num_layers - n_moe) * 2 * n * cost.dense_params / r["dense_ffn"].flops_per_s
    return attention + moe + dense


def work_bound(requests: list[Request], devices: list[int] | int, cost: CostModel) -> dict:
    """{"mean_device_s", "ceiling": {devices: req/s}, "buckets": {label: {num_requests, share_of_requests,
    share_of_work}}} for `requests` (only their prompt lengths count)."""
    if not requests:
        raise ValueError("work_bound needs at least one request")
    devices = [devices] if isinstance(devices, int) else list(devices)
    if any(d < 1 for d in devices):
        raise ValueError(f"devices must be >= 1, got {devices}")
    work = {label: [0, 0.0] for label, _, _ in BUCKETS}
    for req in requests:
        w = work[bucket_of(req.num_tokens)]
        w[0] += 1
        w[1] += min_device_seconds(cost, req.num_tokens)
    total = sum(s for _, s in work.values())
    mean = total / len(requests)
    return {"label": LABEL, "num_requests": len(requests), "mean_device_s": mean,
            "ceiling": {d: d / mean for d in devices},
            "buckets": {k: {"num_requests": n, "share_of_requests": n / len(requests), "share_of_work": s / total}
                        for k, (n, s) in work.items()}}


def format_bound(x: dict, rates: dict[str, float] | None = None, rates_at: int | None = None) -> str:
    """The ceiling per device count; `rates` ({name: req/s}, measured on `rates_at` devices, default the last
    device count) are set against that count's ceiling."""
    ceilings = x["ceiling"]
    rates_at = list(ceilings)[-1] if rates_at is None else rates_at
    lines = [f"[{x['label']}] {x['num_requests']} requests: at least {x['mean_device_s']:.3g} device-seconds of "
             f"compute per request (no memory-bound time, overhead, communication or imbalance)"]
    lines.append(f"[{x['label']}]   by prompt length: " + "; ".join(
        f"{k} {b['share_of_requests']:.1%} of requests, {b['share_of_work']:.1%} of the work"
        for k, b in x["buckets"].items() if b["num_requests"]))
    for d, ceiling in ceilings.items():
        lines.append(f"[{x['label']}]   {d} devices: no engine sustains more than {ceiling:.4g} req/s")
        for name, rate in (rates or {}).items() if d == rates_at else ():
            frac = rate / ceiling
            note = "  ABOVE the ceiling: not sustainable; a run that passed there ended before its queue " \
                   "caught up" if frac > 1 else ""
            lines.append(f"[{x['label']}]     {name}: {rate:.4g} req/s = {frac:.1%} of it{note}")
    return "\n".join(lines)


def headline_bounds(doc: dict) -> list[dict]:
    """Each row of a headline (`asap sim headline`'s headline.json, parsed) against the ceiling of the requests
    its maxima were confirmed on (the first n of its workload, n the larger engine's sample): the ceiling, each
    engine's maximum by both criteria, and the most any engine could lead sync by there (ceiling / sync)."""
    from asap.sim.run import get_hardware, get_model
    from asap.workload.presets import workload_requests
    try:
        cost = CostModel(get_model(doc["model"]), get_hardware(doc["hardware"]))
        rows = doc["rows"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a headline (asap sim headline's headline.json): no {e}") from None
    out = []
    for row in rows:
        engines = {e: row.get(e) or {} for e in ("sync", "async")}
        n = max((x.get("num_requests") or 0 for x in engines.values()), default=0) or row.get("requests_available")
        if not n:
            continue                                # a row with no maximum has nothing to set against a ceiling
        ceiling = work_bound(workload_requests(row["workload"], n), row["devices"], cost)["ceiling"][row["devices"]]
        rates = {e: x.get("max_slo_rate") for e, x in engines.items()}
        every = {e: (x.get("every_bucket") or {}).get("max_slo_rate") for e, x in engines.items()}
        out.append({"workload": row["workload"], "devices": row["devices"], "num_requests": n, "ceiling": ceiling,
                    "rates": rates, "every_bucket": every,
                    "most_lead": ceiling / rates["sync"] if rates["sync"] else None})
    return out


def format_headline_bounds(rows: list[dict]) -> str:
    """headline_bounds as text, one block per row."""
    def share(name: str, rate, ceiling: float) -> str:
        if not rate:
            return f"{name} -"
        return f"{name} {rate:.4g} ({rate / ceiling:.1%}{', ABOVE the ceiling' if rate > ceiling else ''})"
    lines = []
    for r in rows:
        c, rates, every = r["ceiling"], r["rates"], r["every_bucket"]
        lead = f"{rates['async'] / rates['sync']:.2f}x" if rates["sync"] and rates["async"] else "-"
        lines.append(f"[{LABEL}] {r['workload']}, {r['devices']} devices, {r['num_requests']} requests: no engine "
                     f"sustains more than {c:.4g} req/s")
        lines.append(f"[{LABEL}]   >= 90% of requests: {share('sync', rates['sync'], c)}, "
                     f"{share('async', rates['async'], c)}; async leads {lead}, and no engine could lead sync by "
                     + (f"more than {r['most_lead']:.2f}x" if r["most_lead"] else "-"))
        if every["sync"] or every["async"]:
            lines.append(f"[{LABEL}]   every bucket >= 90%: {share('sync', every['sync'], c)}, "
                         f"{share('async', every['async'], c)}")
    return "\n".join(lines) if lines else f"[{LABEL}] the headline has no row with a maximum"


def add_parser(sub) -> None:
    b = sub.add_parser("bound", help="the most req/s any engine could sustain on a workload: a work ceiling "
                                     "from the cost model (SIMULATED)",
                       description="SIMULATED (the cost model, no run). The highest rate any engine could "
                                   "sustain on a workload while serving every request: devices / the least "
                                   "device-seconds of compute a request takes (each op's FLOPs at the profile's "
                                   "effective rate; no memory time, overhead, communication or imbalance). Rates "
                                   "given with --rate are printed as a share of it; one above it is flagged as not "
                                   "sustainable. Under 10 s on two cores.")
    b.add_argument("--workload", default="conversation", help="a name of asap.workload.presets or a trace path")
    b.add_argument("--num-requests", type=int, default=750, help="requests of the workload")
    b.add_argument("--devices", type=int, nargs="+", default=[32], help="device counts, one ceiling each")
    b.add_argument("--rate", action="append", default=[], metavar="NAME=REQ_PER_S",
                   help="a measured rate to set against the ceiling (the last --devices), repeatable: "
                        "--rate sync=34.38 --rate async=41.88")
    b.add_argument("--model", default="deepseek-v3", help="model preset (its published config)")
    b.add_argument("--hardware", default="cloudmatrix384", help="hardware profile (asap/sim/profiles)")
    b.add_argument("--headline", metavar="FILE",
                   help="instead: every row of an `asap sim headline` JSON against the ceiling of its own requests, "
                        "with both engines' maxima and the most any engine could lead sync by (its workload, "
                        "devices, model and hardware come from the file)")
    b.set_defaults(run=_run)


def parse_rates(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.rpartition("=")      # a name may hold "=" (A=17=14.25)
        try:
            rate = float(value)
        except ValueError:
            rate = float("nan")
        if not sep or not name or not rate > 0:
            raise ValueError(f"--rate takes NAME=REQ_PER_S with a rate > 0, e.g. sync=34.38; got {item!r}")
        out[name] = rate
    return out


def _run(a) -> int:
    from asap.sim.run import get_hardware, get_model
    from asap.workload.presets import workload_requests
    if a.headline:
        if a.rate:
            raise ValueError("--headline reads each row's rates from the file: leave --rate out")
        import json
        try:
            with open(a.headline) as f:
                doc = json.load(f)
        except OSError as e:
            raise ValueError(f"--headline {a.headline}: cannot read it ({e.strerror or e})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"--headline {a.headline}: not JSON ({e})") from None
        print(format_headline_bounds(headline_bounds(doc)))
        return 0
    rates = parse_rates(a.rate)
    x = work_bound(workload_requests(a.workload, a.num_requests), a.devices,
                   CostModel(get_model(a.model), get_hardware(a.hardware)))
    print(format_bound(x, rates))
    return 0
