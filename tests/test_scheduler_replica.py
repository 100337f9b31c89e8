"""ReplicaScheduler: chunked prefill within the token budget, in the promised order."""
import random
import time

import pytest

from asap.scheduler import QueueFull, ReplicaScheduler, Request


def run_until_empty(sched, now=0.0):
    """Drive schedule -> commit; return (plans, ids in finish order)."""
    plans, finished = [], []
    while len(sched):
        plan = sched.schedule(now)
        assert plan, "scheduler stalled with work left"
        plans.append(plan)
        finished += [r.id for r in sched.commit(plan)]
    return plans, finished


def test_steps_never_exceed_the_token_budget_and_every_token_runs_once():
    rng = random.Random(0)
    sched = ReplicaScheduler(token_budget=512, order="sjf")
    reqs = [Request(id=i, num_tokens=rng.randint(1, 3000), arrival=i * 0.01) for i in range(60)]
    for r in reqs:
        sched.add(r)
    plans, finished = run_until_empty(sched)
    assert all(0 < sum(p.values()) <= 512 for p in plans)
    assert sorted(finished) == list(range(60))
    assert all(r.num_computed == r.num_tokens for r in reqs)
    assert sum(sum(p.values()) for p in plans) == sum(r.num_tokens for r in reqs)


def test_long_request_is_chunked_over_steps_and_returned_when_done():
    sched = ReplicaScheduler(token_budget=100)
    req = Request(id=7, num_tokens=250)
    sched.add(req)
    assert sched.schedule(0.0) == {7: 100}
    assert sched.commit({7: 100}) == [] and req.num_computed == 100
    assert sched.schedule(0.0) == {7: 100}
    assert sched.commit({7: 100}) == [] and req.num_computed == 200
    assert sched.schedule(0.0) == {7: 50}
    assert sched.commit({7: 50}) == [req] and req.done
    assert len(sched) == 0 and sched.schedule(0.0) == {}


def test_schedule_does_not_advance_num_computed():
    sched = ReplicaScheduler(token_budget=100)
    req = Request(id=1, num_tokens=250)
    sched.add(req)
    assert sched.schedule(0.0) == sched.schedule(0.0) == {1: 100}
    assert req.num_computed == 0


def first_ids(order, reqs, now=0.0, budget=10, starvation_s=None):
    sched = ReplicaScheduler(token_budget=budget, order=order, starvation_s=starvation_s)
    for r in reqs:
        sched.add(r)
    return list(sched.schedule(now))


def test_orders_fcfs_sjf_edf():
    reqs = lambda: [Request(id=1, num_tokens=9, arrival=0.0, deadline=None),
                    Request(id=2, num_tokens=5, arrival=1.0, deadline=9.0),
                    Request(id=3, num_tokens=1, arrival=2.0, deadline=4.0)]
    assert first_ids("fcfs", reqs(), budget=10) == [1, 2]          # 9 + 1 token of #2
    assert first_ids("sjf", reqs(), budget=6) == [3, 2]
    assert first_ids("edf", reqs(), budget=6) == [3, 2]
    assert first_ids("edf", reqs(), budget=15) == [3, 2, 1]        # no deadline = last


def test_partially_prefilled_requests_continue_first():
    sched = ReplicaScheduler(token_budget=100, order="sjf")
    sched.add(Request(id=1, num_tokens=1000))
    sched.commit(sched.schedule(0.0))
    sched.add(Request(id=2, num_tokens=5))                         # shorter, but #1 is mid-prefill
    assert sched.schedule(0.0) == {1: 100}


def test_preemptive_orders_let_a_short_request_pass_a_started_long_one():
    for order, short in (("srpt", dict(num_tokens=5)), ("edf-preempt", dict(num_tokens=5, deadline=2.0))):
        sched = ReplicaScheduler(token_budget=100, order=order)
        sched.add(Request(id=1, num_tokens=1000, deadline=100.0))
        sched.commit(sched.schedule(0.0))
        sched.add(Request(id=2, arrival=0.5, **short))
        assert sched.schedule(0.5) == {2: 5, 1: 95}                # #1 resumes with what #2 leaves
        sched.commit({2: 5, 1: 95})
        assert sched.get(1).num_computed == 195                   # paused at a chunk, nothing recomputed


def test_srpt_reads_a_running_requests_remaining_tokens_each_step():
    sched = ReplicaScheduler(token_budget=10, order="srpt", max_running=2)
    sched.add(Request(id=1, num_tokens=25))
    sched.commit(sched.schedule(0.0))                             # #1: 15 left
    sched.add(Request(id=2, num_tokens=20))
    assert list(sched.schedule(0.0)) == [1]                       # 15 < 20: the started one keeps going
    sched.commit({1: 10})
    assert sched.schedule(0.0) == {1: 5, 2: 5}


def test_starvation_guard_promotes_an_old_request_under_sjf():
    old = Request(id=1, num_tokens=50, arrival=0.0)
    short = [Request(id=2 + i, num_tokens=10, arrival=9.0) for i in range(3)]
    assert first_ids("sjf", [old, *short], now=4.0, starvation_s=5.0)[0] == 2
    old, short = Request(id=1, num_tokens=50, arrival=0.0), [Request(id=2, num_tokens=10, arrival=9.0)]
    assert first_ids("sjf", [old, *short], now=10.0, starvation_s=5.0)[0] == 1


def test_higher_priority_first_and_demoted_requests_last():
    a = Request(id=1, num_tokens=5, arrival=0.0, priority=-1)      # demoted by admission
    b = Request(id=2, num_tokens=5, arrival=1.0)
    c = Request(id=3, num_tokens=5, arrival=2.0, priority=1)
    assert first_ids("fcfs", [a, b, c], budget=15, starvation_s=None) == [3, 2, 1]


def test_queue_full_beyond_max_queue():
    sched = ReplicaScheduler(token_budget=10, max_queue=2)
    sched.add(Request(id=1, num_tokens=5))
    sched.add(Request(id=2, num_tokens=5))
    with pytest.raises(QueueFull):
        sched.add(Request(id=3, num_tokens=5))
    assert sched.num_waiting == 2 and 3 not in sched


def test_abort_removes_waiting_and_running_requests():
    sched = ReplicaScheduler(token_budget=10)
    for i in (1, 2, 3):
        sched.add(Request(id=i, num_tokens=20))
    plan = sched.schedule(0.0)
    assert plan == {1: 10}
    assert sched.abort(1).id == 1 and sched.abort(3).id == 3 and sched.abort(99) is None
    assert sched.commit(plan) == []                                # aborted mid-step: ignored
    assert sched.schedule(0.0) == {2: 10}
    assert len(sched) == 1 and sched.load(0).num_tokens == 20


def test_load_snapshot_tracks_remaining_tokens():
    sched = ReplicaScheduler(token_budget=30)
    sched.add(Request(id=1, num_tokens=50))
    sched.add(Request(id=2, num_tokens=10))
    sched.commit(sched.schedule(0.0))
    load = sched.load(4, busy_until=2.0)
    assert (load.index, load.num_requests, load.num_tokens, load.busy_until) == (4, 2, 30, 2.0)
    assert sorted(load.queued) == [(10, 0), (20, 30)]


def test_max_running_caps_requests_in_flight():
    sched = ReplicaScheduler(token_budget=100, max_running=2)
    for i in range(5):
        sched.add(Request(id=i, num_tokens=10))
    assert list(sched.schedule(0.0)) == [0, 1]


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="order"):
        ReplicaScheduler(token_budget=10, order="lifo")
    with pytest.raises(ValueError, match="token_budget"):
        ReplicaScheduler(token_budget=0)
    sched = ReplicaScheduler(token_budget=10)
    sched.add(Request(id=1, num_tokens=5))
    with pytest.raises(ValueError, match="already queued"):
        sched.add(Request(id=1, num_tokens=5))
    with pytest.raises(ValueError, match="committed 6"):
        sched.commit({1: 6})


def test_schedule_cost_does_not_grow_with_queue_length():
    """Thousands queued: a step touches only what it schedules (heap), not the whole queue."""
    sched = ReplicaScheduler(token_budget=4096, order="edf", max_queue=100_000)
    rng = random.Random(1)
    for i in range(50_000):
        sched.add(Request(id=i, num_tokens=rng.randint(100, 8000), arrival=i * 1e-3, deadline=i * 1e-3 + 5))
    t0 = time.perf_counter()
    for _ in range(200):
        sched.commit(sched.schedule(50.0))
    # a scan of the queue per step would cost >= 200 * 50k * ~50 ns = 0.5 s; the heap takes ~2 ms
    assert time.perf_counter() - t0 < 0.5


class SortedReference:
    """The order rules written plainly (a full sort per step), to check the heap version against."""

    def __init__(self, token_budget, order, starvation_s, max_running):
        self.budget, self.order, self.starvation_s, self.max_running = token_budget, order, starvation_s, max_running
        self.waiting, self.running, self.seq = [], [], 0

    def key(self, req):
        """The order's key of `req` as it stands now (the preemptive orders read it again at every step)."""
        by = {"srpt": "sjf", "edf-preempt": "edf"}.get(self.order, self.order)
        return {"fcfs": (req.arrival, 0.0), "sjf": (req.num_remaining, req.arrival),
                "edf": (float("inf") if req.deadline is None else req.deadline, req.arrival)}[by]

    def add(self, req):
        self.waiting.append((req.priority, self.key(req), self.seq, req))
        self.seq += 1

    def abort(self, rid):
        self.waiting = [w for w in self.waiting if w[3].id != rid]
        self.running = [r for r in self.running if r.id != rid]

    def schedule(self, now):
        def rank(w):
            priority, key, seq, req = w
            starved = self.starvation_s is not None and req.arrival < now - self.starvation_s
            return (-priority, 0, req.arrival, seq) if starved else (-priority, 1, *key, seq)
        plan, budget = {}, self.budget
        if self.order in ("srpt", "edf-preempt"):       # running and waiting requests merged by their key now
            running, waiting = sorted(self.running, key=self.key), sorted(self.waiting, key=rank)
            while budget:
                w = waiting[0] if waiting and len(self.running) < self.max_running else None
                if w is not None and (not running or self.key(w[3]) < self.key(running[0])):
                    req = waiting.pop(0)[3]
                    self.waiting.remove(w)
                    self.running.append(req)
                elif running:
                    req = running.pop(0)
                else:
                    break
                plan[req.id] = min(req.num_remaining, budget)
                budget -= plan[req.id]
            return plan
        for r in self.running:
            if budget:
                plan[r.id] = min(r.num_remaining, budget)
                budget -= plan[r.id]
        for w in sorted(self.waiting, key=rank):
            if not budget or len(self.running) >= self.max_running:
                break
            self.waiting.remove(w)
            self.running.append(w[3])
            plan[w[3].id] = min(w[3].num_remaining, budget)
            budget -= plan[w[3].id]
        return plan

    def commit(self, plan):
        for r in list(self.running):
            if r.id in plan and r.num_computed + plan[r.id] >= r.num_tokens:
                self.running.remove(r)


@pytest.mark.parametrize("order", ["fcfs", "sjf", "edf", "srpt", "edf-preempt"])
@pytest.mark.parametrize("max_new", [1, 3])             # 1: queue stays short (stale heap entries get rebuilt)
def test_heap_scheduler_serves_exactly_the_plainly_sorted_order(order, max_new):
    rng = random.Random(max_new * 7 + len(order))
    sched = ReplicaScheduler(token_budget=300, order=order, starvation_s=2.0, max_running=3, max_queue=10_000)
    ref = SortedReference(300, order, 2.0, 3)
    now, next_id = 0.0, 0
    for _ in range(600):
        now += rng.random() * 0.2
        for _ in range(rng.randint(0, max_new)):
            kw = dict(num_tokens=rng.randint(1, 700), arrival=now - rng.random(), priority=rng.choice([0, 0, 1, -1]),
                      deadline=rng.choice([None, now + rng.random() * 5]))
            sched.add(Request(id=next_id, **kw))
            ref.add(Request(id=next_id, **kw))
            next_id += 1
        if rng.random() < 0.2 and next_id:
            rid = rng.randrange(next_id)
            sched.abort(rid)
            ref.abort(rid)
        plan = sched.schedule(now)
        assert list(plan.items()) == list(ref.schedule(now).items())
        ref.commit(plan)
        for r in ref.running:
            if r.id in plan:
                r.num_computed += plan[r.id]
        sched.commit(plan)


def test_stale_heap_entries_do_not_pile_up_behind_a_long_waiting_request():
    """sjf keeps a huge request waiting while thousands of short ones pass it; the bookkeeping
    they leave behind must stay proportional to the queue, and the order must stay sjf."""
    sched = ReplicaScheduler(token_budget=10, order="sjf", starvation_s=1e9, max_running=1)
    sched.add(Request(id=0, num_tokens=1000, arrival=0.0))
    for i in range(1, 3000):
        sched.add(Request(id=i, num_tokens=10, arrival=float(i)))
        assert sched.schedule(float(i)) == {i: 10}
        sched.commit({i: 10})
        entries = sum(len(l.by_order) + len(l.by_arrival) for l in sched._levels.values())
        assert entries < 100                    # O(queue length), not O(requests served)
    assert sched.schedule(3000.0) == {0: 10}


@pytest.mark.parametrize("seed", range(3))
def test_on_equal_length_prompts_every_order_schedules_as_fcfs(seed):
    """With one prompt length and deadlines that grow with arrival (a TTFT budget of a + b * length), every
    order serves requests as first-come-first-served does: the fixed-length rows of the headline table, searched
    under fcfs only, stand for every order."""
    rng = random.Random(seed)
    length, budget = rng.choice([(2048, 4096), (4096, 4096), (8192, 16384), (700, 300)])
    arrivals = sorted(rng.random() * 20 for _ in range(120))
    steps, max_running = [0.05 + 0.1 * rng.random() for _ in range(10_000)], rng.choice([2, 8])
    plans = {}
    for order in ("fcfs", "sjf", "edf", "srpt", "edf-preempt"):
        sched = ReplicaScheduler(token_budget=budget, order=order, max_running=max_running, max_queue=10_000)
        now, todo, out, step = 0.0, list(arrivals), [], iter(steps)
        while todo or len(sched):
            while todo and todo[0] <= now:
                t = todo.pop(0)
                sched.add(Request(id=len(arrivals) - len(todo) - 1, num_tokens=length, arrival=t,
                                  deadline=t + 2.0 + 0.001 * length))
            plan = sched.schedule(now)
            out.append(list(plan.items()))
            sched.commit(plan)
            now += next(step)
        plans[order] = out
    assert all(p == plans["fcfs"] for p in plans.values())
