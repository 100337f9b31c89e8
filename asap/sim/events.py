"""Simulator events. Each event knows its time and, when handled, returns the events it causes.

The logic lives in the engine (asap.sim.async_engine / sync_engine); an event
only says which engine method reacts to it. `__slots__` keeps them cheap: a
DeepSeek-V3 run makes a few events per (micro-batch, layer).
"""
from __future__ import annotations


class Event:
    __slots__ = ("time",)

    def __init__(self, time: float):
        self.time = time

    def handle(self, engine) -> list["Event"]:
        raise NotImplementedError


class Arrival(Event):
    """A request reaches the system; the router places it on a replica."""
    __slots__ = ("request",)

    def __init__(self, time, request):
        self.time, self.request = time, request

    def handle(self, engine):
        return engine.on_arrival(self.request, self.time)


class Kick(Event):
    """An idle replica (sync: the idle engine) got work; it starts a step. Being an event of its own,
    it runs after every arrival already scheduled for the same instant, which then share the step."""
    __slots__ = ("replica",)

    def __init__(self, time, replica):
        self.time, self.replica = time, replica

    def handle(self, engine):
        return engine.on_kick(self.replica, self.time)


class StepDone(Event):
    """Sync engine: the lock-step forward step of all ranks ends."""
    __slots__ = ("plans",)

    def __init__(self, time, plans):
        self.time, self.plans = time, plans

    def handle(self, engine):
        return engine.on_step_done(self)


class AttentionDone(Event):
    """Async engine: one micro-batch finished one layer's attention-side ops on its replica."""
    __slots__ = ("mb",)

    def __init__(self, time, mb):
        self.time, self.mb = time, mb

    def handle(self, engine):
        return engine.on_attention_done(self.mb, self.time)


class DispatchArrive(Event):
    """Async engine: a micro-batch's tokens for one MoE layer reached the expert workers."""
    __slots__ = ("work",)

    def __init__(self, time, work):
        self.time, self.work = time, work

    def handle(self, engine):
        return engine.on_dispatch_arrive(self.work, self.time)


class ExpertDone(Event):
    """Async engine: the expert workers finished one batch (one layer, items from any replicas)."""
    __slots__ = ("items",)

    def __init__(self, time, items):
        self.time, self.items = time, items

    def handle(self, engine):
        return engine.on_expert_done(self.items, self.time)


class CombineArrive(Event):
    """Async engine: a micro-batch's expert outputs are back on its replica."""
    __slots__ = ("mb",)

    def __init__(self, time, mb):
        self.time, self.mb = time, mb

    def handle(self, engine):
        return engine.on_combine_arrive(self.mb, self.time)


class PoolWake(Event):
    """Async engine: an aggregation window the expert selector asked to wait for has passed."""
    __slots__ = ()

    def handle(self, engine):
        return engine.on_pool_wake(self.time)
