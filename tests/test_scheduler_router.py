"""Routers pick the replica their rule promises; ties go to the lowest index."""
import pytest

from asap.scheduler import (LeastRequestsRouter, LeastTokensRouter, QueueAwareRouter, ReplicaLoad,
                            ReplicaScheduler, Request, RoundRobinRouter, linear_cost, make_router)


def load(index, queued=(), busy_until=0.0):
    queued = list(queued)
    return ReplicaLoad(index, len(queued), sum(n for n, _ in queued), queued, busy_until)


REQ = Request(id=1, num_tokens=100)


def test_round_robin_cycles_over_the_given_indices():
    loads = [load(7), load(3), load(5)]
    router = RoundRobinRouter()
    assert [router.route(REQ, loads, 0.0) for _ in range(7)] == [7, 3, 5, 7, 3, 5, 7]


def test_least_requests_and_least_tokens_pick_the_minimum_with_ties_by_index():
    loads = [load(0, [(10, 0), (10, 0)]), load(1, [(500, 0)]), load(2, [(1, 0)]), load(3, [(1, 0)])]
    assert LeastRequestsRouter().route(REQ, loads[:2], 0.0) == 1
    assert LeastRequestsRouter().route(REQ, loads, 0.0) == 1   # 1, 2 and 3 hold one request; lowest index wins
    assert LeastTokensRouter().route(REQ, loads, 0.0) == 2     # 2 and 3 tie on one token
    assert LeastTokensRouter().route(REQ, loads[:2], 0.0) == 0


def test_queue_aware_counts_queued_work_where_least_requests_does_not():
    cost = linear_cost(0.0, 1e-3, 0.0)                 # 1 ms per token
    one_huge = load(0, [(10_000, 0)])                  # 1 request, 10 s of work
    three_tiny = load(1, [(10, 0)] * 3)                # 3 requests, 30 ms of work
    loads = [one_huge, three_tiny]
    assert LeastRequestsRouter().route(REQ, loads, 0.0) == 0
    assert QueueAwareRouter(cost).route(REQ, loads, 0.0) == 1


def test_queue_aware_counts_the_step_in_progress():
    cost = linear_cost(0.0, 1e-3, 0.0)
    busy = load(0, [], busy_until=5.0)                 # idle queue, but mid-step until t=5
    queued = load(1, [(1000, 0)])                      # 1 s of queued work
    router = QueueAwareRouter(cost)
    assert router.route(REQ, [busy, queued], now=1.0) == 1
    assert router.route(REQ, [busy, queued], now=4.5) == 0     # busy_until - now = 0.5 s < 1 s
    assert router.predict(REQ, busy, now=1.0) == pytest.approx(5.0 + 0.1)


def test_queue_aware_ties_go_to_lowest_index_and_memo_follows_queue_changes():
    router = QueueAwareRouter(linear_cost(0.0, 1.0, 0.0))
    a, b = load(0, [(5, 0)]), load(1, [(5, 0)])
    assert router.route(REQ, [a, b], 0.0) == 0
    a.queued.append((3, 0))                            # content changes in place: memo must not go stale
    assert router.route(REQ, [a, b], 0.0) == 1


def test_queue_aware_reads_a_replica_scheduler_snapshot():
    scheds = [ReplicaScheduler(token_budget=64) for _ in range(2)]
    scheds[0].add(Request(id=1, num_tokens=4000))
    for i in range(3):
        scheds[1].add(Request(id=10 + i, num_tokens=8))
    loads = [s.load(i) for i, s in enumerate(scheds)]
    assert loads[0].num_requests == 1 and loads[0].num_tokens == 4000
    assert make_router("least-requests").route(REQ, loads, 0.0) == 0
    assert make_router("queue-aware").route(REQ, loads, 0.0) == 1


def test_make_router_names_and_unknown_name():
    assert isinstance(make_router("round-robin"), RoundRobinRouter)
    assert isinstance(make_router("least-requests"), LeastRequestsRouter)
    assert isinstance(make_router("least-tokens"), LeastTokensRouter)
    assert isinstance(make_router(), QueueAwareRouter)
    # the peers' defaults by name: SGLang round-robin over DP ranks, vLLM least-loaded engine
    assert isinstance(make_router("sglang"), RoundRobinRouter)
    assert isinstance(make_router("vllm"), LeastRequestsRouter)
    with pytest.raises(ValueError, match="round-robin.*queue-aware"):
        make_router("random")


def test_routing_with_no_replicas_is_a_clear_error():
    for name in ("round-robin", "least-requests", "least-tokens", "queue-aware"):
        with pytest.raises(ValueError, match="no replicas"):
            make_router(name).route(REQ, [], 0.0)
