"""The engine's span log stays bounded in a long-lived engine, and readers/trimmers keep working."""
import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from asap.engine.errors import EngineClosed
from asap.server.supervisor import Supervisor
from asap.workers.spans import SpanLog, fractions


def _spans(t0, n, kind="compute"):
    return [(kind, t0 + i, t0 + i + 0.5) for i in range(n)]


def test_the_span_log_keeps_at_most_its_capacity_plus_a_quarter_and_counts_what_it_drops():
    log = SpanLog(capacity=100)
    for i in range(50):
        log.add("attention0", _spans(10 * i, 10))
        assert len(log["attention0"]) <= 125
    kept = log["attention0"]
    assert kept[-1] == ("compute", 499, 499.5)                       # the newest are the ones kept
    assert len(kept) + log.dropped["attention0"] == 500
    assert kept == sorted(kept, key=lambda s: s[1])
    assert fractions(kept, kept[0][1], kept[-1][2])["compute"] > 0.4   # worker_fractions still reads it


def test_trim_forgets_spans_that_ended_before_the_cutoff_while_the_collector_appends():
    log = SpanLog(capacity=1000)
    stop = threading.Event()

    def collector():
        t = 1000.0
        while not stop.is_set():
            log.add("expert0", _spans(t, 5))
            t += 5

    th = threading.Thread(target=collector)
    th.start()
    try:
        for _ in range(200):
            log.trim(1200.0)
            sum(e - s for _, s, e in log.get("expert0", []))   # a reader iterating concurrently (bench targets)
    finally:
        stop.set()
        th.join()
    log.trim(1200.0)
    assert log["expert0"] and all(e >= 1200.0 for _, _, e in log["expert0"])
    with pytest.raises(ValueError):
        SpanLog(capacity=0)


@pytest.mark.timeout(120)
def test_a_running_engine_keeps_each_workers_spans_bounded():
    import asap
    with asap.LLM("tiny-deepseek-v3", engine="async", attention_workers=1, expert_workers=1,
                  compute="emulated", dilation=5) as llm:
        log = llm.engine.spans
        assert isinstance(log, SpanLog)
        log.capacity = 4
        for _ in range(6):
            llm.submit(num_tokens=64).result(timeout=60)
            time.sleep(0.6)                                      # workers flush their spans every 0.5 s
        assert log and all(len(s) <= 5 for s in log.values()), {w: len(s) for w, s in log.items()}
        assert sum(log.dropped.values()) > 0
        assert set(llm.engine.worker_fractions()) == set(log)


@pytest.mark.timeout(10)
def test_the_supervisor_watch_task_ends_cleanly_on_a_closed_engine():
    class Closed:
        engine = None

        def healthy(self):
            raise EngineClosed()

    async def main():
        sup = Supervisor(Closed(), poll_s=0.01)
        sup.start()
        await asyncio.wait_for(sup._task, 2)
        assert sup._task.done() and sup._task.exception() is None
        assert sup.status == "unhealthy" and "closed" in sup.reason
        await sup.stop()

    asyncio.run(main())


def test_the_supervisor_trims_the_engine_span_log():
    log = SpanLog()
    now = time.monotonic()
    log.add("attention0", [("idle", now - 100, now - 90), ("compute", now - 1, now)])
    sup = Supervisor(SimpleNamespace(engine=SimpleNamespace(spans=log), healthy=lambda: True), span_window_s=5)
    sup._trim_spans()
    assert [k for k, _, _ in log["attention0"]] == ["compute"]
