"""Trace readers: Mooncake JSONL and Azure LLM-inference CSV.

Both return a `Trace`: arrival times in seconds relative to the earliest
request (so the trace starts at 0.0), sorted by arrival, with prompt and output
lengths, and the prompts' prefix-block hashes where the trace has them. Any
problem with the file raises ValueError naming the file and, for a bad record,
its 1-based line number.

- Mooncake (`*.jsonl`): one JSON object per line with `timestamp` (ms),
  `input_length`, `output_length` and optionally `hash_ids` (one int per 512-token
  prefix block, at most ceil(input_length / 512) of them); other keys are ignored.
- Azure (`*.csv`): header `TIMESTAMP,ContextTokens,GeneratedTokens`, where
  TIMESTAMP is a datetime string such as `2023-11-16 18:15:46.6805900`. No block hashes.

Either may be gzip-compressed (`*.jsonl.gz`, `*.csv.gz`). `default_trace_path()`
is the Mooncake sample shipped inside the package (asap/workload/data/).
"""
from __future__ import annotations

import csv
import gzip
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from asap.scheduler.prefix_cache import BLOCK_TOKENS


@dataclass(frozen=True, eq=False)
class Trace:
    arrivals: np.ndarray        # seconds from the first request, sorted
    input_lengths: np.ndarray   # int64 prompt tokens, >= 1
    output_lengths: np.ndarray  # int64 generated tokens, >= 0
    hash_ids: tuple = ()        # per request, a tuple of prefix-block hashes; () when the trace has none

    def __len__(self) -> int:
        return len(self.arrivals)


DATA_DIR = Path(__file__).resolve().parent / "data"


def default_trace_path() -> Path:
    """The default trace of `asap demo`, `asap bench` and `asap sim`: the first 20 minutes (3,658
    requests) of Mooncake's conversation trace, shipped in the package (see asap/workload/data/README.md)."""
    return DATA_DIR / "mooncake_conversation_sample.jsonl.gz"


def read_trace(path: str | Path) -> Trace:
    """Pick the reader by suffix: .jsonl -> Mooncake, .csv -> Azure (either may end in .gz)."""
    name = Path(path).name.lower().removesuffix(".gz")
    suffix = Path(name).suffix
    if suffix in (".jsonl", ".json"):
        return read_mooncake(path)
    if suffix == ".csv":
        return read_azure(path)
    raise ValueError(f"{path}: unknown trace format {suffix!r}; expected .jsonl (Mooncake) or .csv (Azure)")


def _open(path: str | Path):
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"trace file not found: {p}")
    if p.suffix.lower() == ".gz":
        return gzip.open(p, "rt", newline="", encoding="utf-8")
    return p.open(newline="", encoding="utf-8")


def _int_field(value, name: str, where: str, minimum: int) -> int:
    try:
        x = int(value)
        if x != float(value):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be an integer, got {value!r}") from None
    if x < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {x}")
    return x


def _hash_ids(value, input_length: int, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in value):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    most = -(-input_length // BLOCK_TOKENS)
    if len(value) > most:
        raise ValueError(f"{where}: {len(value)} hash_ids but input_length={input_length} holds at most {most} "
                         f"blocks of {BLOCK_TOKENS} tokens")
    return tuple(value)


def _build(path, times: list[float], inputs: list[int], outputs: list[int], hashes: list | None = None) -> Trace:
    if not times:
        raise ValueError(f"{path}: trace has no requests")
    t = np.asarray(times, dtype=float)
    order = np.argsort(t, kind="stable")
    return Trace(arrivals=t[order] - t[order[0]],
                 input_lengths=np.asarray(inputs, dtype=np.int64)[order],
                 output_lengths=np.asarray(outputs, dtype=np.int64)[order],
                 hash_ids=tuple(hashes[i] for i in order) if hashes and any(hashes) else ())


def read_mooncake(path: str | Path) -> Trace:
    times, inputs, outputs, hashes = [], [], [], []
    with _open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: malformed JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in rec:
                    raise ValueError(f"{where}: missing field {key!r}")
            ts = rec["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not np.isfinite(ts):
                raise ValueError(f"{where}: timestamp must be a number of ms, got {ts!r}")
            times.append(ts / 1000.0)
            inputs.append(_int_field(rec["input_length"], "input_length", where, 1))
            outputs.append(_int_field(rec["output_length"], "output_length", where, 0))
            hashes.append(_hash_ids(rec["hash_ids"], inputs[-1], where) if "hash_ids" in rec else ())
    return _build(path, times, inputs, outputs, hashes)


_FRACTION = re.compile(r"\.(\d+)")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(path: str | Path) -> Trace:
    times, inputs, outputs = [], [], []
    with _open(path) as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}:1: CSV header lacks column(s) {', '.join(missing)}; got {header}")
        col = {c: header.index(c) for c in AZURE_COLUMNS}
        for row in reader:
            lineno = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            where = f"{path}:{lineno}"
            if len(row) != len(header):
                raise ValueError(f"{where}: expected {len(header)} fields, got {len(row)}")
            stamp = row[col["TIMESTAMP"]].strip()
            try:
                times.append(_parse_datetime(stamp))
            except ValueError:
                raise ValueError(f"{where}: TIMESTAMP is not a datetime: {stamp!r}") from None
            inputs.append(_int_field(row[col["ContextTokens"]].strip(), "ContextTokens", where, 1))
            outputs.append(_int_field(row[col["GeneratedTokens"]].strip(), "GeneratedTokens", where, 0))
    return _build(path, times, inputs, outputs)


def _parse_datetime(stamp: str) -> float:
    """Seconds since the epoch (naive stamps read as UTC); any number of fractional digits."""
    stamp = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], stamp, count=1)
    dt = datetime.fromisoformat(stamp)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
