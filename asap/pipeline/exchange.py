"""The expert exchange: the one seam between the attention side and the experts.

As SGLang's BaseDispatcher (dispatch / combine) is for its MoE layers: the step
pipeline says *when* micro-batch i's tokens of layer L go out and when they
must be back; an Exchange says *how*. Four implementations:

  asap.workers.exchange.PointToPoint  async: send each expert worker its tokens; wait only for those
  asap.workers.exchange.AllToAll      sync: every rank sends to every rank (empty included) and serves
                                      its expert shard for (step, L, i) once all N dispatches are in:
                                      a collective, but a non-blocking one, so with two-batch overlap
                                      micro-batch i+1's attention runs while i's all-to-all is in flight
  asap.sim.exchange.SimExchange       the simulated async replica's link (times from the cost model)
  asap.sim.exchange.SimAllToAll       the simulated sync all-to-all, all ranks at once

Keys are (micro-batch, layer) within the current step. What goes out (`Out`) is
the driver's: the attention stage's output in the runtime, a micro-batch's
token count and ranks' ready times in the simulator.

Both all-to-alls serve by one rule, `num_to_serve`, so the runtime and the
simulator cannot drift apart on which collective a rank runs when.
"""
from __future__ import annotations

from typing import Protocol, Sequence, TypeVar

Out = TypeVar("Out", contravariant=True)
Part = TypeVar("Part", covariant=True)


class Exchange(Protocol[Out, Part]):
    def poll(self) -> None:
        """File the combines that came meanwhile, without blocking (their arrival times feed the depth policy)."""

    def dispatch(self, mb: int, layer: int, out: Out, deadline: float, now: float) -> None:
        """Hand (mb, layer)'s attention output to the experts; returns at once. deadline: the micro-batch's
        earliest TTFT deadline (deadline-first experts; inf: none); now: when, in the driver's clock."""

    def combine(self, mb: int, layer: int, timeout: float | None) -> Part:
        """Block until (mb, layer)'s expert output is back (raise asap.comm.CommTimeout after timeout);
        return it. The simulators' exchanges are event-driven and answer only once `arrival` is set."""

    def arrival(self, mb: int, layer: int) -> float | None:
        """When (mb, layer)'s combine was back, in the driver's clock; None while it is not."""

    def abandon(self) -> None:
        """A timeout: forget everything in flight; answers that come later are purged, not kept."""


def num_to_serve(dispatched: Sequence[float | None], awaited: int, until: float) -> int:
    """The sync all-to-all's serving rule: how many of a rank's unserved all-to-alls (in dispatch order, the
    pipeline's order, the same on every rank) it serves now.

    dispatched[i]: when every rank's dispatch of the i-th was in (None: not all in yet). A rank serves in
    order, each once all its dispatches are in: every one up to `awaited` (the index of the all-to-all whose
    combine it waits for; -1 if that one is served already), then later ones while they were in by `until`
    (what a rank does while its own combine is on its way), stopping at the first that was not: serving
    out of order could deadlock the collective."""
    n = 0
    for i, t in enumerate(dispatched):
        if t is None or (i > awaited and t > until):
            break
        n += 1
    return n
