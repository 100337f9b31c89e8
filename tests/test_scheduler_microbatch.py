"""split_microbatches balances tokens and keeps split requests contiguous and in order;
AdaptiveDepth deepens the pipeline when the expert round trip grows."""
import random

import pytest

from asap.scheduler import AdaptiveDepth, Chunk, split_microbatches


def check_invariants(schedule, starts, k, batches):
    """The structural promises; returns micro-batch token sums."""
    assert 1 <= len(batches) <= k
    assert all(batches), "empty micro-batch"
    pieces = {}
    for b, batch in enumerate(batches):
        for c in batch:
            assert c.num_tokens > 0
            pieces.setdefault(c.request_id, []).append((b, c))
    assert set(pieces) == set(schedule)
    for rid, ps in pieces.items():
        assert [b for b, _ in ps] == sorted(b for b, _ in ps)          # micro-batch order
        pos = starts[rid]
        for _, c in ps:                                                  # contiguous, token order
            assert c.start == pos
            pos += c.num_tokens
        assert pos == starts[rid] + schedule[rid]                        # exactly this step's tokens
    sums = [sum(c.num_tokens for c in batch) for batch in batches]
    assert sum(sums) == sum(schedule.values())
    return sums


def random_step(rng):
    n = rng.randint(1, 12)
    schedule = {100 + i: rng.choice([1, 3, 17, 256, 1000, rng.randint(1, 5000)]) for i in range(n)}
    starts = {rid: rng.randint(0, 20_000) for rid in schedule}
    return schedule, starts


def test_balanced_to_within_one_token_and_structurally_sound():
    rng = random.Random(0)
    for _ in range(500):
        schedule, starts = random_step(rng)
        k = rng.randint(1, 6)
        batches = split_microbatches(schedule, starts, k)
        sums = check_invariants(schedule, starts, k, batches)
        assert len(batches) == min(k, sum(schedule.values()))
        assert max(sums) - min(sums) <= 1


def test_min_tokens_bounds_the_spread_and_avoids_tiny_pieces():
    rng = random.Random(1)
    for _ in range(500):
        schedule, starts = random_step(rng)
        k, m = rng.randint(1, 6), rng.choice([2, 16, 64])
        batches = split_microbatches(schedule, starts, k, min_tokens=m)
        sums = check_invariants(schedule, starts, k, batches)
        assert len(batches) == max(1, min(k, sum(schedule.values()) // m))
        assert max(sums) - min(sums) <= 4 * (m - 1) + 1


def test_a_cut_near_a_request_edge_moves_to_the_edge():
    # 2 x 1000 in 2 batches cuts exactly between the requests: nothing is split
    assert split_microbatches({1: 1000, 2: 1000}, {1: 0, 2: 0}, 2) == [[Chunk(1, 0, 1000)], [Chunk(2, 0, 1000)]]
    # ideal cut at 1005 would leave a 5-token piece of request 1; with min_tokens=16 it snaps to 1000
    batches = split_microbatches({1: 1010, 2: 1000}, {1: 0, 2: 0}, 2, min_tokens=16)
    assert batches == [[Chunk(1, 0, 1010)], [Chunk(2, 0, 1000)]]


def test_one_long_request_is_split_across_micro_batches_in_order():
    batches = split_microbatches({5: 1000}, {5: 4096}, 4)
    assert batches == [[Chunk(5, 4096, 250)], [Chunk(5, 4346, 250)], [Chunk(5, 4596, 250)], [Chunk(5, 4846, 250)]]


def test_k1_returns_one_batch_and_few_tokens_give_fewer_batches():
    assert split_microbatches({1: 7, 2: 9}, {1: 0, 2: 3}, 1) == [[Chunk(1, 0, 7), Chunk(2, 3, 9)]]
    assert len(split_microbatches({1: 2}, {1: 0}, 4)) == 2
    assert split_microbatches({}, {}, 4) == []


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="k >= 1"):
        split_microbatches({1: 5}, {1: 0}, 0)
    with pytest.raises(ValueError, match="no start offset"):
        split_microbatches({1: 5}, {}, 2)
    with pytest.raises(ValueError, match="> 0 tokens"):
        split_microbatches({1: 0}, {1: 0}, 2)


def test_adaptive_depth_follows_roundtrip_over_attention_within_bounds():
    depth = AdaptiveDepth(min_k=2, max_k=4, alpha=0.1)
    assert depth.k == 2                                   # no data yet: shallowest
    depth.update(attn_time=1.0, expert_roundtrip=0.5)
    assert depth.k == 2                                   # ceil(0.5)+1 = 2
    depth.update(attn_time=1.0, expert_roundtrip=10.0)
    assert depth.k == 3                                   # one spike is smoothed: EMA 1.45 -> 3, not 4
    ks = []
    for _ in range(40):
        depth.update(attn_time=1.0, expert_roundtrip=2.0)
        ks.append(depth.k)
    assert ks[-1] == 3                                    # steady ratio 2 -> ceil(2)+1 = 3
    for _ in range(60):
        depth.update(attn_time=1.0, expert_roundtrip=50.0)
    assert depth.k == 4                                   # clamped at max_k
    for _ in range(100):
        depth.update(attn_time=1.0, expert_roundtrip=0.0)
    assert depth.k == 2                                   # clamped at min_k


def test_adaptive_depth_moves_up_when_roundtrip_grows_relative_to_attention():
    depth = AdaptiveDepth(min_k=1, max_k=8, alpha=1.0)    # alpha=1: no smoothing
    ks = []
    for ratio in (0.5, 1.5, 2.5, 3.5):
        depth.update(attn_time=0.01, expert_roundtrip=0.01 * ratio)
        ks.append(depth.k)
    assert ks == [2, 3, 4, 5]


def test_adaptive_depth_rejects_bad_bounds():
    with pytest.raises(ValueError, match="min_k"):
        AdaptiveDepth(min_k=5, max_k=4)
