"""Text, JSON and Chrome-trace output of benchmark runs.

A run record (one per target / configuration) is the summary from
`metrics.summarize` plus:

- label          who produced it, e.g. "async", "sync (emulated)", "simulated"
- max_slo_rate   when a rate search ran: the highest rate meeting the target
- search         when a rate search ran: {target, tolerance, converged,
                 points: [{rate, summary}, ...]}

`write_json` writes {"runs": [record, ...]}. `write_result_files` writes one
file per run, as `vllm bench serve --save-result` does: the record (vLLM's keys
and ASAP's) plus vLLM's run description (date, backend, model_id, tokenizer_id,
num_prompts, request_rate, burstiness, max_concurrency).

Spans (worker timeline) are dicts {worker: str, kind: "compute"|"stall"|"idle",
start: s, end: s}; `write_chrome_trace` turns them into Chrome/Perfetto JSON
(one "X" event per span, one tid per worker).
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np

from asap.measure.metrics import SUMMARY_KEYS

SPAN_KINDS = ("compute", "stall", "idle")
# The printed table: vLLM's headline keys, then ASAP's; per-metric statistics in between.
TABLE_HEAD = ("max_slo_rate", "completed", "failed", "duration", "total_input_tokens", "request_throughput",
              "request_goodput")
TABLE_TAIL = ("ttft_p90_ms", "slo_s", "num_slo_met", "slo_attainment", "input_token_throughput")
TABLE_KEYS = TABLE_HEAD + tuple(k for k in SUMMARY_KEYS if k not in TABLE_TAIL) + TABLE_TAIL
_STAT = re.compile(r"^(mean|median|std|p[0-9.]+)_(ttft|tpot|itl|e2el)_ms$")


def run_record(label: str, summary: dict, search: dict | None = None) -> dict:
    """One run's record: label + summary (+ max_slo_rate and search points from find_max_rate)."""
    record = {"label": label, **summary}
    if search is not None:
        # A maximum only from a search that converged on a steady state; otherwise a lower bound, and why.
        valid = search.get("valid", search["converged"] and search["max_slo_rate"] > 0)
        record["max_slo_rate"] = search["max_slo_rate"] if valid else None
        if not valid:
            record["slo_rate_lower_bound"] = search["max_slo_rate"]
        record["search"] = {"target": search["target"], "tolerance": search["tolerance"],
                            "converged": search["converged"], "valid": valid, "reason": search.get("reason"),
                            "points": [{"rate": rate, "summary": s} for rate, s in search["points"]]}
    return record


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (bool, int, np.integer)):
        return str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def cell(value, fmt: str) -> str:
    """`value` formatted with `fmt`, or "-" when there is none."""
    return "-" if value is None else format(value, fmt)


def text_table(rows: list[list[str]], left: tuple[int, ...] = (0,)) -> list[str]:
    """Lines of a plain-text table: the first row is the header, ruled off; columns in `left` are
    left-aligned, the rest right-aligned."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(w) if c in left else x.rjust(w) for c, (x, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def table_keys(records: list[dict]) -> list[str]:
    """vLLM's headline keys, its per-metric statistics (mean/median/std/pNN_*_ms), then ASAP's; or, for records
    without vLLM's keys, ASAP's summary keys."""
    present = [k for r in records for k in r]
    stats = list(dict.fromkeys(k for k in present if (m := _STAT.match(k)) and m.group(2) in ("ttft", "e2el")))
    if not any("completed" in r for r in records):
        return [k for k in ("max_slo_rate",) + SUMMARY_KEYS if k in present]
    return [k for k in TABLE_HEAD if k in present] + stats + [k for k in TABLE_TAIL if k in present]


def format_table(records: list[dict]) -> str:
    """Metrics as rows, one column per run headed by its label (tpot/itl are left out: a prefill decodes
    nothing)."""
    keys = table_keys(records)
    rows = [["label"] + [str(r.get("label", "?")) for r in records]]
    rows += [[k] + [_fmt(r.get(k)) for r in records] for k in keys]
    return "\n".join(text_table(rows))


def print_table(records: list[dict]) -> None:
    print(format_table(records))


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_json(path: str | Path, records: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"runs": records}, indent=2, default=_plain) + "\n")


def check_spans(spans: list[dict]) -> None:
    for i, s in enumerate(spans):
        missing = [k for k in ("worker", "kind", "start", "end") if k not in s]
        if missing:
            raise ValueError(f"span {i} lacks {', '.join(missing)}")
        if s["kind"] not in SPAN_KINDS:
            raise ValueError(f"span {i}: kind {s['kind']!r} is not one of {SPAN_KINDS}")
        if s["end"] < s["start"]:
            raise ValueError(f"span {i}: end {s['end']} is before start {s['start']}")


def write_chrome_trace(spans: list[dict], path: str | Path) -> None:
    """Chrome/Perfetto trace: times in µs, one thread (named after the worker) per worker."""
    check_spans(spans)
    tids: dict[str, int] = {}
    for s in spans:
        tids.setdefault(s["worker"], len(tids))
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": worker}}
              for worker, tid in tids.items()]
    events += [{"name": s["kind"], "cat": s["kind"], "ph": "X", "pid": 0, "tid": tids[s["worker"]],
                "ts": s["start"] * 1e6, "dur": (s["end"] - s["start"]) * 1e6} for s in spans]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, default=_plain))


def result_filename(record: dict, model: str, when: datetime) -> str:
    """vLLM's default name, {backend}-{rate}qps-{model}-{YYYYmmdd-HHMMSS}.json, with the run's label as backend."""
    rate = "inf" if record.get("rate") is None else f"{record['rate']:g}"
    label = re.sub(r"[^A-Za-z0-9.-]+", "_", str(record.get("label", "run"))).strip("_").lower()
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", Path(str(model)).name).strip("_")
    return f"{label}-{rate}qps-{name}-{when:%Y%m%d-%H%M%S}.json"


def write_result_files(records: list[dict], args) -> list[Path]:
    """`--save-result`: one JSON per run in args.result_dir (args.result_filename for a single run)."""
    if args.result_filename and len(records) > 1:
        raise ValueError(f"--result-filename names one file but there are {len(records)} runs; "
                         f"leave it out to get one file per run")
    when = datetime.now()
    paths = []
    for rec in records:
        doc = {"date": f"{when:%Y%m%d-%H%M%S}", "backend": rec.get("target", rec.get("label")),
               "label": rec.get("label"), "model_id": args.model,
               "served_model_name": getattr(args, "served_model_name", None) or args.model,
               "tokenizer_id": getattr(args, "tokenizer", None) or args.model,
               "dataset_name": getattr(args, "dataset_name", None), "num_prompts": rec.get("num_requests"),
               "request_rate": "inf" if rec.get("rate") is None else rec["rate"],
               "burstiness": getattr(args, "burstiness", None) or 1.0,
               "max_concurrency": getattr(args, "max_concurrency", None), **rec}
        path = Path(args.result_dir) / (args.result_filename or result_filename(rec, args.model, when))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
        paths.append(path)
    return paths
