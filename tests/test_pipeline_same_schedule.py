"""The sync all-to-all's serving rule is one thing: fed the same schedule (when each all-to-all's dispatches
were all in, which combine a rank waits for, and when that combine came back), the runtime's AllToAll and the
simulator's SimAllToAll serve the same all-to-alls in the same order."""
import random
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from asap.cost.hardware import get_hardware
from asap.cost.model import CostModel
from asap.pipeline.exchange import num_to_serve
from asap.sim.exchange import SimAllToAll, _AllToAll
from asap.sim.run import get_model, uniform_shares
from asap.workers.emulation.exchange import EmulatedAllToAll

RANKS = 3
STEP = 7


def _runtime(keys, due):
    """An emulated-link AllToAll (due times, as the simulator's) whose mailbox holds every rank's dispatch of each key, due at due[i]."""
    mailbox = SimpleNamespace(work=[SimpleNamespace(src=r, header=SimpleNamespace(
        seq=STEP, layer=layer, microbatch=mb, ready_ns=int(t * 1e9))) for (layer, mb), t in zip(keys, due)
        for r in range(RANKS)])
    ex = EmulatedAllToAll(SimpleNamespace(world_size=RANKS), mailbox, None, 0, None, None, link=None)
    ex.step = STEP
    ex._to_serve = deque((STEP, layer, mb) for layer, mb in keys)
    return ex


def _runtime_serves(ex, awaited, until) -> list:
    out = []
    while (key := ex.next_to_serve((STEP, *awaited), until)) is not None:
        out.append(key[1:])
        ex._to_serve.popleft()
        ex.mailbox.work = [w for w in ex.mailbox.work
                           if (w.header.seq, w.header.layer, w.header.microbatch) != key]
    return out


def _sim(keys, due):
    cfg = get_model("small-deepseek-v3")
    cost = CostModel(cfg, get_hardware("h800"))
    ex = SimAllToAll(cost, uniform_shares(cfg, RANKS), RANKS, 1e-9, 1e-9)
    ex.begin_step(np.ones((2, RANKS)), 0.0, False)
    ex.keys = [_AllToAll(layer, mb, 0.5, t) for (layer, mb), t in zip(keys, due)]
    return ex


def _sim_serves(ex, awaited, until) -> list:
    before = ex.num_served
    must = next(i for i, k in enumerate(ex.keys) if (k.layer, k.mb) == awaited)
    ex._serve(must, until)
    return [(k.layer, k.mb) for k in ex.keys[before:ex.num_served]]


KEYS = [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]


@pytest.mark.parametrize("due, awaited, came, first, later", [
    # waiting for (1, 0): it is served; its combine comes back at 2.5, by when (1, 1) was in, (2, 0) not
    ([1.0, 2.0, 3.0, 4.0, 5.0], (1, 0), 2.5, [(1, 0)], [(1, 1)]),
    # (1, 1) was in late (6.0): nothing after it is served early, though (2, 0) was in at 3.0 (in order)
    ([1.0, 6.0, 3.0, 4.0, 5.0], (1, 0), 5.0, [(1, 0)], []),
    # waiting for (2, 0) serves everything up to it, whatever the times; then all that was in by 9.0
    ([1.0, 6.0, 7.0, 4.0, 9.0], (2, 0), 9.0, [(1, 0), (1, 1), (2, 0)], [(2, 1), (3, 0)]),
])
def test_runtime_and_simulator_serve_the_same_all_to_alls_in_the_same_order(due, awaited, came, first, later):
    rt, sim = _runtime(KEYS, due), _sim(KEYS, due)
    # before the combine: up to the awaited one (AllToAll.combine's first loop, SimAllToAll.combine's first _serve)
    assert _runtime_serves(rt, awaited, -np.inf) == _sim_serves(sim, awaited, -np.inf) == first
    # while the combine is on its way: later ones in order, while they were in by the time it came
    assert _runtime_serves(rt, awaited, came) == _sim_serves(sim, awaited, came) == later


def test_random_schedules_agree():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 6)
        keys = [(1 + i // 2, i % 2) for i in range(n)]
        due = [float(rng.randint(0, 20)) for _ in keys]
        rt, sim = _runtime(keys, due), _sim(keys, due)
        for awaited in keys:                   # the pipeline awaits combines in dispatch order
            came = float(rng.randint(0, 25))
            for until in (-np.inf, came):
                assert _runtime_serves(rt, awaited, until) == _sim_serves(sim, awaited, until)
        assert rt._to_serve == deque() and sim.num_served == n     # the last wait serves everything


def test_a_dispatch_not_all_in_blocks_everything_after_it():
    """The runtime's real path: served in order while all of a key's dispatches are in, never around one."""
    assert num_to_serve([0.0, None, 0.0], awaited=2, until=float("inf")) == 1
    assert num_to_serve([0.0, 0.0, 0.0], awaited=-1, until=float("inf")) == 3
