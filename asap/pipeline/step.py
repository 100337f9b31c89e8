"""One replica's step as a pure state machine: what to do next, given what is done.

A step is k micro-batches going through every layer. Each (micro-batch i,
layer L) is: Attend (the attention-side ops on the replica), and on a MoE layer
Dispatch (hand the tokens to the experts) and later Wait (the combine must be
back before micro-batch i runs layer L+1). The drivers - the async attention
loop, the sync rank loop, and both simulated engines - ask `next()`, do it, and
report back; none of them decides an order of its own.

The order is round-robin, layer-major: (L=0, i=0), (0, 1), ..., (0, k-1),
(1, 0), ... Why this one:
  - a request split across micro-batches needs piece i's KV of layer L before
    piece i+1 runs layer L; this order gives that by construction;
  - the sync engine's all-to-alls are collectives: every rank must reach
    (L, i) in the same order, so that order must be fixed, not "earliest
    ready" (SGLang TBO and vLLM DBO use this order too);
  - micro-batches are token-balanced to within one token
    (asap.scheduler.microbatch), so "earliest ready" would almost always pick
    the same one, at the price of a replica-local, timing-dependent order that
    the simulator could not match event by event.
While micro-batch i waits for its combine, the replica has run the attention of
the k-1 others: with k micro-batches, (k-1) attentions hide one expert round trip.

`drive` is the one action switch: a driver (StepDriver) only says how to attend,
dispatch and wait; the order, and the bookkeeping the depth policy reads, are here.

Shapes and tensors are the driver's business: this file knows only indices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class Attend:
    mb: int
    layer: int


@dataclass(frozen=True)
class Dispatch:
    mb: int
    layer: int


@dataclass(frozen=True)
class Wait:
    """Block (runtime) or wait for the event (simulator) until (mb, layer)'s combine is back."""
    mb: int
    layer: int


@dataclass(frozen=True)
class Finish:
    """Every micro-batch has run every layer: compute the logits, hand results out."""


FINISH = Finish()
Action = Attend | Dispatch | Wait | Finish
_ACTIONS: dict[tuple[int, int], tuple] = {}     # (k, layers) -> the Attend, Dispatch, Wait of every (layer, mb)


def _actions(k: int, num_layers: int) -> tuple:
    """Each action object made once per step shape, not once per next() (the simulator asks millions of times)."""
    out = _ACTIONS.get((k, num_layers))
    if out is None:
        cells = [divmod(c, k) for c in range(k * num_layers)]     # index c = layer * k + mb
        out = _ACTIONS[(k, num_layers)] = tuple(tuple(kind(mb, layer) for layer, mb in cells)
                                                for kind in (Attend, Dispatch, Wait))
    return out


class StepPipeline:
    def __init__(self, num_microbatches: int, moe_layers: Sequence[bool]):
        if num_microbatches < 1:
            raise ValueError(f"a step needs >= 1 micro-batch, got {num_microbatches}")
        if len(moe_layers) < 1:
            raise ValueError("a model needs >= 1 layer")
        self.k, self.moe = num_microbatches, tuple(bool(m) for m in moe_layers)
        self.num_layers = len(self.moe)
        self._attends, self._dispatches, self._waits = _actions(self.k, self.num_layers)
        self._end = self.k * self.num_layers
        self._cursor = 0                        # next (layer, mb) to attend, layer-major: layer * k + mb
        self._to_dispatch: int | None = None    # layer * k + mb of the attended MoE layer to dispatch
        self._in_flight: dict[int, int] = {}    # mb -> layer dispatched, combine not back yet
        self._sent_at: dict[int, float] = {}
        self.finished = False
        # Per-step measurements for the depth policy (asap.pipeline.depth), in the driver's clock.
        self.attn_s = self.roundtrip_s = 0.0
        self.num_attn = self.num_roundtrips = 0

    def next(self) -> Action:
        if self.finished:
            raise RuntimeError("the step has finished")
        if self._to_dispatch is not None:
            return self._dispatches[self._to_dispatch]
        k, c, in_flight = self.k, self._cursor, self._in_flight
        if c == self._end:
            if in_flight:
                mb = min(in_flight, key=lambda i: (in_flight[i], i))
                return self._waits[in_flight[mb] * k + mb]
            return FINISH
        mb = c % k
        if mb in in_flight:
            return self._waits[in_flight[mb] * k + mb]
        return self._attends[c]

    def attended(self, mb: int, layer: int, seconds: float = 0.0) -> None:
        want = self.next()
        if type(want) is not Attend or want.mb != mb or want.layer != layer:
            self._refuse(Attend(mb, layer), want)
        self._cursor += 1
        self.attn_s += seconds
        self.num_attn += 1
        if self.moe[layer]:
            self._to_dispatch = layer * self.k + mb

    def dispatched(self, mb: int, layer: int, now: float = 0.0) -> None:
        want = self.next()
        if type(want) is not Dispatch or want.mb != mb or want.layer != layer:
            self._refuse(Dispatch(mb, layer), want)
        self._to_dispatch = None
        self._in_flight[mb] = layer
        self._sent_at[mb] = now

    def combined(self, mb: int, layer: int, now: float = 0.0) -> None:
        """(mb, layer)'s combine is back (the simulator may report it before the pipeline asks)."""
        if self._in_flight.get(mb) != layer:
            raise RuntimeError(f"combine of micro-batch {mb} layer {layer} was not in flight "
                               f"(in flight: {self._in_flight})")
        del self._in_flight[mb]
        self.roundtrip_s += max(0.0, now - self._sent_at.pop(mb))
        self.num_roundtrips += 1

    def finish(self) -> None:
        self._expect(FINISH)
        self.finished = True

    def waiting_on(self, mb: int) -> int | None:
        """The layer whose combine micro-batch mb awaits, None if none is in flight."""
        return self._in_flight.get(mb)

    def _expect(self, action: Action) -> None:
        want = self.next()
        if want != action:
            self._refuse(action, want)

    @staticmethod
    def _refuse(action: Action, want: Action) -> None:
        raise RuntimeError(f"step pipeline: the driver did {action}, the pipeline expected {want}")


class StepDriver(Protocol):
    """What drives a step: the runtime's loops (asap.workers.step) and both simulated engines. `drive` asks the
    pipeline what comes next and calls one of these; the driver does it, and says when."""

    def attend(self, mb: int, layer: int) -> float | None:
        """Run (mb, layer)'s attention side: the seconds it took, or None if it is still running (an
        event-driven simulator: it reports `StepPipeline.attended` itself and drives again)."""

    def dispatch(self, mb: int, layer: int) -> float:
        """Hand (mb, layer)'s tokens to the exchange: when it went out, in the driver's clock."""

    def wait(self, mb: int, layer: int) -> float | None:
        """(mb, layer)'s combine: when it was back, or None if it is not back yet (the simulator drives
        again once it is, after reporting `StepPipeline.combined`)."""


def drive(pipe: StepPipeline, driver: StepDriver) -> bool:
    """Do what the pipeline says until the driver must wait for an event or the step is done (pipe.finish()
    is called; the driver then finishes the step). Returns whether the step is done. The one action switch:
    every driver goes through here."""
    while True:
        a = pipe.next()
        kind = type(a)
        if kind is Attend:
            took = driver.attend(a.mb, a.layer)
            if took is None:
                return False
            pipe.attended(a.mb, a.layer, took)
        elif kind is Dispatch:
            pipe.dispatched(a.mb, a.layer, driver.dispatch(a.mb, a.layer))
        elif kind is Wait:
            back = driver.wait(a.mb, a.layer)
            if back is None:
                return False
            pipe.combined(a.mb, a.layer, back)
        else:
            pipe.finish()
            return True


class _Recorder:
    """A driver whose every combine is back before it is awaited: records the actions."""

    def __init__(self):
        self.actions: list[Action] = []

    def attend(self, mb, layer):
        self.actions.append(Attend(mb, layer))
        return 0.0

    def dispatch(self, mb, layer):
        self.actions.append(Dispatch(mb, layer))
        return 0.0

    def wait(self, mb, layer):
        self.actions.append(Wait(mb, layer))
        return 0.0


def order(num_microbatches: int, moe_layers: Sequence[bool]) -> list[Action]:
    """The whole action sequence of a step when every combine comes back before it is awaited."""
    rec = _Recorder()
    drive(StepPipeline(num_microbatches, moe_layers), rec)
    return rec.actions + [FINISH]
