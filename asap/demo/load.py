"""The machine's load, and what the demo does about it before it prints an EMULATED figure.

Emulated compute is a wait of (cost-model time x dilation); the CPU work around each wait (messages,
scheduling, Python) is what the emulation cannot stretch. When other processes hold the cores, that work
takes about load / cores times longer, so before the EMULATED part the demo multiplies the dilation by that
factor (at most MAX_RAISE, which keeps the demo within minutes; not at all where even that could not cover
the load). Around each engine's run it measures the share of a core it actually gets; where the
contention exceeded what the raised dilation covers, or the replay fell behind its own schedule, the
emulated figures are flagged and the summary draws no verdict from them.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

MAX_RAISE = 2.0         # the dilation is raised at most 2x: the emulated part's wall time doubles with it
FLAG_MARGIN = 1.5       # contention this much beyond the raise flags the figures (the probe is noisy)
PROBE_S = 0.1
LAG_FRACTION = 0.1      # a replay lag (added to every late request's TTFT) beyond 10% of the median TTFT flags


@dataclass(frozen=True)
class Load:
    load_avg: float     # 1-minute load average (runnable processes)
    cores: int

    @property
    def per_core(self) -> float:
        return self.load_avg / self.cores


def machine_load() -> Load:
    return Load(os.getloadavg()[0], os.cpu_count() or 1)


def raised_dilation(base: float, load: Load) -> float:
    """The settings' dilation, raised by the contention the load average predicts (capped). Where even the
    cap could not cover it, raising would only lengthen a run whose figures get flagged anyway: not raised."""
    if load.per_core > MAX_RAISE * FLAG_MARGIN:
        return base
    return min(base * MAX_RAISE, math.ceil(base * max(1.0, load.per_core) * 2) / 2)     # in steps of 0.5


def contention() -> float:
    """Wall time over CPU time of a short busy loop: ~1 on a free core, ~k when k runnables share it."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < PROBE_S:
        pass
    cpu = time.process_time() - cpu0
    return (time.perf_counter() - wall0) / max(cpu, 1e-6)


def flag(dilation: float, base: float, worst_contention: float, lag_ms: float | None,
         ttft_p50_ms: float | None) -> str | None:
    """Why the emulated figures are not to be trusted, or None. `lag_ms`: how far the replay fell behind its
    schedule, in emulated time; it matters against the TTFTs it is added to."""
    covered = dilation / base
    reasons = []
    if worst_contention > covered * FLAG_MARGIN:
        reasons.append(f"the demo got about 1/{worst_contention:.0f} of a core around its runs, more contention "
                       f"than dilation {dilation:g} covers")
    if lag_ms is not None and ttft_p50_ms and lag_ms > LAG_FRACTION * ttft_p50_ms:
        reasons.append(f"the replay fell behind its schedule by up to {lag_ms:.0f} ms (emulated time), over "
                       f"{LAG_FRACTION:.0%} of the median TTFT")
    return "; ".join(reasons) or None
