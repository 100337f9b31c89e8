"""Expert placement: full coverage, equal slots, hot experts replicated on distinct workers,
lower peak worker load than plain EP, and deterministic spreading over copies."""
import random
from collections import Counter

import pytest

from asap.scheduler import (Placement, ReplicaChooser, RoutingStats, balanced_placement,
                            contiguous_placement)


def max_worker_load(placement, layer, loads):
    per_worker = [0.0] * placement.num_workers
    for e, workers in enumerate(placement.replicas[layer]):
        for wk in workers:
            per_worker[wk] += loads[e] / len(workers)
    return max(per_worker)


def test_contiguous_placement_covers_every_expert_once_with_equal_counts():
    p = contiguous_placement(num_layers=3, num_experts=16, num_workers=4)
    for layer in range(3):
        assert all(len(ws) == 1 for ws in p.replicas[layer])
        held = [p.experts_on(wk, layer) for wk in range(4)]
        assert sorted(e for es in held for e in es) == list(range(16))
        assert [len(es) for es in held] == [4, 4, 4, 4]
        assert held[1] == [4, 5, 6, 7]                     # contiguous ranges
        assert p.owner_table(layer)[5] == [1]


SKEWED = [[1000.0, 800.0, 600.0] + [10.0] * 13,            # layer 0: three hot experts
          [10.0] * 15 + [2000.0]]                          # layer 1: one very hot expert


def test_balanced_placement_replicates_hot_experts_and_keeps_slots_equal():
    p = balanced_placement(SKEWED, num_workers=4, num_redundant=4)
    for layer, loads in enumerate(SKEWED):
        replicas = p.replicas[layer]
        assert all(len(ws) >= 1 for ws in replicas)                        # every expert served
        assert all(len(set(ws)) == len(ws) for ws in replicas)             # copies on distinct workers
        assert sum(len(ws) for ws in replicas) == 16 + 4
        assert [len(p.experts_on(wk, layer)) for wk in range(4)] == [5] * 4  # equal slots
        hot = max(range(16), key=lambda e: loads[e])
        assert len(replicas[hot]) > 1
    assert [len(p.replicas[0][e]) for e in range(4)] == [3, 2, 2, 1]      # extra copies go to the hot ones
    assert len(p.replicas[1][15]) == 4                                    # 2000 vs 10s: copy on every worker


def test_balanced_placement_lowers_peak_worker_load_versus_contiguous():
    base = contiguous_placement(2, 16, 4)
    bal = balanced_placement(SKEWED, num_workers=4, num_redundant=4)
    for layer, loads in enumerate(SKEWED):
        assert max_worker_load(bal, layer, loads) < max_worker_load(base, layer, loads)
    assert max_worker_load(bal, 0, SKEWED[0]) < 0.6 * max_worker_load(base, 0, SKEWED[0])


def test_balanced_placement_on_random_skew_stays_valid():
    rng = random.Random(0)
    for _ in range(50):
        num_workers = rng.choice([2, 4, 8])
        per_worker = rng.randint(1, 4)
        num_experts = num_workers * per_worker
        num_redundant = num_workers * rng.randint(0, min(2, per_worker * (num_workers - 1)))
        loads = [[rng.paretovariate(1.2) for _ in range(num_experts)] for _ in range(2)]
        p = balanced_placement(loads, num_workers, num_redundant)
        slots = (num_experts + num_redundant) // num_workers
        for layer in range(2):
            assert [len(p.experts_on(wk, layer)) for wk in range(num_workers)] == [slots] * num_workers
            assert all(len(set(ws)) == len(ws) >= 1 for ws in p.replicas[layer])


def test_balanced_placement_rejects_unequal_slots_and_too_many_copies():
    with pytest.raises(ValueError, match="% num_workers"):
        balanced_placement([[1.0] * 16], num_workers=4, num_redundant=3)
    with pytest.raises(ValueError, match="distinct workers"):
        balanced_placement([[1.0] * 2], num_workers=2, num_redundant=4)


def test_placement_rejects_an_expert_without_a_copy():
    with pytest.raises(ValueError, match="no copy"):
        Placement(2, (((0,), ()),))


def test_replica_chooser_spreads_a_hot_expert_over_its_copies_deterministically():
    p = balanced_placement([[10.0] * 15 + [2000.0]], num_workers=4, num_redundant=4)
    assert len(p.replicas[0][15]) == 4
    rng = random.Random(0)
    expert_ids = [15 if rng.random() < 0.7 else rng.randrange(15) for _ in range(4000)]
    chooser = ReplicaChooser(p)
    workers = chooser.choose(0, expert_ids)
    assert workers == ReplicaChooser(p).choose(0, expert_ids)            # deterministic
    assert len(workers) == len(expert_ids)
    for e, wk in zip(expert_ids, workers):
        assert wk in p.replicas[0][e]                                      # always a real copy
    hot = Counter(wk for e, wk in zip(expert_ids, workers) if e == 15)
    assert len(hot) == 4 and max(hot.values()) - min(hot.values()) < 0.25 * max(hot.values())
    totals = Counter(workers)
    assert max(totals.values()) - min(totals.values()) <= 1                # water-filled to even totals


def test_replica_chooser_with_one_copy_is_the_owner():
    p = contiguous_placement(1, 8, 2)
    assert ReplicaChooser(p).choose(0, [0, 7, 3, 4]) == [0, 1, 0, 1]


def test_routing_stats_accumulate_per_layer():
    stats = RoutingStats(num_layers=2, num_experts=3)
    stats.record(0, [1, 2, 3])
    stats.record(0, [4, 0, 1])
    stats.record(1, [0, 5, 0])
    assert stats.loads() == [[5, 2, 4], [0, 5, 0]]
    with pytest.raises(ValueError, match="expected 3"):
        stats.record(0, [1, 2])
    stats.reset()
    assert stats.loads() == [[0, 0, 0], [0, 0, 0]]


def test_packing_recovers_when_greedy_gets_stuck():
    """Here the heaviest-first greedy reaches a copy whose only free workers already hold
    that expert; the packer must swap to keep copies distinct and slots equal."""
    from asap.scheduler.placement import _pack
    row, copies = [100.0, 1.0, 3.0, 1.0, 1.0, 1.0], [1, 3, 2, 2, 3, 1]
    owners = _pack(row, copies, num_workers=3, slots=4)
    assert [len(ws) for ws in owners] == copies
    assert all(len(set(ws)) == len(ws) for ws in owners)
    assert sorted(w for ws in owners for w in ws) == [0] * 4 + [1] * 4 + [2] * 4


def test_vectorised_hand_out_matches_the_chooser_pair_for_pair():
    """asap.workers.destinations spreads pairs over copies with tensor ops; it must give exactly the
    policy's answer (ReplicaChooser.choose, plain Python), in the transport's rank numbering."""
    import torch
    from asap.workers.destinations import Destinations
    rng = random.Random(3)
    loads = [[rng.expovariate(1.0) * (50 if e in (2, 9) else 1) for e in range(16)] for _ in range(2)]
    p = balanced_placement(loads, num_workers=4, num_redundant=8)
    dest = Destinations(p, first_rank=3)
    for layer in range(2):
        for T in (0, 1, 7, 300):
            ids = torch.randint(0, 16, (T, 4), generator=torch.Generator().manual_seed(T + layer))
            got = dest(layer, ids)
            want = [w + 3 for w in ReplicaChooser(p).choose(layer, ids.reshape(-1).tolist())]
            assert got.shape == ids.shape and got.reshape(-1).tolist() == want
    with pytest.raises(ValueError, match=r"expert ids must be in \[0, 16\)"):
        dest(0, torch.tensor([[0, 16]]))
