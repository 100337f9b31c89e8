"""The step driver of an emulated worker: the real one (asap.workers.step.Runner), plus the device clock.

Emulated compute starts each op at max(when its device is free, when its inputs were in)
(asap.workers.emulation.clock). The inputs of a micro-batch's next op were in: at the step's start (its
requests' arrivals, or the sync barrier), then right after its own attention (the next op follows it on
the device: 0.0, "no word"), then when its combine came, which under the emulated link is its due time.
"""
from __future__ import annotations

from asap.workers.step import Runner


class EmulatedRunner(Runner):
    def __init__(self, ctx, replica, mbs: list, exchange, attend=None, *, inputs_in: float):
        super().__init__(ctx, replica, mbs, exchange, attend)
        self.ready = [inputs_in] * len(mbs)

    def attend(self, i: int, layer: int) -> float:
        self.compute.inputs_ready(self.ready[i])
        self.ready[i] = 0.0
        return super().attend(i, layer)

    def wait(self, i: int, layer: int) -> float:
        back = super().wait(i, layer)
        self.ready[i] = back
        return back
