"""One deployment configuration of either engine, as the tuner searches it (`EngineConfig`): its knobs, its
simulator spec (asap.sim.spec.EngineSpec) and its one-line description."""
from __future__ import annotations

from dataclasses import dataclass

from asap.sim.spec import EngineSpec


@dataclass(frozen=True)
class EngineConfig:
    engine: str                         # "sync" | "async"
    attention_tp: int = 1
    token_budget: int = 16384           # tokens per step of one DP group (sync) / replica (async)
    instances: int = 1                  # independent instances (devices split evenly)
    attention_workers: int | None = None    # async: attention replicas A per instance (each attention_tp devices)
    microbatches: "int | str" = 2       # async micro-batches per step
    two_batch_overlap: bool = True      # sync
    router: str = "queue-aware"
    redundant_experts: int | None = None
    prefix_cache: bool = False          # a prefix cache per replica / DP group (the same policy for both)
    colocated: bool = False             # async: every device a replica's attention and an expert shard
    wide_replicas: int = 0              # colocated: a length-aware fleet, wide_replicas x TP wide_tp take the
    wide_tp: int = 8                    # prompts of >= wide_from_tokens (asap.scheduler.length_router)
    wide_from_tokens: int = 32768
    wide_token_budget: int | None = None    # the wide group's chunk (None: token_budget)
    window_s: float = 0.0               # async: the expert side holds a batch up to this long to merge same-layer work
    selector: str = "oldest"            # async: expert work selection (asap.scheduler.expert_select.SELECTORS)
    max_wait_s: float | None = None     # async, selector "fullest": its age bound (None: its default)
    order: str = "fcfs"                 # each replica's / DP group's queue order (asap.scheduler.replica.ORDERS)
    short_replicas: int = 0             # a short-prompt lane: this many narrow replicas / DP groups (sync: a deployment
    short_below_tokens: int = 4096      # of its own, in a fleet) take only prompts under short_below_tokens

    def _spec_fields(self) -> dict:
        """The EngineSpec fields this configuration sets (the rest keep the spec's defaults)."""
        kw = dict(attention_tp=self.attention_tp, token_budget=self.token_budget, router=self.router,
                  redundant_experts=self.redundant_experts, instances=self.instances)
        if self.prefix_cache:
            kw.update(prefix_cache=True)
        if self.order != "fcfs":
            kw.update(order=self.order)
        if self.engine == "sync":
            kw.update(two_batch_overlap=self.two_batch_overlap)
        else:
            kw.update(microbatches=self.microbatches)
            if self.colocated:
                kw.update(colocated=True)
            if self.window_s:
                kw.update(window_s=self.window_s)
            if self.selector != "oldest":
                kw.update(selector=self.selector)
            if self.max_wait_s is not None:
                kw.update(max_wait_s=self.max_wait_s)
        if self.wide_replicas:
            kw.update(wide_replicas=self.wide_replicas, wide_tp=self.wide_tp, wide_from_tokens=self.wide_from_tokens,
                      wide_token_budget=self.wide_token_budget)
        if self.short_replicas:
            kw.update(short_replicas=self.short_replicas, short_below_tokens=self.short_below_tokens)
        return kw

    def spec(self, model, hardware: str, devices: int, **settings) -> EngineSpec:
        """This configuration as the simulator's typed engine (asap.sim.spec.EngineSpec); settings: the rest
        (zipf, trace_window, ...)."""
        return EngineSpec(self.engine, model, hardware, devices, self.attention_workers, **self._spec_fields(), **settings)

    def describe(self, devices: int) -> str:
        return (self._describe(devices) + (f", {self.router} router" if self.router != "queue-aware" else "")
                + (f", expert window {self.window_s * 1e3:g} ms" if self.window_s else "")
                + (f", {self.selector} expert batches" if self.selector != "oldest" else "")
                + (f" (age bound {self.max_wait_s * 1e3:g} ms)" if self.max_wait_s is not None else "")
                + (", prefix cache" if self.prefix_cache else "")
                + (f", {self.order} order" if self.order != "fcfs" else "")
                + (f", short lane {self.short_replicas} x TP{self.attention_tp} for prompts < "
                   f"{self.short_below_tokens / 1024:g}K" if self.short_replicas else ""))

    def _wide_chunk(self) -> str:
        return f" (chunk {self.wide_token_budget})" if self.wide_token_budget not in (None, self.token_budget) else ""

    def _describe(self, devices: int) -> str:
        if self.engine == "sync" and self.wide_replicas:
            per = devices // self.instances
            wide = self.wide_replicas * self.wide_tp
            return (f"sync {self.instances}x fleet[DP{(per - wide) // self.attention_tp} x TP{self.attention_tp}, "
                    f"EP{per - wide} + DP{self.wide_replicas} x TP{self.wide_tp}, EP{wide} for prompts >= "
                    f"{self.wide_from_tokens // 1024}K{self._wide_chunk()}], chunk {self.token_budget}/group, "
                    f"TBO {'on' if self.two_batch_overlap else 'off'}")
        if self.engine == "sync":
            per = devices // self.instances
            return (f"sync {self.instances}x[DP{per // self.attention_tp} x TP{self.attention_tp}, EP{per}], "
                    f"chunk {self.token_budget}/group, TBO {'on' if self.two_batch_overlap else 'off'}")
        per = devices // self.instances
        inst = f"{self.instances}x" if self.instances > 1 else ""
        if self.colocated and self.wide_replicas:
            narrow = (per - self.wide_replicas * self.wide_tp) // self.attention_tp
            return (f"async co-located {inst}[A={narrow} x TP{self.attention_tp} + {self.wide_replicas} x "
                    f"TP{self.wide_tp} for prompts >= {self.wide_from_tokens // 1024}K{self._wide_chunk()}, experts on "
                    f"all {per}], chunk "
                    f"{self.token_budget}/replica, k={self.microbatches}")
        if self.colocated:
            return (f"async co-located {inst}[A={per // self.attention_tp} x TP{self.attention_tp}, experts on all "
                    f"{per}], chunk {self.token_budget}/replica, k={self.microbatches}")
        E = per - self.attention_workers * self.attention_tp
        return (f"async {inst}[A={self.attention_workers} x TP{self.attention_tp} + E={E}], chunk {self.token_budget}"
                f"/replica, k={self.microbatches}")
