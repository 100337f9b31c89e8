"""The two step policies every engine shares: how many micro-batches, and the expert batch cap.

Depth. With `adaptive` off a step always has `microbatches` micro-batches.
With it on, asap.scheduler.microbatch.AdaptiveDepth picks k in
[2, max(microbatches, 4)] and is updated once per step, at its end, from that
step's mean attention time per (micro-batch, layer) and mean expert round trip
(dispatch to combine back). Once per step, not per combine, because k only
changes at a step boundary, and a per-combine EMA over-weights the long tail of
the last micro-batches. The async loop, the simulator and every test use this
rule; nothing else builds an AdaptiveDepth.

Batch cap. An expert worker merges ready same-layer work up to
`expert_batch_cap(token_budget)` = 4 replica steps' worth of tokens: enough to
amortise the expert weight reads (each expert sees 4x the tokens of one step)
while one batch never holds more than a few steps of latency. A runtime may set
its own cap (RuntimeConfig.expert_batch_tokens); the runtime, and the simulator
of a runtime (asap.sim.from_runtime), both take the cap from expert_batch_cap,
so they agree. The tuner simulates EngineSpec's fixed 65,536 (asap.sim.spec);
asap.studies.deploy hands that cap to the runtime where it differs from 4 x the
budget (below and above 16K budgets), so a tuned configuration runs with the
cap it was simulated with.
"""
from __future__ import annotations

from asap.pipeline.step import StepPipeline
from asap.scheduler.microbatch import AdaptiveDepth

MIN_ADAPTIVE_K = 2
MAX_ADAPTIVE_K = 4
EXPERT_BATCH_STEPS = 4


def expert_batch_cap(token_budget: int, override: int | None = None) -> int:
    """Most tokens an expert batch merges (any number of items, one layer): `override`
    (RuntimeConfig.expert_batch_tokens) when set, else EXPERT_BATCH_STEPS steps of `token_budget`."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    return override if override is not None else EXPERT_BATCH_STEPS * token_budget


class StepDepth:
    """k for the next step: fixed, or adaptive (updated by end_step)."""

    def __init__(self, microbatches: int, adaptive: bool = False):
        if microbatches < 1:
            raise ValueError(f"microbatches must be >= 1, got {microbatches}")
        self.fixed = microbatches
        self.adaptive = AdaptiveDepth(MIN_ADAPTIVE_K, max(microbatches, MAX_ADAPTIVE_K)) if adaptive else None

    @property
    def k(self) -> int:
        return self.adaptive.k if self.adaptive is not None else self.fixed

    def end_step(self, step: StepPipeline) -> None:
        if self.adaptive is not None and step.num_attn and step.num_roundtrips:
            self.adaptive.update(step.attn_s / step.num_attn, step.roundtrip_s / step.num_roundtrips)
