r"""`asap plan` (A:E for N devices) and `asap ablation` (each policy on and off).

    asap plan --devices 32 --model deepseek-v3 --hardware cloudmatrix384 --workload trace --slo 5x
    asap plan --devices 32 --tune conversation --slo 2s+1ms/tok   # best-tuned sync AND async (SIMULATED)
    asap ablation --json out/ablation.json                       # SIMULATED, DeepSeek-V3, 32 devices
    asap ablation --backend emulated --json out/ablation_emulated.json   # EMULATED, small, a few minutes
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from asap.workload.slo import IdleMultiple, add_slo_flag, parse_slo

PLAN = """SIMULATED. Split N devices into A attention workers + E expert workers for the async engine.

    asap plan --devices 32                                        # ~2 min on two cores shared with other jobs
    asap plan --devices 32 --tune conversation --slo 2s+1ms/tok   # both engines best-tuned, ~36 min
    asap plan --devices 32 --tune my.csv --slo 2s+1ms/tok --sustained   # the table's rule

The row marked "analytic" is the split the cost model balances on paper (attention throughput =
expert throughput); its SLO-compliant rate is the reference at which every feasible split (E large
enough to hold the routed experts' weights) is simulated once; the --check best of those get their
own rate search, and the one with the highest SLO-compliant rate is marked RECOMMENDED. With --sync
the sync engine on the same N devices is searched too, in its default layout (DP N x TP1, untuned):
for a fair comparison of the engines use --tune, which searches each engine's whole configuration
space with the same budget, and ends with the engine to run on that workload and the `asap serve`
command of each of its deployments.
"""

ABLATION = """Each scheduling optimization of the async engine on and off (plain, each one alone, all on,
and with --leave-one-out all on minus one), and the sync baseline, at their SLO-compliant rates.

    asap ablation --leave-one-out                          # SIMULATED, ~1 min on two cores
    asap ablation --backend emulated                       # EMULATED, a few minutes
"""


PLAN_REQUESTS = 300          # the A:E plan's sample


def register(sub):
    from asap.studies.plan import WORKLOADS
    p = sub.add_parser("plan", help="recommend attention:expert workers for N devices (SIMULATED)",
                       description=PLAN, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, required=True, help="devices to split into A attention + E expert")
    p.add_argument("--model", default="deepseek-v3", help="preset name or HF config.json directory")
    p.add_argument("--hardware", default="cloudmatrix384", help="hardware profile (built-in name or .json)")
    _workload_flags(p, WORKLOADS, num_requests=None, max_prompt=None)
    p.add_argument("--check", type=int, default=3, help="rate-search this many best screened candidates (0 = all)")
    p.add_argument("--tolerance", type=float, default=0.1, help="relative width of the final rate bracket")
    p.add_argument("--target-attainment", type=float, default=0.9,
                   help="fraction of requests that must meet the SLO at an SLO-compliant rate")
    p.add_argument("--token-budget", type=int, default=16384, help="prompt tokens per replica step")
    p.add_argument("--zipf", type=float, default=0.0, help="expert popularity skew (0 = uniform)")
    p.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True,
                   help="also search the sync engine on the same devices, for comparison")
    p.add_argument("--tune", metavar="WORKLOAD", default=None,
                   help="instead: search each engine's whole configuration space with the same budget "
                        "(asap.studies.tune) on WORKLOAD (conversation, synthetic, fixed-4k, lognormal or a trace "
                        "path), print the best sync and the best async configuration, recommend the engine with the "
                        "higher SLO-compliant rate and print the `asap serve` command of each of its deployments; "
                        "--slo then takes a time budget such as 5s or 2s+1ms/tok")
    p.add_argument("--sustained", action="store_true",
                   help="--tune: the headline table's rule (asap sim headline --sustained): a rate passes only if "
                        "the run drains within its longest TTFT budget after the last arrival and meets the target "
                        "in each third of the run, and each maximum of either engine is confirmed on the same "
                        "twice-the-sample requests")
    from asap.studies.search_flags import add_search_flags
    add_search_flags(p, when="--tune: ")    # --fleet-fractions, --orders, --lanes (the headline's)
    p.add_argument("--vet", action=argparse.BooleanOptionalAction, default=None,
                   help="--tune --sustained (on by default there; --no-vet: off): re-rank each search's leading "
                        "candidates on the longer sample before choosing its finalists, search them there and "
                        "confirm them on twice as many (asap sim headline --vet; finds fleets whose long-prompt "
                        "queue the short screen cannot judge)")
    from asap.studies.parallel import add_arguments
    add_arguments(p)            # --jobs, --executor: where --tune's simulations run
    p.add_argument("--json", help="write the plan here")
    p.set_defaults(func=run_plan)

    from asap.bench.ablation import EMULATED, SIM
    a = sub.add_parser("ablation", help="each scheduling optimization on and off, and the sync baseline",
                       description=ABLATION, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--backend", choices=["sim", "emulated"], default="sim",
                   help="sim: discrete-event simulator (SIMULATED); emulated: real processes, compute emulated")
    a.add_argument("--leave-one-out", action="store_true", help="also rows 'all on minus one optimization'")
    a.add_argument("--json", help="write the table's rows and settings here")
    g = a.add_argument_group("settings (defaults: sim / emulated)")

    def flag(name, typ, help):
        d = (getattr(SIM, name), getattr(EMULATED, name))
        shown = "" if "default" in help else f" (default {d[0]} / {d[1]})"      # never two defaults
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None, help=help + shown)
    flag("model", str, "preset name")
    flag("hardware", str, "hardware profile (sim cost model; emulated cost table)")
    flag("devices", int, "sync ranks = async A + E")
    flag("attention_workers", int, "async A (sim None: the cost model's balance)")
    flag("workload", str, f"arrivals: {', '.join(WORKLOADS)} (lengths from the Mooncake trace)")
    flag("num_requests", int, "the trace's first N requests")
    flag("seed", int, "arrivals and expert skew")
    add_slo_flag(g, None, relative=True, what=f" (default {SIM.slo} / {EMULATED.slo})")
    flag("max_prompt", int, "clip prompt lengths (0 = no clip)")
    flag("length_scale", float, "multiply prompt lengths")
    flag("zipf", float, "sim: expert popularity skew")
    flag("redundant", int, "extra expert copies per layer when redundant experts are on")
    flag("window_ms", float, "aggregation window when on")
    flag("admission_slack", float, "admission demotes past slack x the TTFT budget")
    flag("token_budget", int, "prompt tokens per replica step")
    flag("tolerance", float, "rate search: relative bracket width")
    flag("max_iters", int, "rate search: most runs per row")
    flag("ref_rate", float, "req/s for the P90 TTFT column (default: the plain async row's SLO rate)")
    flag("dilation", float, "emulated: op time multiplier")
    flag("trace", str, "Mooncake .jsonl trace")
    a.set_defaults(func=run_ablation)


def _workload_flags(p, workloads, num_requests: int, max_prompt):
    from asap.studies.experiments import TRACE
    p.add_argument("--workload", choices=workloads, default="trace",
                   help="arrival pattern (lengths from the Mooncake trace); rates are rescaled in the search")
    p.add_argument("--num-requests", type=int, default=num_requests,
                   help="the trace's first N requests" + ("" if num_requests is not None else
                                                          f" (default {PLAN_REQUESTS}; --tune: as the headline "
                                                          "sizes a row, enough for a steady state at the "
                                                          "devices' work ceiling, at least 1500)"))
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals and the expert skew")
    add_slo_flag(p, "5x", relative=True, what=" (--tune: a time budget, not 5x)")
    p.add_argument("--max-prompt", type=int, default=max_prompt, help="clip prompt lengths")
    p.add_argument("--trace", default=str(TRACE), help="Mooncake .jsonl trace")


def run_tune(args) -> int:
    from asap.studies.plan import best_configs
    if isinstance(parse_slo(args.slo, relative=True), IdleMultiple):
        raise ValueError("--tune judges both engines on a peer-style SLO: give --slo such as 5s or 2s+1ms/tok")
    if args.num_requests is not None and args.num_requests < 2:
        raise ValueError(f"--num-requests must be >= 2 (or left out: sized for the devices), got {args.num_requests}")
    from asap.studies import parallel
    with parallel.from_args(args) as executor:
        out = best_configs(args.model, args.hardware, args.devices, args.tune, args.slo,
                           args.num_requests,
                           verbose=True, executor=executor, sustained=args.sustained,
                           vet=args.sustained if args.vet is None else args.vet, orders=tuple(args.orders),
                           fleet_fractions=tuple(args.fleet_fractions), lanes=tuple(args.lanes))
    for engine in ("sync", "async"):
        t = out["results"][engine]
        if t.best is None:
            print(f"[SIMULATED] best {engine}: none ({t.reason})")
        else:
            print(f"[SIMULATED] best {engine}: {t.best.describe(args.devices)}: {t.max_slo_rate:.3f} req/s "
                  f"SLO-compliant, {t.tokens_per_s_per_device:.0f} tok/s/device, P90 TTFT {t.ttft_p90_s:.2f} s "
                  f"({t.num_sims} simulations)")
    s, a = out["results"]["sync"].max_slo_rate, out["results"]["async"].max_slo_rate
    if s and a:
        print(f"[SIMULATED] best-tuned async / best-tuned sync = {a / s:.2f}x")
    if s or a:
        for line in _recommendation(out["results"], args):
            print(line)
    if args.json:
        _write(args.json, {e: dataclasses.asdict(out["results"][e]) for e in ("sync", "async")})
    return 0


def _recommendation(results: dict, args) -> list[str]:
    """The engine with the higher SLO-compliant rate and how to run it; none where the other engine's search
    gave no rate for a reason other than "no layout fits" (then the two were not compared)."""
    from asap.studies.deploy import deployment_lines
    s, a = results["sync"].max_slo_rate, results["async"].max_slo_rate
    engine = "async" if (a or 0) > (s or 0) else "sync"
    other = "sync" if engine == "async" else "async"
    why = results[other].reason or ""
    if not (s and a) and why != "no feasible configuration":
        return [f"[SIMULATED] no recommendation: the {other} search gave no rate to compare ({why})"]
    lead = f"{max(a, s) / min(a, s):.2f}x the best {other}" if s and a else f"no {other} layout fits"
    return [f"[SIMULATED] recommended for this workload: the {engine} engine ({lead}); run it as",
            *deployment_lines(results[engine].best, args.devices, args.model, args.hardware)]


def run_plan(args) -> int:
    from asap.studies.plan import apply_slo, format_plan, plan, workload_requests
    if args.devices < 2:
        raise ValueError(f"--devices must be >= 2 (one attention and one expert worker at least), got {args.devices}")
    if args.sustained and not args.tune:
        raise ValueError("--sustained is a rule of --tune's search: give --tune WORKLOAD")
    if args.vet and not args.sustained:
        raise ValueError("--vet re-ranks on the sample --sustained confirms on: give --tune WORKLOAD --sustained")
    from asap.studies.space import FLEET_FRACTIONS, QUEUE_ORDERS
    widened = [f for f, v, d in (("--orders", args.orders, QUEUE_ORDERS), ("--lanes", args.lanes, ()),
                                 ("--fleet-fractions", args.fleet_fractions, FLEET_FRACTIONS)) if tuple(v) != d]
    if widened and not args.tune:
        raise ValueError(f"{' '.join(widened)} widen --tune's search: give --tune WORKLOAD")
    if args.tune:
        return run_tune(args)
    n = PLAN_REQUESTS if args.num_requests is None else args.num_requests
    reqs = workload_requests(args.workload, n, args.seed, args.trace)
    if args.max_prompt:
        reqs = [dataclasses.replace(r, num_tokens=min(r.num_tokens, args.max_prompt)) for r in reqs]
    reqs = apply_slo(reqs, args.slo, args.model, args.hardware, args.devices, args.token_budget)
    p = plan(reqs, args.devices, args.model, args.hardware, check=args.check, target=args.target_attainment,
             tol=args.tolerance, with_sync=args.sync, token_budget=args.token_budget, zipf=args.zipf,
             seed=args.seed)
    p.settings.update(workload=args.workload, slo=args.slo, max_prompt=args.max_prompt, trace=args.trace)
    print(format_plan(p))
    if args.json:
        _write(args.json, p.to_dict())
    return 0


def run_ablation(args) -> int:
    from asap.bench.ablation import EMULATED, SIM, Settings, ablation
    from asap.bench.ablation_report import format_ablation
    base = SIM if args.backend == "sim" else EMULATED
    names = {f.name for f in dataclasses.fields(Settings)} - {"backend"}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if given.get("max_prompt") == 0:
        given["max_prompt"] = None
    settings = dataclasses.replace(base, **given)
    res = ablation(settings, args.leave_one_out, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_ablation(res))
    if args.json:
        _write(args.json, res)
    return 0


def _write(path, data) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
