"""Expert-side selectors: the right primary, same-layer merging within max_batch_tokens,
and a bounded aggregation wait."""
import pytest

from asap.scheduler import (AggregationWindow, DeadlineFirst, FullestLayer, LargestFirst, OldestFirst, WorkInfo,
                            make_selector)

INF = float("inf")


def w(key, layer, num_tokens, sent_at, deadline=INF, replica=0):
    return WorkInfo(key=key, replica=replica, layer=layer, num_tokens=num_tokens, sent_at=sent_at,
                    deadline=deadline)


READY = [
    w("a", layer=3, num_tokens=100, sent_at=2.0, deadline=9.0),
    w("b", layer=5, num_tokens=50, sent_at=1.0),                   # oldest
    w("c", layer=7, num_tokens=900, sent_at=3.0, deadline=20.0),   # largest
    w("d", layer=9, num_tokens=10, sent_at=4.0, deadline=5.0),     # earliest deadline
]


@pytest.mark.parametrize("selector, primary", [(OldestFirst(), "b"), (LargestFirst(), "c"),
                                               (DeadlineFirst(), "d")])
def test_each_rule_picks_its_primary(selector, primary):
    assert [READY[i].key for i in selector.select(READY, now=10.0)] == [primary]


def test_merges_only_same_layer_items_up_to_max_batch_tokens():
    ready = [
        w("old", layer=4, num_tokens=300, sent_at=0.0, replica=0),
        w("other-layer", layer=5, num_tokens=10, sent_at=0.5, replica=1),
        w("r1", layer=4, num_tokens=500, sent_at=1.0, replica=1),
        w("too-big", layer=4, num_tokens=400, sent_at=2.0, replica=2),   # 300+500+400 > 1000
        w("r3", layer=4, num_tokens=200, sent_at=3.0, replica=3),        # still fits: 1000
        w("r4", layer=4, num_tokens=1, sent_at=4.0, replica=4),          # full
    ]
    batch = OldestFirst(max_batch_tokens=1000).select(ready, now=5.0)
    assert [ready[i].key for i in batch] == ["old", "r1", "r3"]
    assert len({ready[i].layer for i in batch}) == 1
    assert sum(ready[i].num_tokens for i in batch) <= 1000


def test_primary_runs_even_if_larger_than_max_batch_tokens():
    ready = [w("huge", 1, 5000, 0.0), w("small", 1, 10, 1.0)]
    assert OldestFirst(max_batch_tokens=1000).select(ready, 2.0) == [0]


def test_nothing_ready_means_wait():
    assert OldestFirst().select([], 0.0) == []


def test_aggregation_window_waits_at_most_window_s_then_releases():
    ready = [w("a", 2, 100, sent_at=1.0), w("b", 2, 100, sent_at=1.2)]
    sel = AggregationWindow(OldestFirst(max_batch_tokens=1000), window_s=0.5)
    assert sel.select(ready, now=1.1) == [] and sel.wait_until == pytest.approx(1.5)
    assert sel.select(ready, now=1.49) == []
    assert sel.select(ready, now=1.5) == [0, 1] and sel.wait_until is None


def test_aggregation_window_releases_early_when_the_batch_is_full():
    ready = [w("a", 2, 600, sent_at=1.0), w("b", 2, 400, sent_at=1.0)]
    sel = AggregationWindow(OldestFirst(max_batch_tokens=1000), window_s=10.0)
    assert sel.select(ready, now=1.0) == [0, 1]


def test_make_selector_names_window_and_unknown_name():
    assert isinstance(make_selector("oldest"), OldestFirst)
    assert isinstance(make_selector("largest"), LargestFirst)
    assert make_selector("deadline", max_batch_tokens=64).max_batch_tokens == 64
    windowed = make_selector("oldest", window_s=0.002)
    assert isinstance(windowed, AggregationWindow) and isinstance(windowed.inner, OldestFirst)
    with pytest.raises(ValueError, match="oldest.*largest.*deadline"):
        make_selector("newest")
    assert make_selector("fullest", max_wait_s=0.5).max_wait_s == 0.5
    with pytest.raises(ValueError, match="age bound"):
        make_selector("oldest", max_wait_s=0.5)


def test_fullest_layer_serves_the_layer_with_most_ready_tokens():
    ready = [w("old", 1, 500, sent_at=0.0), w("a", 2, 400, sent_at=0.1), w("b", 2, 300, sent_at=0.2),
             w("c", 3, 600, sent_at=0.3)]
    sel = FullestLayer(max_batch_tokens=4096, max_wait_s=1.0)
    assert sel.select(ready, now=0.5) == [1, 2]          # layer 2 holds 700 tokens; oldest first inside it
    # ...but a layer whose oldest item has waited max_wait_s goes first: nothing starves
    assert sel.select(ready, now=1.0) == [0]
    assert sel.select([], now=1.0) == []


def test_fullest_layer_ties_go_to_the_older_layer():
    ready = [w("x", 5, 300, sent_at=0.2), w("y", 7, 300, sent_at=0.1)]
    assert FullestLayer(max_wait_s=10.0).select(ready, now=0.3) == [1]


@pytest.mark.parametrize("name", ["oldest", "largest", "deadline", "fullest"])
@pytest.mark.parametrize("window_s", [0.0, 0.3])
def test_ready_queue_makes_exactly_the_list_selectors_choices(name, window_s):
    """The simulator's O(log n) queue against select() over a list, on a random stream of arrivals and
    takes with many ties (equal times, sizes, deadlines): the same batches in the same order, the same waits."""
    import random
    from asap.scheduler.expert_select import ListQueue, ReadyQueue, ready_queue

    rng = random.Random(f"{name}-{window_s}")
    for trial in range(30):
        bound = {"max_wait_s": rng.choice([0.0, 0.15, 1.0])} if name == "fullest" else {}
        selector = make_selector(name, window_s=window_s, max_batch_tokens=rng.choice([1, 300, 1000, 4096]), **bound)
        fast, slow = ready_queue(selector), ListQueue(selector)
        assert isinstance(fast, ReadyQueue)
        now, seq = 0.0, 0
        for _ in range(400):
            now += rng.choice([0.0, 0.0, 0.05, 0.1, 0.5])
            if rng.random() < 0.6:
                item = w(seq, layer=rng.randrange(4), num_tokens=rng.choice([1, 100, 250, 400, 700, 1200]),
                         sent_at=now - rng.choice([0.0, 0.1, 0.2]), deadline=rng.choice([INF, 1.0, 2.0, now]))
                seq += 1
                fast.push(item)
                slow.push(item)
            else:
                got, want = fast.take(now), slow.take(now)
                assert [x.key for x in got] == [x.key for x in want]
                assert fast.wait_until == slow.wait_until
            assert len(fast) == len(slow)


def test_ready_queue_is_used_only_for_the_selectors_it_copies():
    from asap.scheduler.expert_select import ListQueue, ReadyQueue, ready_queue

    class Custom(OldestFirst):      # a subclass may change select(): the queue must call it
        pass
    assert isinstance(ready_queue(OldestFirst()), ReadyQueue)
    assert isinstance(ready_queue(make_selector("deadline", window_s=0.1)), ReadyQueue)
    assert isinstance(ready_queue(Custom()), ListQueue)
    assert isinstance(ready_queue(AggregationWindow(Custom(), 0.1)), ListQueue)


@pytest.mark.parametrize("name", ["oldest", "largest", "deadline"])
def test_the_async_simulator_gives_the_same_ttfts_with_the_fast_queue_as_with_select(name):
    """End to end: a subclass of the selector (which the engine hands to select() over a list) and the built-in
    one (kept in a ReadyQueue) give the same TTFTs and event count, with and without an aggregation window."""
    from asap.scheduler.request import Request
    from asap.sim.run import run
    from asap.workload.slo import SLO

    reqs = SLO(0.005, 1e-6).apply([Request(i, 1000 + 500 * (i % 7), 0.002 * i) for i in range(150)])
    for window_s in (0.0, 0.0005):
        listed = type("Listed", (make_selector(name).__class__,), {})(max_batch_tokens=4096)
        listed = AggregationWindow(listed, window_s) if window_s else listed
        fast = run(reqs, "async", "small-deepseek-v3", "h800", 8, 3,
                   selector=make_selector(name, window_s=window_s, max_batch_tokens=4096))
        slow = run(reqs, "async", "small-deepseek-v3", "h800", 8, 3, selector=listed)
        assert [r.ttft for r in fast.results] == [r.ttft for r in slow.results]
        assert fast.num_events == slow.num_events
