"""One emulated worker's wrappers, built from its spec: the loops ask `Emulation` for their pieces.

Real compute gets no Emulation (None): the loops then build the real exchanges and step driver.
"""
from __future__ import annotations

from functools import partial

from asap.workers.emulation.compute import EmulatedCompute
from asap.workers.emulation.exchange import EmulatedAllToAll, EmulatedPointToPoint
from asap.workers.emulation.link import emulated_link
from asap.workers.emulation.select import DeviceTimeSelector
from asap.workers.emulation.step import EmulatedRunner


class Emulation:
    def __init__(self, compute: EmulatedCompute, link):
        self.compute, self.link = compute, link

    def point_to_point(self, transport, mailbox, dest, replica: int, spans) -> EmulatedPointToPoint:
        return EmulatedPointToPoint(transport, mailbox, dest, replica, spans, self.link)

    def all_to_all(self, transport, mailbox, dest, rank: int, compute, spans) -> EmulatedAllToAll:
        return EmulatedAllToAll(transport, mailbox, dest, rank, compute, spans, self.link)

    def runner(self, inputs_in: float):
        """The step driver for a step whose inputs were in at `inputs_in` (Replica.inputs_in)."""
        return partial(EmulatedRunner, inputs_in=inputs_in)

    def selector(self, selector, mailbox) -> DeviceTimeSelector:
        return DeviceTimeSelector(selector, self.compute.clock, mailbox)

    def done_ns(self) -> int:
        """When this worker's device finished its last op (a sync rank's barrier flag carries it)."""
        return int(self.compute.done_at() * 1e9)


def _shared_clock(spec):
    """colocated: the device clock of a worker that shares its device (asap.workers.emulation.shared_device)."""
    if not spec.shared_devices:
        return None
    from asap.workers.emulation.shared_device import ExpertDeviceClock, SharedDeviceClock
    if spec.role == "expert":
        return ExpertDeviceClock(spec.shared_devices[0])
    devices = spec.runtime.replica_devices(spec.index)       # its devices' expert workers' ranks
    return SharedDeviceClock(spec.shared_devices, spec.index, range(spec.first_expert_rank + devices.start,
                                                                    spec.first_expert_rank + devices.stop))


def emulated_worker(spec) -> tuple[EmulatedCompute, Emulation]:
    """Compute that waits out the cost model, and the link it charges (asap.workers.main's WorkerSpec)."""
    from asap.workers.costs import runtime_cost_table
    rt = spec.runtime
    sync = spec.role == "rank"
    tp = rt.replica_tps[spec.index] if spec.role == "attention" else None     # a fleet's wide replica: its TP
    table = runtime_cost_table(spec.model_cfg, rt, "sync" if sync else "async", tp)
    compute = EmulatedCompute(spec.model_cfg, table, rt.emulated_hidden, rt.dilation, seed=spec.rank,
                              device=spec.device, clock=_shared_clock(spec))
    if sync:
        ranks = rt.devices // rt.attention_tp
        link = emulated_link(table.cost, "sync", ranks, ranks, rt.dilation, compute.clock)
    else:       # co-located: the N devices are the expert ranks, and copies to the sender's own shard are free
        E = rt.expert_workers
        devices = E if rt.colocated else rt.attention_workers + E
        link = emulated_link(table.cost, "async", E, devices, rt.dilation, compute.clock, local=rt.colocated)
        if spec.role == "expert":
            table.nic_per_copy = link.combine_per_copy_s
    return compute, Emulation(compute, link)
