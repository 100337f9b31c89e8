r"""`asap bench`: targets side by side on one workload, with `vllm bench serve`'s flags and result keys.

    asap bench --target sync --target async --length-scale 0.02 --num-prompts 50 --request-rate 1 \
        --slo 10s --save-result --result-dir out --plot out/plots                        # ~2 min on 2 cores
    asap bench --target http --backend vllm --host 127.0.0.1 --port 8000 \
        --dataset-name random --random-input-len 512 --num-prompts 200 --request-rate 4 --goodput ttft:500
    asap bench --target sim-async --target sim-sync --find-max-rate --slo 10s \
        --arrivals poisson --rate 0.5 --length-scale 0.02 --max-tokens 1024 --plot out/sim  # ~10 s

Every target runs the same requests. Sync gets as many devices as async
(--devices defaults to A + E). Per target: one run, a sweep (--rates) or a
search for the highest rate meeting the SLO target (--find-max-rate). Each run
record has vLLM's keys (completed, failed, duration, request_throughput,
request_goodput, mean/median/std/p99_ttft_ms, ...) and ASAP's (slo_attainment,
ttft_p90_ms, max_slo_rate, worker busy/stall/idle). The default dataset is the
Mooncake sample shipped in the package.

--target http: the server at --base-url (or http://--host:--port, vLLM's
default 127.0.0.1:8000). Without --model the model comes from the server, as in
vLLM: the first of its /v1/models (or --served-model-name), its config when it
is a preset or a directory here, else token ids bounded by its /tokenize.
Exit status 1 when any request failed (the reasons are printed), 2 on bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from asap.bench.datasets import add_workload_flags, build_workload, parse_lengths  # noqa: F401 (re-exported)
from asap.measure.metrics import parse_goodput, parse_metrics, parse_percentiles, vllm_metrics
from asap.measure.rate_search import find_max_rate
from asap.measure.report import format_table, run_record, text_table, write_chrome_trace, write_json, \
    write_result_files
from asap.bench.runner import Run, measure
from asap.bench.targets import TARGETS, close_target, make_target, model_config, needs_prompts
from asap.config import RuntimeConfig
from asap.workload import Workload

DEFAULT_MODEL = "small-deepseek-v3"
# vllm bench serve's backends that post to OpenAI's /v1/completions, which is what the http target sends
BACKENDS = ("vllm", "openai", "sglang", "lmdeploy")


def register(sub):
    from asap.config import add_config_flags
    p = sub.add_parser("bench", help="benchmark engines, the simulator or a server side by side on one workload",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", choices=TARGETS,
                   help="repeatable; default: --target sync --target async. http: a running server "
                        "(--base-url, or --host/--port)")
    p.add_argument("--model", default=None,
                   help="preset name or HF model directory: the local config (and tokenizer) of the workload. "
                        f"Default: with --target http, the server's (its /v1/models, as vLLM); otherwise "
                        f"{DEFAULT_MODEL}")
    h = p.add_argument_group("http target (an OpenAI-compatible server; vllm bench serve's flags)")
    h.add_argument("--backend", choices=BACKENDS, default=None,
                   help="vLLM's name for a server speaking OpenAI's /v1/completions (all the same here; chat "
                        "and other APIs are not supported). Needs --target http")
    h.add_argument("--base-url", "--url", dest="url",
                   help="server base URL, e.g. http://127.0.0.1:8000 (default: http://HOST:PORT)")
    h.add_argument("--host", default=None, help="server host, when no --base-url (default: 127.0.0.1)")
    h.add_argument("--port", type=int, default=None, help="server port, when no --base-url (default: 8000)")
    h.add_argument("--endpoint", default="/v1/completions", help="API path (default: %(default)s)")
    h.add_argument("--served-model-name",
                   help="the model name the server answers to (default: --model, else the server's first model)")
    h.add_argument("--random-output-len", type=int, default=None,
                   help="max_tokens of each request, as vLLM (only with --dataset-name random). Default 1 here: "
                        "a prefill benchmark; 0 = prefill only. An ASAP server accepts 0 or 1")
    h.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight (engines and http); a request's clock starts "
                        "when it is sent, as vLLM (default: no limit)")
    h.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream (stream_options.include_usage) and take TTFT at the first chunk, as vLLM "
                        "(default: on)")
    h.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true")
    add_workload_flags(p)
    s = p.add_argument_group("rate search / sweep")
    s.add_argument("--find-max-rate", action="store_true",
                   help="search the highest rate meeting the SLO target (needs an SLO; starts at --rate or 1)")
    s.add_argument("--target-attainment", type=float, default=0.9, help="fraction of requests that must meet the SLO")
    s.add_argument("--tolerance", type=float, default=0.1, help="relative width of the final rate bracket")
    s.add_argument("--max-iters", type=int, default=10, help="most runs per target in a search")
    s.add_argument("--rates", help="comma-separated rates (req/s): one run per rate and target")
    o = p.add_argument_group("output")
    o.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="metrics with percentiles in the result: ttft, tpot, itl, e2el (default: %(default)s)")
    o.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default: %(default)s)")
    o.add_argument("--save-result", action="store_true",
                   help="write each run's result JSON (vLLM's keys + ASAP's) into --result-dir")
    o.add_argument("--result-dir", default=".", help="with --save-result (default: %(default)s)")
    o.add_argument("--result-filename", help="with --save-result and a single run: the file name")
    o.add_argument("--json", help='write every run record into this one file: {"runs": [...]}')
    o.add_argument("--plot", help="write TTFT CDF, attainment vs rate and worker timelines into this directory")
    o.add_argument("--timeout", type=float, default=None, help="a request still unanswered after this (s) fails")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="a progress bar per run on stderr")
    e = p.add_argument_group("engine (RuntimeConfig)")
    add_config_flags(e, RuntimeConfig)
    p.set_defaults(func=run, devices=None)


def runtime_from_args(args) -> RuntimeConfig:
    """The engines' config; sync gets as many devices as async (A + E; co-located: E) unless --devices says
    otherwise."""
    from asap.config import config_from_args
    devices = args.devices if args.devices is not None else \
        args.expert_workers + (0 if args.colocated else args.attention_workers)
    return config_from_args(RuntimeConfig, argparse.Namespace(**{**vars(args), "devices": devices}))


def describe_slo(w: Workload) -> str:
    if w.slo is None:
        return "none"
    parts = ([f"{w.slo.fixed_s:.3g} s"] if w.slo.fixed_s else []) \
        + ([f"{w.slo.per_token_s * 1000:.3g} ms x prompt tokens"] if w.slo.per_token_s else [])
    return "TTFT <= " + " + ".join(parts)


def vllm_options(args) -> dict:
    """--percentile-metrics, --metric-percentiles and --goodput, checked."""
    return dict(metrics=parse_metrics(args.percentile_metrics), percentiles=parse_percentiles(args.metric_percentiles),
                goodput=parse_goodput(args.goodput))


def record_of(run: Run, workload: Workload, search: dict | None = None, vllm: dict | None = None, **extra) -> dict:
    """ASAP's summary + vLLM's result keys (`vllm`: vllm_options) + what produced the run."""
    rec = run_record(run.label, run.summary, search)
    rec.update(vllm_metrics(run.results, run.summary, **(vllm or {})))
    rec.update(rate=run.rate, slo=describe_slo(workload), workers=run.workers, wall_s=run.wall_s,
               num_tokens=sum(r.num_tokens for r in run.results), **extra)
    return rec


def bench_target(name: str, target, workload: Workload, args) -> tuple[list[dict], list[Run], dict]:
    """Records and runs of one target: a single run, a sweep, or a rate search; plus its rate curve."""
    extra = {"target": name, "vllm": vllm_options(args)}
    if hasattr(target, "startup_s"):
        extra["startup_s"] = target.startup_s
    if args.find_max_rate:
        runs: dict[float, Run] = {}

        def measure_at(rate: float) -> dict:
            runs[rate] = measure(target, dataclasses.replace(workload, rate=rate))
            return runs[rate].summary

        search = find_max_rate(measure_at, args.target_attainment, lo=args.rate or 1.0, tol=args.tolerance,
                               max_iters=args.max_iters)
        best = runs.get(search["max_slo_rate"]) or runs[min(runs)]
        if not search.get("valid", search["converged"]):
            print(f"{target.label}: no maximum SLO rate reported: {search.get('reason') or 'search did not converge'}"
                  f" (highest rate that passed: {search['max_slo_rate']:g} req/s, a lower bound)", file=sys.stderr)
        return [record_of(best, workload, search, **extra)], [best], {target.label: search["points"]}
    rates = [float(x) for x in args.rates.split(",")] if args.rates else [workload.rate]
    runs_list = [measure(target, dataclasses.replace(workload, rate=r)) for r in rates]
    if args.rates:
        for run in runs_list:
            run.label = f"{target.label} @ {run.rate:g}/s"
    records = [record_of(run, workload, **extra) for run in runs_list]
    curve = [(run.rate, run.summary) for run in runs_list if run.rate is not None]
    return records, runs_list, ({target.label: curve} if curve else {})


def format_workers(records: list[dict]) -> str:
    """Per worker, per run: compute/stall/idle as percentages of the run's wall time."""
    workers = sorted({w for r in records for w in r.get("workers", {})})
    if not workers:
        return ""
    rows = [["worker compute/stall/idle %"] + [r["label"] for r in records]]
    for w in workers:
        cells = []
        for r in records:
            f = r.get("workers", {}).get(w)
            cells.append("-" if f is None else "/".join(f"{100 * f[k]:.0f}" for k in ("compute", "stall", "idle")))
        rows.append([w] + cells)
    return "\n".join(text_table(rows))


def notes(records: list[dict]) -> list[str]:
    out = []
    if any("SIMULATED" in r["label"] for r in records):
        out.append("SIMULATED: figures from the discrete-event simulator's cost model, not measured.")
    if any("emulated" in r["label"] for r in records):
        out.append("emulated: real workers and communication, compute replaced by timed waits from a cost table.")
    return out


def summary_text(records: list[dict]) -> str:
    parts = [format_table(records), format_workers(records)] + notes(records)
    return "\n\n".join(p for p in parts if p)


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower()


def write_plots(out_dir, runs: list[Run], curves: dict, slo_s: float | None, target_attainment: float = 0.9) -> list:
    """TTFT CDF, attainment vs rate (when there are rates) and one timeline + Chrome trace per run with spans."""
    from pathlib import Path

    from asap.bench.plots import plot_attainment_vs_rate, plot_timeline, plot_ttft_cdf
    out = Path(out_dir)
    paths = [out / "ttft_cdf.png"]
    plot_ttft_cdf({r.label: r.results for r in runs}, paths[0], slo_s)
    if any(curves.values()) and all(s.get("slo_attainment") is not None for c in curves.values() for _, s in c):
        paths.append(out / "attainment_vs_rate.png")
        plot_attainment_vs_rate(curves, paths[-1], target_attainment)
    for run in runs:
        if run.spans:
            paths += [out / f"timeline_{slug(run.label)}.png", out / f"trace_{slug(run.label)}.json"]
            plot_timeline(run.spans, paths[-2])
            write_chrome_trace(run.spans, paths[-1])
    return paths


def server_url(args, names) -> str | None:
    """vLLM's rule: --base-url, else http://HOST:PORT. Server flags without an http target are refused (they
    would be silently ignored)."""
    given = [f for f, v in (("--base-url", args.url), ("--host", args.host), ("--port", args.port),
                            ("--backend", args.backend), ("--random-output-len", args.random_output_len)) if v is not None]
    if "http" not in names:
        if given:
            raise ValueError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} a server to benchmark: "
                             f"add --target http")
        return None
    if args.url and (args.host or args.port):
        raise ValueError("give --base-url or --host/--port, not both")
    if args.random_output_len is not None:
        if args.random_output_len < 0:
            raise ValueError(f"--random-output-len must be >= 0, got {args.random_output_len}")
        if args.dataset_name != "random":
            raise ValueError("--random-output-len applies to --dataset-name random, as in vLLM")
    return args.url or f"http://{args.host or '127.0.0.1'}:{args.port or 8000}"


def resolve_model(args, names, url: str | None):
    """(local model spec or None, ServedModel-like facts): --model, else the server's model, else the default."""
    from asap.bench.served_model import ServedModel, ServerTokenizer, discover
    if args.model is None and url is not None:
        served = discover(url, args.served_model_name)
        print(f"[bench] model: {served.source}", file=sys.stderr, flush=True)
        others = [n for n in names if n != "http"]
        if served.local is None and others:
            raise ValueError(f"--target {' --target '.join(others)} needs the model here, and the server's "
                             f"{served.name!r} is not a preset or a local directory: pass --model")
        tokenizer = None if served.local or args.tokenizer else ServerTokenizer(url, served.name)
        return served, tokenizer
    model = args.model or DEFAULT_MODEL
    cfg = model_config(model)
    return ServedModel(args.served_model_name or model, model, cfg.vocab_size, cfg.max_position_embeddings,
                       model), None


def failures(records: list[dict]) -> str | None:
    """"N of M requests failed (target: n)" when any did, else None."""
    failed = sum(r.get("failed") or 0 for r in records)
    if not failed:
        return None
    total = sum(r.get("num_requests") or 0 for r in records)
    per = ", ".join(f"{r['label']}: {r['failed']}" for r in records if r.get("failed"))
    return f"{failed} of {total} requests failed ({per}); the reasons are printed above"


def run(args) -> int:
    names = args.target or ["sync", "async"]
    url = server_url(args, names)
    if args.find_max_rate and args.rates:
        raise ValueError("use either --find-max-rate or --rates")
    if args.find_max_rate and args.slo is None and "ttft" not in parse_goodput(args.goodput):
        raise ValueError("--find-max-rate needs an SLO: --slo (e.g. 10s or 2s+1ms/tok) or --goodput ttft:MS")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.max_concurrency is not None and any(n.startswith("sim-") for n in names):
        raise ValueError("--max-concurrency applies to engines and http, not to the simulator")
    if args.result_filename and not args.save_result:
        raise ValueError("--result-filename needs --save-result")
    vllm_options(args)          # bad --percentile-metrics / --metric-percentiles / --goodput fail before any run
    runtime = runtime_from_args(args)
    served, tokenizer = resolve_model(args, names, url)
    model = served.local or served.name
    args = argparse.Namespace(**{**vars(args), "model": model,       # the result files name what was used
                                 "served_model_name": served.name if url else args.served_model_name})
    workload = build_workload(args, served.vocab_size, served.max_position, needs_prompts(runtime, names),
                              tokenizer=tokenizer)
    workload.build()            # a bad trace or workload fails before any engine starts
    records, runs, curves = [], [], {}
    for name in names:
        print(f"[bench] {name}: starting", file=sys.stderr, flush=True)
        target = make_target(name, model, runtime, url, args.progress, args.timeout,
                             served_model_name=served.name, endpoint=args.endpoint, stream=args.stream,
                             max_concurrency=args.max_concurrency, ignore_eos=args.ignore_eos,
                             max_tokens=1 if args.random_output_len is None else args.random_output_len)
        try:
            recs, rs, curve = bench_target(name, target, workload, args)
        finally:
            close_target(target)
        records += recs
        runs += rs
        curves.update(curve)
    print(f"workload: {records[0]['num_requests']} requests ({args.dataset_name}), SLO {describe_slo(workload)}, "
          f"model {served.source}" + (f", async {runtime.attention_workers}A+{runtime.expert_workers}E vs sync "
                                      f"{runtime.devices} ranks" if {"sync", "async"} & set(names) else ""))
    print(summary_text(records))
    if args.json:
        write_json(args.json, records)
        print(f"wrote {args.json}")
    if args.save_result:
        for path in write_result_files(records, args):
            print(f"wrote {path}")
    if args.plot:
        line = workload.slo.fixed_s if workload.slo and not workload.slo.per_token_s else None   # one budget
        paths = write_plots(args.plot, runs, curves, line, args.target_attainment)
        print(f"wrote {len(paths)} files to {args.plot}")
    failed = failures(records)
    if failed:
        print(f"asap bench: {failed}", file=sys.stderr)
        return 1
    return 0
