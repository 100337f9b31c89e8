"""Prometheus metrics of the server (GET /metrics), in a registry of its own.

Counters and the TTFT histogram are updated as requests finish; everything
else (queue depth, KV store, health, per-worker busy/stall) is read from the
live objects at scrape time, so it cannot go stale.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# ok: 200; invalid: 4xx; rejected: 503, admission full (server's max_pending, or the engine's max_queue or
# SLO admission); unavailable: 503, engine unhealthy;
# failed: 5xx, the engine failed an admitted request; timeout: 504.
OUTCOMES = ("ok", "invalid", "rejected", "unavailable", "failed", "timeout")
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _Live:
    def __init__(self, snapshot: Callable[[], dict]):
        self.snapshot = snapshot

    def collect(self):
        s = self.snapshot()
        yield GaugeMetricFamily("asap_queue_depth", "requests admitted and not finished (waiting + running)",
                                value=s["queue_depth"])
        yield GaugeMetricFamily("asap_queue_capacity", "admission bound (max_pending)", value=s["queue_capacity"])
        yield GaugeMetricFamily("asap_healthy", "1 if the engine is healthy", value=float(s["healthy"]))
        yield CounterMetricFamily("asap_engine_restarts", "worker restarts after a failure", value=s["restarts"])
        yield GaugeMetricFamily("asap_kv_bytes", "bytes of unclaimed KV caches", value=s["kv_bytes"])
        yield GaugeMetricFamily("asap_kv_entries", "unclaimed KV caches", value=s["kv_entries"])
        evicted = CounterMetricFamily("asap_kv_evicted", "KV caches dropped unclaimed", labels=["reason"])
        for reason, n in s["kv_evicted"].items():
            evicted.add_metric([reason], n)
        yield evicted
        help_ = "fraction of the last metrics_window_s the worker spent "
        busy = GaugeMetricFamily("asap_worker_busy_fraction", help_ + "computing", labels=["worker"])
        stall = GaugeMetricFamily("asap_worker_stall_fraction", help_ + "waiting on peers", labels=["worker"])
        for worker, f in s["workers"].items():
            busy.add_metric([worker], f["compute"])
            stall.add_metric([worker], f["stall"])
        yield busy
        yield stall


class ServerMetrics:
    def __init__(self, snapshot: Callable[[], dict]):
        self.registry = CollectorRegistry()
        self.requests = Counter("asap_requests", "completion requests by outcome", ["outcome"],
                                registry=self.registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.ttft = Histogram("asap_ttft_seconds", "time from request arrival to first token (successful requests)",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.registry.register(_Live(snapshot))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
