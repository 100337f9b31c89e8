"""The expert exchange: the one seam between the attention side and the experts.

As SGLang's BaseDispatcher (dispatch / combine) is for its MoE layers: the step
pipeline says *when* micro-batch i's tokens of layer L go out and when they
must be back; an Exchange says *how*. Three implementations:

  asap.workers.exchange.PointToPoint  async: send each expert worker its tokens; wait only for those
  asap.workers.exchange.AllToAll      sync: every rank sends to every rank (empty included) and serves
                                      its expert shard for (step, L, i) once all N dispatches are in:
                                      a collective, but a non-blocking one, so with two-batch overlap
                                      micro-batch i+1's attention runs while i's all-to-all is in flight
  asap.sim.exchange.SimExchange       the simulator: link and expert times from the cost model

Keys are (micro-batch, layer) within the current step; tensors are opaque here.
"""
from __future__ import annotations

from typing import Protocol


class Exchange(Protocol):
    def dispatch(self, mb: int, layer: int, out) -> None:
        """Hand (mb, layer)'s attention output (tokens, top-k ids and weights) to the experts; returns at once."""

    def combine(self, mb: int, layer: int, timeout: float | None):
        """Block until (mb, layer)'s expert output is back (raise asap.comm.CommTimeout after timeout);
        return it. The simulator's exchange is event-driven and only answers once `arrival` is set."""

    def arrival(self, mb: int, layer: int) -> float | None:
        """When (mb, layer)'s combine was back, in the driver's clock; None while it is not."""

    def abandon(self) -> None:
        """A timeout: forget everything in flight; answers that come later are purged, not kept."""
