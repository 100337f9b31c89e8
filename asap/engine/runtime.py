"""The async and sync engines: the same engine process around different worker loops.

mode="async": A attention replicas + E expert workers (N = A + E devices); with colocated, N = E = A x
              attention_tp devices, each running a replica's attention and an expert shard (asap.workers.layout);
              a co-located length-aware fleet adds wide_replicas replicas of wide_tp devices for long prompts.
mode="sync":  N ranks, each an attention replica plus 1/N of the experts.
The engine routes each request to a replica with the shared router policy,
collects results, and watches the workers: when one dies or misses its heartbeats
(hung, SIGSTOPped, deadlocked), every request in flight fails with EngineUnavailable (retriable) and
the engine reports itself unhealthy until restart(). After close() every method raises EngineClosed.
Cancelling a request's future (Future.cancel(), e.g. the server's client hung up) aborts it: the engine
forgets it and tells its replica, which drops it between steps (its remaining chunks are never scheduled;
a step already running finishes, and its result is dropped).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError

import torch

from asap.comm.shm_names import unlink_semaphores
from asap.config import ModelConfig, RuntimeConfig
from asap.engine.errors import EngineClosed, EngineUnavailable, EngineUnhealthy  # noqa: F401 - re-exported
from asap.workers.layout import build_layout, replica_cost
from asap.engine.output import PrefillOutput, PromptLogprobs
from asap.model.loader import runtime_dtype
from asap.scheduler.admission import SLOAdmission
from asap.scheduler.errors import QueueFull, Rejected
from asap.scheduler.request import Request
from asap.scheduler.placement import Placement, RoutingStats, balanced_placement
from asap.engine.loads import ReplicaBook
from asap.scheduler.length_router import LengthRouter
from asap.scheduler.router import QueueAwareRouter, make_router
from asap.workers.launcher import Cluster
from asap.workers.messages import Abort, Failure, Planned, Result, RoutingCounts, Spans, Started, Submit
from asap.workers.spans import SpanLog, fractions


class RuntimeEngine:
    def __init__(self, model_dir, mode: str = "async", dtype=None, device=torch.device("cpu"),
                 runtime: RuntimeConfig | None = None, send_kv: bool = True, **overrides):
        rt = dataclasses.replace(runtime or RuntimeConfig(), **overrides)
        self.mode, self.runtime = mode, rt
        self.cfg = ModelConfig.from_dir(model_dir)
        # dtype None: the checkpoint's torch_dtype, resolved once here so every worker gets the same name.
        self.dtype = runtime_dtype(self.cfg, dtype)
        self.emulated = rt.compute == "emulated"
        self.num_replicas = len(rt.replica_tps) if mode == "async" else rt.devices // rt.attention_tp
        self._layout_args = (self.cfg, rt, mode, str(model_dir), str(self.dtype).removeprefix("torch."),
                             str(device), send_kv)
        self.placement: Placement | None = None          # None: the layout's default
        self.routing_stats = RoutingStats(self.cfg.num_layers, self.cfg.num_experts)
        cost = replica_cost(self.cfg, rt, mode)
        self.router = make_router(rt.router, cost)
        # Per replica: the cost that predicts its step in progress (asap.engine.loads) and its predicted TTFT for
        # admission, whatever the router. A length-aware fleet's wide replicas have their own TP, and the router
        # picks the group by the prompt's length (asap.scheduler.length_router), as in the simulator.
        self.router_costs = [cost] * self.num_replicas
        self.predictors = [QueueAwareRouter(cost)] * self.num_replicas
        if mode == "async" and rt.short_replicas:       # the lane: the first short_replicas narrow replicas
            self.router = LengthRouter(make_router(rt.router, cost), self.router,
                                       set(range(rt.short_replicas, rt.attention_workers)), rt.short_below_tokens,
                                       one_way=True)
        if mode == "async" and rt.wide_replicas:
            wide_cost = replica_cost(self.cfg, rt, mode, rt.wide_tp)
            narrow = rt.attention_workers
            self.router = LengthRouter(self.router, make_router(rt.router, wide_cost),
                                       set(range(narrow, self.num_replicas)), rt.wide_from_tokens)
            self.router_costs[narrow:] = [wide_cost] * rt.wide_replicas
            self.predictors[narrow:] = [QueueAwareRouter(wide_cost)] * rt.wide_replicas
        self.admission = SLOAdmission(rt.admission, rt.admission_slack)
        self.max_outstanding = rt.max_queue * self.num_replicas
        self._lock = threading.Lock()
        self._futures: dict[int, tuple[Future, int, float]] = {}      # id -> (future, replica, submitted)
        self._loads = [ReplicaBook() for _ in range(self.num_replicas)]   # the router's view (asap.engine.loads)
        self._started: dict[int, float] = {}                          # id -> first scheduled (running requests)
        self.spans = SpanLog()        # {worker: spans}, bounded per worker
        self.errors: list[str] = []
        self.num_aborted = 0
        self._closing = self._closed = False
        self._start()
        self._watchdog = threading.Thread(target=self._watch, name="asap-watchdog", daemon=True)
        self._watchdog.start()

    def _start(self):
        self._stopping = True
        layout = build_layout(*self._layout_args, placement=self.placement)
        self.placement = layout.specs[0].placement
        cluster = Cluster(layout.specs, layout.transport)
        try:
            cluster.wait_ready()            # before the collector thread can see (and eat) the Ready messages
        except Exception:
            cluster.close()
            raise
        # Every worker has now opened the shared-memory rings and the queues' semaphores: drop their names
        # from /dev/shm, so that not even a SIGKILL of the whole process group leaves them behind.
        if hasattr(cluster.transport_spec, "unlink_names"):
            cluster.transport_spec.unlink_names()
        unlink_semaphores(cluster.results, cluster.controls, cluster.stops)
        self.cluster = cluster
        for msg in cluster.early:
            self._handle(msg)
        self.errors.clear()
        self._stopping = False
        # One collector per cluster: one stuck on a dead cluster's queue cannot hold up the new one.
        self._collector = threading.Thread(target=self._collect, args=(cluster,), name="asap-collector", daemon=True)
        self._collector.start()

    def restart(self) -> None:
        """Stop every worker and start them again (each reloads its weights); requests in flight fail."""
        self._check_open()
        self._stopping = True
        self._fail_all("engine restarting")
        self.cluster.close()
        self._start()

    # ---- requests -------------------------------------------------------------------------------
    def submit(self, request_id: int, prompt: list[int] | None, deadline: float | None = None,
               num_tokens: int | None = None, prompt_logprobs: int | None = None) -> Future:
        self._check_open()
        fut: Future = Future()
        n = len(prompt) if prompt is not None else num_tokens
        if not self.healthy():
            fut.set_exception(EngineUnavailable(f"engine unhealthy: {'; '.join(self.errors[-3:])}"))
            return fut
        now = time.monotonic()
        req = Request(request_id, n, now, deadline)
        with self._lock:
            if len(self._futures) >= self.max_outstanding:
                fut.set_exception(QueueFull(f"{len(self._futures)} requests in flight (max_queue x replicas)"))
                return fut
            loads = [book.load(i) for i, book in enumerate(self._loads)]
            replica = self.router.route(req, loads, now)
            try:
                self.admission.admit(req, self.predictors[replica].predict(req, loads[replica], now) - now, now)
            except Rejected as e:
                fut.set_exception(e)
                return fut
            self._futures[request_id] = (fut, replica, now)
            self._loads[replica].add(request_id, n)
        self.cluster.controls[replica].put(Submit(request_id, None if self.emulated else prompt, n, now, deadline,
                                                  req.priority, prompt_logprobs))
        fut.add_done_callback(lambda f: f.cancelled() and self._abort(request_id))
        return fut

    def _abort(self, request_id: int) -> None:
        """The caller cancelled the future: forget the request and have its replica drop it."""
        with self._lock:
            entry = self._futures.pop(request_id, None)
            if entry is None:           # already answered, failed or forgotten
                return
            self._loads[entry[1]].pop(request_id, None)
            self._started.pop(request_id, None)
            self.num_aborted += 1
        try:
            self.cluster.controls[entry[1]].put(Abort(request_id))
        except (OSError, ValueError, AssertionError):     # a cluster closed meanwhile: nothing left to drop
            pass

    def _collect(self, cluster):
        while not self._closing and cluster is self.cluster:
            try:
                msg = cluster.results.get(timeout=0.1)
            except queue.Empty:
                continue
            except (OSError, ValueError, EOFError):   # the queue of a cluster closed by restart()/close()
                time.sleep(0.05)
                continue
            self._handle(msg)

    def _watch(self):
        """Fail everything in flight as soon as a worker dies or goes silent (never blocks on a queue)."""
        reported: tuple = (None, set())                  # (cluster, silent workers already failed once)
        while not self._closing:
            cluster = self.cluster
            if reported[0] is not cluster:
                reported = (cluster, set())
            dead, silent = cluster.dead(), cluster.silent()
            if (dead or silent) and not self._stopping and cluster is self.cluster:
                if dead:
                    self._fail_all(f"worker(s) died: {dead}")
                for name, quiet_s in silent.items():
                    self._fail_all(f"{name} missed its heartbeats for {quiet_s:.1f}s (hung or stopped)",
                                   record=name not in reported[1])
                    reported[1].add(name)
            time.sleep(0.05)

    def _handle(self, msg):
        if isinstance(msg, Result):
            with self._lock:
                entry = self._futures.pop(msg.request_id, None)
                self._loads[msg.replica].pop(msg.request_id, None)
                started = self._started.pop(msg.request_id, None)
            if entry is None:
                return
            fut, _, submitted = entry
            try:                # the caller may cancel the future at any moment (InvalidStateError then)
                if msg.error:   # a full replica queue, or a peer that did not answer: both worth a retry
                    fut.set_exception(QueueFull(msg.error) if "queue full" in msg.error else
                                      EngineUnavailable(msg.error))
                else:
                    fut.set_result(PrefillOutput(msg.first_token, msg.logits, msg.kv or [], 0, msg.request_id,
                                                 {"submitted": submitted, "finished": msg.finished_at,
                                                  **({"started": started} if started is not None else {})},
                                                 PromptLogprobs.from_parts(msg.prompt_logprobs)))
            except InvalidStateError:
                pass
        elif isinstance(msg, Planned):
            with self._lock:
                self._loads[msg.replica].planned(msg.step, time.monotonic(), self.router_costs[msg.replica])
        elif isinstance(msg, Started):
            with self._lock:
                if msg.request_id in self._futures:
                    self._started[msg.request_id] = msg.at
        elif isinstance(msg, RoutingCounts):
            for layer, counts in enumerate(msg.counts):
                self.routing_stats.record(layer, counts)
        elif isinstance(msg, Spans):
            self.spans.add(msg.worker, msg.spans)
        elif isinstance(msg, Failure):
            self._fail_all(f"{msg.worker} failed: {msg.error.strip().splitlines()[-1]}")

    def _fail_all(self, error: str, record: bool = True):
        if record and error not in self.errors:
            self.errors.append(error)
        with self._lock:
            pending, self._futures = self._futures, {}
            self._started.clear()
            for l in self._loads:
                l.clear()
        for fut, _, _ in pending.values():
            try:
                fut.set_exception(EngineClosed(error) if self._closed else EngineUnavailable(error))
            except InvalidStateError:       # cancelled by its caller meanwhile
                pass

    def rebalance(self, num_redundant: int) -> Placement:
        """Recompute expert placement from the routing statistics gathered so far (EPLB-style:
        hot experts get `num_redundant` extra copies per layer) and restart the workers with it.
        Outputs do not change: only which worker computes which (token, expert) pair."""
        self._check_open()
        loads = self.routing_stats.loads()
        self.placement = balanced_placement(loads, self.placement.num_workers, num_redundant)
        self.restart()
        return self.placement

    # ---- health, stats, shutdown ----------------------------------------------------------------
    def healthy(self) -> bool:
        self._check_open()
        return not self.errors and not self.cluster.dead()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed()

    def num_running(self) -> int:
        """Requests whose prefill has started on a replica (the rest of those in flight are waiting)."""
        return len(self._started)

    def worker_fractions(self, start: float | None = None, end: float | None = None) -> dict[str, dict]:
        """Busy (compute), stall and idle fractions per worker over [start, end] (monotonic clock)."""
        self._check_open()
        return {w: fractions(s, start, end) for w, s in sorted(self.spans.items())}

    def close(self) -> None:
        if getattr(self, "_closed", True) or not hasattr(self, "_watchdog"):
            return
        self._closed = self._stopping = True
        self._fail_all("engine is closed")
        self.cluster.close()
        self._closing = True
        self._watchdog.join(timeout=1)
        self._collector.join(timeout=1)
