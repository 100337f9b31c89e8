"""The runtime's router sees the load view the simulator's router sees: for the same requests and the same
steps, the engine's book of a replica (asap.engine.loads) gives ReplicaScheduler.load's fields."""
from asap.engine.loads import ReplicaBook
from asap.scheduler.replica import ReplicaScheduler
from asap.scheduler.request import Request
from asap.scheduler.router import QueueAwareRouter


def _fields(load):
    return load.index, load.num_requests, load.num_tokens, sorted(load.queued)


def test_the_engine_book_matches_the_replica_scheduler_step_by_step():
    sched, book = ReplicaScheduler(1000), ReplicaBook()
    for rid, n in ((0, 1500), (1, 300), (2, 2200)):
        sched.add(Request(rid, n))
        book.add(rid, n)
    assert _fields(book.load(3)) == _fields(sched.load(3))
    for now in range(4):
        plan = sched.schedule(float(now))
        # what the replica reports as it plans the step (asap.workers.replica.Replica.plan)
        book.planned({rid: (sched.get(rid).num_computed, n) for rid, n in plan.items()}, float(now), lambda c: 0.5)
        assert _fields(book.load(3)) == _fields(sched.load(3))      # mid-step: progress as of the step's start
        assert book.busy_until == now + 0.5
        for req in sched.commit(plan):                              # finished: the engine drops it on its Result
            book.pop(req.id)
    assert _fields(book.load(3)) == _fields(sched.load(3))


def test_a_half_prefilled_prompt_weighs_what_is_left_of_it():
    router, book = QueueAwareRouter(lambda chunks: sum(n for n, _ in chunks)), ReplicaBook()
    book.add(0, 8000)
    before = router.queue_cost(book.load(0))
    book.planned({0: (6000, 1000)}, 0.0, lambda chunks: 0.0)
    assert router.queue_cost(book.load(0)) == before - 6000
