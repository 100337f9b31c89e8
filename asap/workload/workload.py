"""Workload: one frozen config that composes arrivals, lengths and a trace into requests.

Sources. Arrival times come from `arrivals` if given, else from `trace`;
prompt lengths come from `lengths` if given, else from `trace`. So a trace can
be replayed as is, or its lengths paired with Poisson arrivals, or everything
synthesised. Without a trace, `num_requests`, `arrivals` and `lengths` are all
required.

Transformations, in order:
1. `num_requests` keeps the first N requests (of the trace, in arrival order). With `loop`, a trace
   shorter than N is replayed again after its end (each pass shifted by the trace's span plus one
   mean gap, so its own arrival pattern repeats) until there are N; the repeats carry no block hashes
   (a prefix cache must not count them as the same prompts).
2. Arrivals: `rate` rescales them so the mean rate is exactly `rate`
   requests/s, defined as (N - 1) / (last - first arrival); or `time_scale`
   multiplies every arrival time (2.0 = half as fast). Rescaling one sample
   (instead of redrawing) keeps a rate sweep on the same requests.
3. Lengths: multiplied by `length_scale`, rounded, clipped to
   [`min_tokens`, `max_tokens`].
4. SLO: `slo` (asap.workload.slo.SLO: fixed + per-token seconds x prompt tokens, the one SLO of
   every command) sets Request.deadline = arrival + slo.budget(prompt tokens).
5. Prompts: `with_prompts=True` fills token ids in [0, vocab_size) drawn from
   (seed, request id), so the same seed gives the same prompts, independent of
   `num_requests`; `with_prompts=False` leaves prompt None (simulator).

Requests get ids 0..N-1 in arrival order; `meta["output_length"]` is set when a
trace supplies it, and `hash_ids` (prefix blocks, cut to the clipped length) when the trace has them
and its lengths are kept unscaled (scaled or synthetic lengths have no block hashes).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asap.scheduler.prefix_cache import BLOCK_TOKENS
from asap.scheduler.request import Request
from asap.workload.arrivals import ArrivalProcess
from asap.workload.lengths import LengthDistribution
from asap.workload.slo import SLO
from asap.workload.traces import read_trace

_ARRIVAL_STREAM, _LENGTH_STREAM, _PROMPT_STREAM = 0, 1, 2


@dataclass(frozen=True)
class Workload:
    trace: str | Path | None = None              # Mooncake .jsonl or Azure .csv
    arrivals: ArrivalProcess | None = None       # overrides trace arrivals
    lengths: LengthDistribution | None = None    # overrides trace lengths
    num_requests: int | None = None              # limit (required without a trace)
    rate: float | None = None                    # rescale arrivals to this mean rate (req/s)
    time_scale: float = 1.0                      # multiply arrival times (ignored if rate is set)
    length_scale: float = 1.0
    min_tokens: int = 1
    max_tokens: int | None = None
    slo: SLO | None = None                       # TTFT budget per request (None: no deadlines)
    seed: int = 0
    with_prompts: bool = True
    vocab_size: int = 32000
    loop: bool = False                           # replay a trace shorter than num_requests (see above)

    def __post_init__(self):
        if self.trace is None and (self.arrivals is None or self.lengths is None or self.num_requests is None):
            raise ValueError("without a trace, a workload needs arrivals, lengths and num_requests")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of requests/s, got {self.rate!r}")
        if self.rate is not None and self.time_scale != 1.0:
            raise ValueError("set either rate or time_scale, not both")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if not self.length_scale > 0:
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens={self.max_tokens} is below min_tokens={self.min_tokens}")
        if self.slo is not None and not isinstance(self.slo, SLO):
            raise ValueError(f"slo must be an asap.workload.slo.SLO (parse_slo('2s+1ms/tok')), got {self.slo!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")

    def build(self) -> list[Request]:
        trace = read_trace(self.trace) if self.trace is not None else None
        n = len(trace) if trace is not None else self.num_requests
        if self.num_requests is not None:
            n = self.num_requests if self.loop and trace is not None else min(n, self.num_requests)
        arrival_rng = np.random.default_rng([self.seed, _ARRIVAL_STREAM])
        length_rng = np.random.default_rng([self.seed, _LENGTH_STREAM])
        m = len(trace) if trace is not None else n
        src = np.arange(n) % m                       # which trace record each request replays
        if self.arrivals is not None:
            times = self.arrivals.times(n, arrival_rng)
        else:
            t = np.asarray(trace.arrivals, dtype=float)
            period = (t[-1] - t[0]) * m / (m - 1) if m > 1 else 1.0     # the span plus one mean gap
            times = t[src] + (np.arange(n) // m) * period
        times = self._scale_times(np.asarray(times, dtype=float))
        raw = self.lengths.sample(n, length_rng) if self.lengths is not None else np.asarray(trace.input_lengths)[src]
        lengths = np.rint(np.asarray(raw) * self.length_scale).astype(np.int64)
        lengths = np.clip(lengths, self.min_tokens, self.max_tokens)

        keep_hashes = trace is not None and self.lengths is None and self.length_scale == 1.0
        hashes = trace.hash_ids if keep_hashes else ()
        requests = []
        for i in range(n):
            num_tokens = int(lengths[i])
            arrival = float(times[i])
            meta = {"output_length": int(trace.output_lengths[src[i]])} if trace is not None else {}
            requests.append(Request(id=i, num_tokens=num_tokens, arrival=arrival,
                                    deadline=self._deadline(arrival, num_tokens),
                                    prompt=self._prompt(i, num_tokens), meta=meta,
                                    hash_ids=hashes[i][:-(-num_tokens // BLOCK_TOKENS)] if hashes and i < m else ()))
        return requests

    def _scale_times(self, times: np.ndarray) -> np.ndarray:
        if self.rate is None:
            return times * self.time_scale
        if len(times) < 2:
            return times - times[:1].sum()
        span = times[-1] - times[0]
        if span <= 0:
            raise ValueError("cannot rescale to a rate: all arrivals share one timestamp")
        return (times - times[0]) * ((len(times) - 1) / span / self.rate)

    def _deadline(self, arrival: float, num_tokens: int) -> float | None:
        return None if self.slo is None else arrival + self.slo.budget(num_tokens)

    def _prompt(self, request_id: int, num_tokens: int) -> list[int] | None:
        if not self.with_prompts:
            return None
        rng = np.random.default_rng([self.seed, _PROMPT_STREAM, request_id])
        return rng.integers(0, self.vocab_size, size=num_tokens).tolist()
