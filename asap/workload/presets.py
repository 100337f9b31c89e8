"""Named workloads for the tuner and the headline: a name (or a trace path) -> requests without deadlines.

- "conversation": Mooncake's conversation trace (the shipped sample, or the full file from $ASAP_TRACE_DIR), its own bursty arrivals
- "synthetic":    Mooncake's synthetic trace, its own (Poisson) arrivals
- "fixed-2k", "fixed-4k", "fixed-8k": fixed prompt lengths, Poisson arrivals
- "lognormal":    log-normal lengths (mean 4K, sigma 1), Poisson arrivals
- a path to any Mooncake .jsonl or Azure-format .csv: that trace's lengths and arrivals
Only the arrival *pattern* matters: the rate search rescales arrivals to each rate tried. A trace shorter
than the requests asked for is replayed again after its end, its own arrival pattern repeated
(Workload.loop): a steady state at a high rate can need more requests than a trace holds.
Prompts longer than one replica can hold are not clipped: chunked prefill serves any length (each
chunk attends to the KV of the earlier chunks), and the tuner's attention TP shortens long prompts;
`max_tokens` clips them where a study asks for it.
"""
from __future__ import annotations

import os
from pathlib import Path

from asap.scheduler.request import Request
from asap.workload.arrivals import Poisson
from asap.workload.lengths import Fixed, LogNormal
from asap.workload.traces import default_trace_path
from asap.workload.workload import Workload

TRACE_DIR_ENV = "ASAP_TRACE_DIR"   # a folder with the full Mooncake traces (e.g. ../shared/traces)
TRACES = {"conversation": "mooncake_conversation.jsonl", "synthetic": "mooncake_synthetic.jsonl"}
SYNTHETIC = {"fixed-2k": Fixed(2048), "fixed-4k": Fixed(4096), "fixed-8k": Fixed(8192),
             "lognormal": LogNormal(4096, 1.0)}
NAMES = (*TRACES, *SYNTHETIC)


def trace_path(name: str) -> Path:
    """The full trace from $ASAP_TRACE_DIR when set; else, for "conversation", the sample shipped in the package
    (its first 3,658 requests). Nothing outside the package is looked up by default."""
    folder = os.environ.get(TRACE_DIR_ENV)
    if folder:
        p = Path(folder) / TRACES[name]
        if not p.is_file():
            raise ValueError(f"workload {name!r}: {p} not found (${TRACE_DIR_ENV}={folder})")
        return p
    if name == "conversation":
        return default_trace_path()
    raise ValueError(f"workload {name!r} needs the full Mooncake traces: set {TRACE_DIR_ENV} to the folder "
                     f"holding {TRACES[name]}")


def workload_requests(name: "str | Path", num_requests: int, seed: int = 0,
                      max_tokens: int | None = None) -> list[Request]:
    """The first `num_requests` requests of workload `name` (see the module docstring), no deadlines."""
    if num_requests < 2:
        raise ValueError(f"a workload needs >= 2 requests, got {num_requests}")
    key = str(name)
    if key in TRACES:
        wl = Workload(trace=trace_path(key), num_requests=num_requests, max_tokens=max_tokens, with_prompts=False,
                      loop=True)
    elif key in SYNTHETIC:
        wl = Workload(arrivals=Poisson(1.0), lengths=SYNTHETIC[key], num_requests=num_requests, seed=seed,
                      max_tokens=max_tokens, with_prompts=False)
    elif Path(key).suffix in (".jsonl", ".csv", ".gz"):
        if not Path(key).is_file():
            raise ValueError(f"workload trace {key} not found")
        wl = Workload(trace=key, num_requests=num_requests, max_tokens=max_tokens, with_prompts=False, loop=True)
    else:
        raise ValueError(f"unknown workload {key!r}; choose one of {', '.join(NAMES)} or a .jsonl/.csv trace path")
    return wl.build()
