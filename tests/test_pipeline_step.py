"""The step pipeline: one order for every driver, the KV dependency by construction, bad drivers caught."""
import random

import pytest

from asap.pipeline.depth import StepDepth, expert_batch_cap
from asap.pipeline.step import FINISH, Attend, Dispatch, StepPipeline, Wait, order


def test_order_is_round_robin_layer_major_with_dispatch_right_after_a_moe_attention():
    got = order(2, [False, True])
    assert got == [Attend(0, 0), Attend(1, 0), Attend(0, 1), Dispatch(0, 1), Attend(1, 1), Dispatch(1, 1),
                   Wait(0, 1), Wait(1, 1), FINISH]


def _drive(k, moe, rng):
    """Run a step with combines coming back in a random order at random moments; log what ran."""
    p, attended, back = StepPipeline(k, moe), [], set()
    in_flight = []
    while True:
        a = p.next()
        if in_flight and rng.random() < 0.5:     # some combine arrives (the simulator reports arrivals early)
            back.add(in_flight.pop(rng.randrange(len(in_flight))))
        if isinstance(a, Attend):
            attended.append((a.layer, a.mb))
            p.attended(a.mb, a.layer, 1.0)
        elif isinstance(a, Dispatch):
            p.dispatched(a.mb, a.layer, 0.0)
            in_flight.append((a.mb, a.layer))
        elif isinstance(a, Wait):
            if (a.mb, a.layer) in in_flight:
                in_flight.remove((a.mb, a.layer))
            back.discard((a.mb, a.layer))
            p.combined(a.mb, a.layer, 3.0)
        else:
            p.finish()
            return p, attended


@pytest.mark.parametrize("seed", range(20))
def test_every_micro_batch_runs_every_layer_once_and_never_passes_the_one_before(seed):
    rng = random.Random(seed)
    k, L = rng.randint(1, 4), rng.randint(1, 6)
    moe = [rng.random() < 0.7 for _ in range(L)]
    p, attended = _drive(k, moe, rng)
    assert sorted(attended) == [(layer, mb) for layer in range(L) for mb in range(k)]
    pos = {x: i for i, x in enumerate(attended)}
    for layer in range(L):
        for mb in range(1, k):     # piece mb reads the KV piece mb-1 wrote at this layer
            assert pos[(layer, mb - 1)] < pos[(layer, mb)]
        for mb in range(k):
            if layer:
                assert pos[(layer - 1, mb)] < pos[(layer, mb)]
    assert p.num_attn == k * L and p.num_roundtrips == k * sum(moe)
    assert p.roundtrip_s == pytest.approx(3.0 * k * sum(moe))


def test_a_micro_batch_waits_for_its_own_combine_before_its_next_layer():
    p = StepPipeline(2, [True, True])
    p.attended(0, 0)
    p.dispatched(0, 0, 0.0)
    p.attended(1, 0)
    p.dispatched(1, 0, 0.0)
    assert p.next() == Wait(0, 0)
    p.combined(1, 0, 1.0)            # micro-batch 1 back first: still 0 comes first (fixed order)
    assert p.next() == Wait(0, 0)
    p.combined(0, 0, 2.0)
    assert p.next() == Attend(0, 1)


def test_a_driver_that_strays_from_the_pipeline_is_stopped():
    p = StepPipeline(2, [True])
    with pytest.raises(RuntimeError, match="expected Attend"):
        p.attended(1, 0)
    p.attended(0, 0)
    with pytest.raises(RuntimeError, match="expected Dispatch"):
        p.attended(1, 0)
    with pytest.raises(RuntimeError, match="not in flight"):
        p.combined(0, 0)
    p.dispatched(0, 0)
    p.attended(1, 0)
    p.dispatched(1, 0)
    with pytest.raises(RuntimeError, match="expected Wait"):
        p.finish()
    p.combined(0, 0)
    p.combined(1, 0)
    p.finish()
    with pytest.raises(RuntimeError, match="finished"):
        p.next()


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="micro-batch"):
        StepPipeline(0, [True])
    with pytest.raises(ValueError, match="layer"):
        StepPipeline(1, [])
    with pytest.raises(ValueError):
        StepDepth(0)
    with pytest.raises(ValueError):
        expert_batch_cap(0)


def test_fixed_depth_stays_and_adaptive_depth_follows_the_step_means():
    fixed = StepDepth(3)
    p = StepPipeline(3, [True])
    p.attn_s, p.num_attn, p.roundtrip_s, p.num_roundtrips = 1.0, 1, 10.0, 1
    fixed.end_step(p)
    assert fixed.k == 3
    d = StepDepth(2, adaptive=True)
    assert d.k == 2                                      # starts at the minimum
    d.end_step(p)                                        # round trip 10x attention: as deep as allowed
    assert d.k == 4
    slow = StepPipeline(2, [True])
    slow.attn_s, slow.num_attn, slow.roundtrip_s, slow.num_roundtrips = 10.0, 10, 0.5, 10
    for _ in range(30):
        d.end_step(slow)                                 # round trip < attention: 2 hide it
    assert d.k == 2
    assert StepDepth(6, adaptive=True).adaptive.max_k == 6
    assert expert_batch_cap(2048) == 4 * 2048
