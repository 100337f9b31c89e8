"""The hardware profile's link, emulated: what the simulator charges for dispatch and combine, in wall time.

Emulated workers wait out the cost model's compute times (asap.workers.emulation.compute.EmulatedCompute). Without
this, their messages would cost only what the shm transport really takes, which at a dilation of 24 is
close to nothing, and the emulated runtime would run ahead of the simulator, which charges the profile's
link (asap.cost.comm). So an emulated worker charges the same formulas as the simulator, times the
dilation, and stamps each message with the time it is due (Header.ready_ns); the receiving Mailbox files
it no earlier (asap.comm.mailbox). What each engine charges, after its simulated counterpart:
- async dispatch (asap.sim.exchange.SimExchange.dispatch): the replica's outgoing link carries one
  dispatch after another, T x top_k copies each at the dispatch per-copy time, then the latency;
- async combine (SimExchange.returned): once the expert workers have answered, the replica's incoming
  link carries T x top_k copies at the combine per-copy time, then the latency; the expert worker's own
  NIC time (its rows at the combine per-copy time) runs alongside its GEMMs, the slower of the two
  counting (asap.cost.model.CostModel.expert_seconds);
- sync all-to-all (asap.sim.sync_engine): every rank's link carries its dispatch (T x top_k copies),
  then, for each all-to-all it serves, the larger of the pairs it served and its own T x top_k (what it
  sends back and what comes back to it), one after another, then the latency; a collective ends when the
  slowest rank's messages are in, as the simulator's max(biggest rank, busiest shard) says.
Real compute and real hardware never use this: their link is the real one.
"""
from __future__ import annotations

import time


class EmulatedLink:
    def __init__(self, latency_s: float, dispatch_per_copy_s: float, combine_per_copy_s: float,
                 dilation: float = 1.0, clock=None):
        """clock: the worker's DeviceClock (asap.workers.emulation.clock): a message goes on the link when the op that
        made it ends; without one, when it is sent."""
        if min(latency_s, dispatch_per_copy_s, combine_per_copy_s) < 0 or dilation <= 0:
            raise ValueError("link times must be >= 0 and the dilation > 0")
        self.clock = clock
        self.combine_per_copy_s = combine_per_copy_s       # undilated: an expert worker's NIC, in its cost table
        self.latency = latency_s * dilation
        self.dispatch_per_copy = dispatch_per_copy_s * dilation
        self.combine_per_copy = combine_per_copy_s * dilation
        self.tx_free = self.rx_free = 0.0           # time.monotonic() from which each direction is free

    def ready_at(self) -> float:
        """When what this worker sends now left its device (its clock's last op end; else now)."""
        return time.monotonic() if self.clock is None else self.clock.out()

    def send(self, copies: float, per_copy: float) -> int:
        """Put one message group of `copies` on the outgoing link: the monotonic ns it is due."""
        self.tx_free = max(self.ready_at(), self.tx_free) + copies * per_copy
        return int((self.tx_free + self.latency) * 1e9)

    def dispatch_due(self, copies: float) -> int:
        return self.send(copies, self.dispatch_per_copy)

    def combine_due(self, copies: float) -> int:
        return self.send(copies, self.combine_per_copy)

    def received(self, arrived: float, copies: float) -> float:
        """A combine whose last partial came at `arrived` crosses the incoming link: when it is through."""
        self.rx_free = max(arrived, self.rx_free) + copies * self.combine_per_copy
        return self.rx_free + self.latency


def emulated_link(cost, engine: str, num_expert_ranks: int, total_devices: int, dilation: float,
                  clock=None, local: bool | None = None) -> EmulatedLink:
    """The link of one emulated worker, from the cost model (asap.cost.model.CostModel) its compute uses.
    sync: num_expert_ranks = total_devices = the ranks (each is a shard, copies to itself are free);
    async: the expert workers, and all workers; co-located async: the devices, both times, and local (a
    replica's copies to its own device's shard are free). clock: its compute's DeviceClock.
    local: whether the sender is one of the expert ranks (default: sync)."""
    local = engine == "sync" if local is None else local
    hw = cost.hw
    return EmulatedLink(hw.link.latency_s,
                        cost.seconds_per_copy(num_expert_ranks, local, total_devices, hw.dispatch_bytes),
                        cost.seconds_per_copy(num_expert_ranks, local, total_devices, hw.combine_bytes),
                        dilation, clock)
