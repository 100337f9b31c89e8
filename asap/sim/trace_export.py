"""Chrome / Perfetto trace of a simulated time window.

Engines record spans (group, index, name, start_s, end_s, args) when run with
`trace_window=(t0, t1)`: async -> "attention" replicas and the "experts" pool;
sync -> "rank" timelines (attention and experts ops) and the "network" collectives.
Each group becomes a process, each index a thread, each span an "X" event (µs).
Open the file in https://ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import json
from pathlib import Path


def chrome_trace(spans: list[tuple], label: str = "SIMULATED") -> dict:
    groups: dict[str, int] = {}
    events, named = [], set()
    for group, index, name, start, end, args in spans:
        pid = groups.setdefault(group, len(groups) + 1)
        if (pid, index) not in named:
            named.add((pid, index))
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": index,
                           "args": {"name": f"{group} {index}"}})
        events.append({"name": name, "cat": group, "ph": "X", "pid": pid, "tid": index,
                       "ts": start * 1e6, "dur": (end - start) * 1e6, "args": args})
    events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{label} {group}"}}
               for group, pid in groups.items()]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"label": label}}


def write_trace(spans: list[tuple], path: str | Path, label: str = "SIMULATED") -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(chrome_trace(spans, label)))
    return p
