"""SLO-aware admission and bounded queues in the engine (issue: scheduling, point 7)."""
import time

import pytest

import asap
from asap.scheduler.errors import QueueFull, Rejected


def _llm(dilation=1000, **kw):
    return asap.LLM("tiny-deepseek-v3", engine="async", compute="emulated", attention_workers=1, expert_workers=1,
                    dilation=dilation, **kw)


def test_reject_mode_turns_away_requests_predicted_to_miss_by_far():
    with _llm(admission="reject", admission_slack=2.0) as llm:
        now = time.monotonic()
        ok = llm.submit(num_tokens=64, deadline=now + 60)                 # generous SLO: admitted
        hopeless = llm.submit(num_tokens=4000, deadline=now + 1e-4)       # cannot make 2x a 0.1 ms budget
        with pytest.raises(Rejected, match="predicted finish"):
            hopeless.result(timeout=5)
        assert ok.result(timeout=60).first_token == 0


def test_demote_mode_still_serves_the_request():
    with _llm(admission="demote") as llm:
        fut = llm.submit(num_tokens=64, deadline=time.monotonic() + 1e-5)
        assert fut.result(timeout=60) is not None


def test_bounded_queue_fails_fast_with_queue_full():
    with _llm(max_queue=2, dilation=1) as llm:
        futures = [llm.submit(num_tokens=4000) for _ in range(3)]
        with pytest.raises(QueueFull):
            futures[2].result(timeout=5)
        for f in futures[:2]:
            f.result(timeout=120)
