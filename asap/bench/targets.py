"""Benchmark targets by name: the in-process engines, the simulator, an HTTP server.

    async | sync | reference   an asap.LLM started once and reused for every run
    sim-async | sim-sync       the discrete-event simulator (results are SIMULATED)
    http                       an OpenAI-compatible server (HttpTarget)

Every target has `label` and `run(requests) -> list[RequestResult]`; engine
targets also keep the last run's window so `workers()` (busy/stall/idle
fractions) and `spans()` (timeline) cover exactly that run. The label says
when figures are not measured on real compute: "(emulated)" or "(SIMULATED)".
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from functools import partial
from pathlib import Path

from asap.bench.http_target import HttpTarget
from asap.measure.metrics import RequestResult
from asap.bench.runner import SimulatedTarget, future_submit, replay
from asap.config import ModelConfig, RuntimeConfig
from asap.scheduler.request import Request
from asap.workload.traces import default_trace_path

TARGETS = ("async", "sync", "reference", "sim-async", "sim-sync", "http")
SPAN_FLUSH_S = 0.6      # workers send their spans every 0.5 s (asap/workers/spans.py)


def default_trace() -> Path:
    """The Mooncake sample shipped in the package (nothing is looked up outside it)."""
    return default_trace_path()


def model_config(model: str) -> ModelConfig:
    """The model's config without materialising weights (a preset name or an HF directory)."""
    from asap.model.presets import preset_config
    if (Path(model) / "config.json").is_file():
        return ModelConfig.from_dir(model)
    return ModelConfig.from_hf(preset_config(model))


class EngineTarget:
    """An asap.LLM engine; started in __init__ (workers load their weights), closed by close()."""

    def __init__(self, engine: str, model: str, runtime: RuntimeConfig, progress: bool = True,
                 timeout: float | None = None, max_concurrency: int | None = None):
        from asap.engine.llm import LLM
        kwargs = {} if engine == "reference" else dict(runtime=runtime, send_kv=False)
        t0 = time.monotonic()
        self.llm = LLM(model, engine=engine, **kwargs)
        self.emulated = engine != "reference" and runtime.compute == "emulated"
        self.label = engine + (f" (emulated, {runtime.hardware} x{runtime.dilation:g})" if self.emulated else "")
        self.dilation = runtime.dilation if self.emulated else 1.0
        self.progress, self.timeout, self.max_concurrency = progress, timeout, max_concurrency
        self._ids = itertools.count(1 << 40)      # never collides with LLM.submit's own ids
        self.window: tuple[float, float] | None = None
        try:
            self._submit_one(Request(0, 16, prompt=[0] * 16)).result()     # warm-up: first-call costs stay out
        except BaseException:
            self.llm.close()
            raise
        self.startup_s = time.monotonic() - t0

    def _submit_one(self, req: Request):
        if self.emulated:
            return self.llm.engine.submit(next(self._ids), None, req.deadline, num_tokens=req.num_tokens)
        return self.llm.engine.submit(next(self._ids), req.prompt, req.deadline)

    def prefill_seconds(self, num_tokens: int) -> float:
        """Wall time of one lone prompt of `num_tokens` tokens on the idle engine."""
        t0 = time.monotonic()
        self._submit_one(Request(0, num_tokens, prompt=[1] * num_tokens)).result()
        return time.monotonic() - t0

    def run(self, requests: list[Request]) -> list[RequestResult]:
        if not self.emulated and any(r.prompt is None for r in requests):
            raise ValueError("real compute needs prompts; build the workload with with_prompts=True")
        start = time.monotonic()
        d = self.dilation
        if d != 1.0:    # emulated time runs d x slower: replay d x slower, report in emulated-hardware time
            requests = [dataclasses.replace(r, arrival=r.arrival * d, deadline=None if r.deadline is None
                                            else r.arrival * d + (r.deadline - r.arrival) * d) for r in requests]
        results = asyncio.run(replay(future_submit(self._submit_one), requests, self.progress, self.timeout,
                                     self.max_concurrency))
        if d != 1.0:
            results = [dataclasses.replace(x, arrival=x.arrival / d, ttft=None if x.ttft is None else x.ttft / d,
                                           deadline_s=None if x.deadline_s is None else x.deadline_s / d)
                       for x in results]
        self.window = (start, time.monotonic())
        self._flush_spans()
        return results

    def _flush_spans(self) -> None:
        # An idle attention replica only sends its spans after its next step: run a 1-token probe
        # once the flush interval has passed. The probe falls outside the run's window.
        if not hasattr(self.llm.engine, "spans"):
            return
        time.sleep(SPAN_FLUSH_S)
        self._submit_one(Request(0, 1, prompt=[0])).result(timeout=60)
        time.sleep(0.2)

    def workers(self) -> dict[str, dict[str, float]]:
        """{worker: {compute, stall, idle}} fractions over the last run (empty for the reference engine)."""
        if self.window is None or not hasattr(self.llm.engine, "worker_fractions"):
            return {}
        return self.llm.engine.worker_fractions(*self.window)

    def spans(self) -> list[dict]:
        """The last run's worker spans, clipped to its window, times in seconds from its start."""
        if self.window is None or not hasattr(self.llm.engine, "spans"):
            return []
        t0, t1 = self.window
        return [{"worker": w, "kind": kind, "start": max(s, t0) - t0, "end": min(e, t1) - t0}
                for w, spans in sorted(self.llm.engine.spans.items()) for kind, s, e in spans if e > t0 and s < t1]

    def close(self) -> None:
        self.llm.close()


def sim_target(engine: str, model: str, runtime: RuntimeConfig, devices: int) -> SimulatedTarget:
    """The simulator with the engine's layout and policies (asap.sim.from_runtime.engine_spec: a runtime
    field it cannot honour is an error); `runtime.hardware` picks the profile."""
    from asap.sim.from_runtime import engine_spec
    from asap.sim.run import simulate
    spec = model if not (Path(model) / "config.json").is_file() else ModelConfig.from_dir(model)
    fn = partial(simulate, engine=engine_spec(runtime, engine, spec, devices))
    return SimulatedTarget(fn, label=f"sim-{engine} (SIMULATED, {runtime.hardware})")


def make_target(name: str, model: str, runtime: RuntimeConfig, url: str | None = None, progress: bool = True,
                timeout: float | None = None, served_model_name: str | None = None,
                endpoint: str = "/v1/completions", stream: bool = True, max_concurrency: int | None = None,
                ignore_eos: bool = False, max_tokens: int = 1):
    """A target by name. `runtime.devices` is the sync rank count; async uses A + E. For http, `model` is
    the local config and `served_model_name` (default: `model`) the name sent to the server."""
    if name in ("async", "sync", "reference"):     # sync ranks are co-located by construction: the flag is async's
        rt = dataclasses.replace(runtime, colocated=False) if name == "sync" else runtime
        return EngineTarget(name, model, rt, progress, timeout, max_concurrency)
    if name in ("sim-async", "sim-sync"):
        return sim_target(name.removeprefix("sim-"), model, runtime, runtime.devices)
    if name == "http":
        if not url:
            raise ValueError("--target http needs --base-url (or --host/--port)")
        return HttpTarget(url, served_model_name or model, label=f"http {url}", progress=progress,
                          timeout=timeout or 600.0, endpoint=endpoint, stream=stream,
                          max_concurrency=max_concurrency, ignore_eos=ignore_eos, max_tokens=max_tokens)
    raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGETS)}")


def needs_prompts(runtime: RuntimeConfig, names) -> bool:
    """Token ids are needed by real compute and by HTTP; the simulator and emulated compute need lengths only."""
    return any(n in ("http", "reference") or (n in ("async", "sync") and runtime.compute == "real") for n in names)


def close_target(target) -> None:
    if hasattr(target, "close"):
        target.close()

