"""Prometheus metrics (GET /metrics) with vLLM's names under the `asap:` prefix, each labelled model_name.

vLLM's: asap:time_to_first_token_seconds, asap:e2e_request_latency_seconds,
asap:request_queue_time_seconds (histograms), asap:num_requests_running / _waiting,
asap:prompt_tokens_total, asap:request_success_total{finished_reason}.
ASAP's own beside them: asap:requests_total{outcome}, queue capacity, health, restarts, KV store,
per-worker busy/stall. Gauges are read from the live objects at scrape time, so they cannot go stale.
"""
from __future__ import annotations

import time
from typing import Callable

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()          # as vLLM does: no *_created series beside every counter and histogram

# ok: 200; invalid: 4xx; rejected: 503, admission full (server's max_pending, or the engine's max_queue or
# SLO admission); unavailable: 503, engine unhealthy or shutting down;
# failed: 5xx, the engine failed an admitted request; timeout: 504 (the engine's work is cancelled);
# aborted: the client hung up before its answer was complete (the engine's work is cancelled).
OUTCOMES = ("ok", "invalid", "rejected", "unavailable", "failed", "timeout", "aborted")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)          # vLLM's
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)           # vLLM's


class _Live:
    def __init__(self, snapshot: Callable[[], dict], model: str):
        self.snapshot, self.model = snapshot, model

    def _gauge(self, name, help_, value, labels=(), values=()):
        g = GaugeMetricFamily(name, help_, labels=["model_name", *labels])
        g.add_metric([self.model, *values], value)
        return g

    def collect(self):
        s, m = self.snapshot(), self.model
        yield self._gauge("asap:num_requests_running", "requests the engine is prefilling", s["running"])
        yield self._gauge("asap:num_requests_waiting", "requests admitted and not yet scheduled", s["waiting"])
        yield self._gauge("asap:queue_capacity", "admission bound (--max-pending)", s["queue_capacity"])
        yield self._gauge("asap:healthy", "1 if the engine is healthy", float(s["healthy"]))
        restarts = CounterMetricFamily("asap:engine_restarts", "worker restarts after a failure", labels=["model_name"])
        restarts.add_metric([m], s["restarts"])
        yield restarts
        yield self._gauge("asap:kv_store_bytes", "bytes of unclaimed KV caches", s["kv_bytes"])
        yield self._gauge("asap:kv_store_entries", "unclaimed KV caches", s["kv_entries"])
        for name, key, help_ in (("asap:kv_store_stored", "kv_stored", "KV caches kept for a remote decode"),
                                 ("asap:kv_store_claimed", "kv_claimed", "KV caches pulled by a decode side")):
            c = CounterMetricFamily(name, help_, labels=["model_name"])
            c.add_metric([m], s[key])
            yield c
        evicted = CounterMetricFamily("asap:kv_store_evicted", "KV caches dropped unclaimed",
                                      labels=["model_name", "reason"])
        for reason, n in s["kv_evicted"].items():
            evicted.add_metric([m, reason], n)
        yield evicted
        help_ = "fraction of the last metrics_window_s the worker spent "
        busy = GaugeMetricFamily("asap:worker_busy_fraction", help_ + "computing", labels=["model_name", "worker"])
        stall = GaugeMetricFamily("asap:worker_stall_fraction", help_ + "waiting on peers",
                                  labels=["model_name", "worker"])
        for worker, f in s["workers"].items():
            busy.add_metric([m, worker], f["compute"])
            stall.add_metric([m, worker], f["stall"])
        yield busy
        yield stall


class ServerMetrics:
    def __init__(self, snapshot: Callable[[], dict], model_name: str = ""):
        self.model = model_name
        r = self.registry = CollectorRegistry()
        label = ["model_name"]
        self.requests = Counter("asap:requests", "requests by outcome (ASAP's own)", label + ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(model_name, outcome)
        self.success = Counter("asap:request_success", "successful requests by finish reason",
                               label + ["finished_reason"], registry=r)
        self.success.labels(model_name, "length")
        self.success.labels(model_name, "abort")     # as vLLM counts a request its client abandoned
        self.prompt_tokens = Counter("asap:prompt_tokens", "prefilled prompt tokens", label, registry=r)
        self.ttft = Histogram("asap:time_to_first_token_seconds", "arrival at the server to first token, per prompt",
                              label, buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("asap:e2e_request_latency_seconds", "arrival to the last byte of the answer", label,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("asap:request_queue_time_seconds", "engine submit to first scheduled, per prompt",
                               label, buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens.labels(model_name)
        r.register(_Live(snapshot, model_name))

    def count(self, outcome: str) -> None:
        self.requests.labels(self.model, outcome).inc()

    def observe_first_token(self, out, arrival: float) -> None:
        self.ttft.labels(self.model).observe(time.monotonic() - arrival)
        t = getattr(out, "timings", None) or {}
        if "started" in t and "submitted" in t:
            self.queue.labels(self.model).observe(max(0.0, t["started"] - t["submitted"]))

    def finish(self, outcome: str, arrival: float, prompt_tokens: int) -> None:
        self.count(outcome)
        if outcome == "aborted":
            self.success.labels(self.model, "abort").inc()
        if outcome == "ok":
            self.success.labels(self.model, "length").inc()
            self.prompt_tokens.labels(self.model).inc(prompt_tokens)
            self.e2e.labels(self.model).observe(time.monotonic() - arrival)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
