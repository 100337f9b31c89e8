"""Co-located emulation (asap.workers.emulation.shared_device): an attention op on a device that also runs an
expert shard is stretched by the expert time that device runs while the op is in flight (expert work has
priority), the simulator's rule; expert ops never wait. The arithmetic without processes, then across a
process boundary through the shared-memory record."""
import multiprocessing as mp
import time

import pytest

from asap.workers.emulation.shared_device import DeviceBusy, ExpertDeviceClock, SharedDeviceClock, stretched_end


def test_an_op_runs_in_the_gaps_between_expert_intervals():
    assert stretched_end(10.0, 3.0, []) == 13.0                          # a device to itself
    assert stretched_end(10.0, 3.0, [(1.0, 9.0), (13.5, 20.0)]) == 13.0  # experts before it and after its end
    assert stretched_end(10.0, 3.0, [(11.0, 12.0)]) == 14.0              # 1 s of experts inside: 1 s later
    assert stretched_end(10.0, 3.0, [(9.0, 11.0)]) == 14.0               # started under an expert op: waits for it
    # 1 s runs, 2 s pre-empted, 1 s runs, 1 s pre-empted, the last 1 s runs
    assert stretched_end(10.0, 3.0, [(11.0, 13.0), (14.0, 15.0), (17.0, 18.0)]) == 16.0
    assert stretched_end(10.0, 3.0, [(13.0, 14.0)]) == 13.0              # one that starts as the op ends: none
    assert stretched_end(10.0, 0.0, [(9.0, 12.0)]) == 10.0               # no work: nothing to stretch


@pytest.mark.parametrize("seed", range(5))
def test_the_end_is_the_first_time_the_op_has_had_its_work(seed):
    """t - s - busy([s, t]) >= w first at t: checked against a brute-force walk over a fine grid."""
    import random
    rng = random.Random(seed)
    t, busy = 0.0, []
    for _ in range(8):
        t += rng.uniform(0.0, 2.0)
        busy.append((t, t := t + rng.uniform(0.1, 2.0)))
    start, work = rng.uniform(0, 5), rng.uniform(0.5, 6)
    end = stretched_end(start, work, busy)
    def had(x):
        return x - start - sum(max(0.0, min(b, x) - max(a, start)) for a, b in busy)
    assert had(end) == pytest.approx(work, abs=1e-9)
    assert had(end - 1e-3) < work


def test_the_record_keeps_recent_intervals_in_order_and_counts_what_it_took():
    rec = DeviceBusy(num_replicas=2, slots=64)
    for i in range(200):                                 # wraps the ring three times
        rec.publish(float(i), i + 0.5, replicas=[i % 2])
    assert rec.since(195.2) == [(195.0, 195.5), (196.0, 196.5), (197.0, 197.5), (198.0, 198.5), (199.0, 199.5)]
    assert rec.last_end() == 199.5
    assert (rec.taken(0), rec.taken(1)) == (100, 100)
    assert rec.busy_s == pytest.approx(100.0)
    rec.publish(300.0, 300.0, replicas=[1, 1])           # an empty op publishes no interval, but took its work
    assert rec.last_end() == 199.5 and rec.taken(1) == 102


def test_an_expert_op_that_starts_while_the_attention_op_waits_pushes_it_further():
    rec = DeviceBusy(num_replicas=1)
    attention, expert = SharedDeviceClock([rec], replica=0, expert_ranks=[1]), ExpertDeviceClock(rec)
    t0 = time.monotonic()
    attention.inputs_ready(t0)
    end = attention.run(0.060)
    assert end == pytest.approx(t0 + 0.060)              # nothing published yet
    expert.inputs_ready(t0 + 0.010)
    expert.run(0.030)                                    # published now, inside the attention op
    attention.wait(end)
    assert attention.free == pytest.approx(t0 + 0.090, abs=1e-9)
    assert time.monotonic() >= t0 + 0.090
    assert rec.stretch_s == pytest.approx(0.030, abs=1e-9)


def _expert_process(rec: DeviceBusy, ready, orders) -> None:
    """An expert worker's side: once told, run an op at `publish_at` (wall) that started on the device at `start`."""
    ready.put(True)
    start, publish_at, seconds = orders.get(timeout=30)
    time.sleep(max(0.0, publish_at - time.monotonic()))
    clock = ExpertDeviceClock(rec)
    clock.inputs_ready(start)
    clock.taking([0])
    clock.run(seconds)


@pytest.mark.timeout(60)
def test_across_processes_the_replica_waits_for_the_expert_to_take_its_dispatch():
    """The replica's dispatch is due 10 ms into its next attention op; the expert's host only takes it
    150 ms later, long after that op's 50 ms would have ended. The op still ends as the simulator says: its
    50 ms plus the 30 ms expert op that ran from the dispatch's due time."""
    rec = DeviceBusy(num_replicas=1)
    clock = SharedDeviceClock([rec], replica=0, expert_ranks=[7])
    ctx = mp.get_context("forkserver")                   # as the launcher starts workers
    ready, orders = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_expert_process, args=(rec, ready, orders))
    proc.start()
    try:
        assert ready.get(timeout=30)
        t0 = time.monotonic() + 0.02
        clock.dispatched({7}, t0 + 0.010)                # to the expert worker on this device (rank 7)
        orders.put((t0 + 0.010, t0 + 0.150, 0.030))
        clock.inputs_ready(t0)
        clock.wait(clock.run(0.050))
        assert clock.free == pytest.approx(t0 + 0.080, abs=1e-9)
        assert time.monotonic() >= t0 + 0.150
        assert rec.taken(0) == 1 and rec.stretch_s == pytest.approx(0.030, abs=1e-9)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


def test_a_dispatch_due_after_the_op_or_a_busy_expert_settles_at_once():
    rec = DeviceBusy(num_replicas=1)
    clock = SharedDeviceClock([rec], replica=0, expert_ranks=[3])
    t0 = time.monotonic()
    clock.dispatched({3}, t0 + 1.0)                      # due after the op: the expert cannot start on it before
    clock.dispatched({4}, t0)                            # another device's expert: not this one's business
    clock.inputs_ready(t0)
    clock.wait(clock.run(0.020))
    assert time.monotonic() - t0 < 0.2 and clock.free == pytest.approx(t0 + 0.020)
    clock.dispatched({3}, t0 + 0.030)                    # due inside the next op, but the expert has an op
    rec.publish(t0 + 0.045, t0 + 0.300)                  # from after the op's end: it cannot start it before
    clock.inputs_ready(t0 + 0.020)
    clock.wait(clock.run(0.020))
    assert time.monotonic() - t0 < 0.2 and clock.free == pytest.approx(t0 + 0.040)
