"""The simulated expert exchange (asap.pipeline.exchange): one async replica's link, in simulated time.

The replica's link carries one message at a time each way: dispatches out, one
copy per (token, expert) pair, and combines in; each message also pays the
link latency. Per-copy times come from the cost model
(asap.cost.CostModel.seconds_per_copy), so contention and link rates are the
hardware profile's, not this file's. The expert side (the pool of expert
workers) lives in the engine; what it hands back comes through `returned`.
"""
from __future__ import annotations

from asap.scheduler.expert_select import WorkInfo
from asap.sim.events import CombineArrive, DispatchArrive


class SimExchange:
    def __init__(self, latency_s: float, dispatch_per_token_s: float, combine_per_token_s: float):
        self.latency, self.disp, self.comb = latency_s, dispatch_per_token_s, combine_per_token_s
        self.tx_free = self.rx_free = 0.0       # each direction of the link: free from this time
        self.events: list = []                  # caused by dispatch(); the engine takes them
        self._arrived: dict[tuple[int, int], float] = {}

    def dispatch(self, mb: int, layer: int, out) -> None:
        """out = (the engine's micro-batch, now)."""
        batch, now = out
        self.tx_free = max(now, self.tx_free) + batch.num_tokens * self.disp
        self._arrived.pop((mb, layer), None)
        self.events.append(DispatchArrive(self.tx_free + self.latency,
                                          WorkInfo((batch, layer), batch.replica, layer, batch.num_tokens, now,
                                                   batch.deadline)))

    def returned(self, work: WorkInfo, now: float) -> CombineArrive:
        """The experts finished `work` at `now`: its combine crosses the link back."""
        self.rx_free = max(now, self.rx_free) + work.num_tokens * self.comb
        return CombineArrive(self.rx_free + self.latency, work.key)

    def arrived(self, mb: int, layer: int, now: float) -> None:
        self._arrived[(mb, layer)] = now

    def poll(self) -> None:
        pass

    def combine(self, mb: int, layer: int, timeout: float | None):
        if (mb, layer) not in self._arrived:
            raise RuntimeError(f"simulated combine of micro-batch {mb} layer {layer} asked before it arrived")
        return None

    def arrival(self, mb: int, layer: int) -> float | None:
        return self._arrived.get((mb, layer))

    def abandon(self) -> None:
        self._arrived.clear()

    def take_events(self) -> list:
        out, self.events = self.events, []
        return out
