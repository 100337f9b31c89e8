"""How many requests a headline row or a planner's tune samples (asap.studies.sample_size)."""
import pytest

from asap.measure.rate_search import burst_limit
from asap.sim.cost import CostModel
from asap.sim.run import get_hardware, get_model
from asap.studies import headline
from asap.studies.bound import work_bound
from asap.studies.headline import NUM_REQUESTS, run_headline
from asap.studies.sample_size import requests_needed, sample_size
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo

SLO = parse_slo("2s+1ms/tok")
COST = CostModel(get_model("deepseek-v3"), get_hardware("cloudmatrix384"))


def _requests(workload):
    return lambda n: SLO.apply(workload_requests(workload, n))


@pytest.mark.parametrize("workload", ["fixed-4k", "fixed-2k", "conversation"])
def test_the_sample_reaches_past_the_work_ceiling_before_the_burst_limit(workload):
    """The promise: on the sized sample no search stops at the burst limit below what any engine could
    sustain (the work ceiling), at every device count; and a larger cluster gets at least as many requests."""
    sizes = []
    for devices in (32, 128, 384):
        n = sample_size(_requests(workload), devices, COST, NUM_REQUESTS)
        reqs = _requests(workload)(n)
        budget = sum(r.deadline - r.arrival for r in reqs) / n
        assert burst_limit(n, budget) >= work_bound(reqs, devices, COST)["ceiling"][devices]
        assert n >= NUM_REQUESTS and n % 500 == 0
        sizes.append(n)
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]


def test_the_floor_holds_where_it_is_enough():
    """Conversation at 32 dies needs fewer than the headline's 1,500, so a default row samples exactly what it
    did before sizes were computed (its stored results stay reproducible)."""
    assert requests_needed(_requests("conversation")(NUM_REQUESTS), 32, COST) < NUM_REQUESTS
    assert sample_size(_requests("conversation"), 32, COST, NUM_REQUESTS) == NUM_REQUESTS


def test_requests_need_deadlines():
    with pytest.raises(ValueError, match="deadlines"):
        requests_needed(workload_requests("fixed-4k", 10), 32, COST)
    with pytest.raises(ValueError, match="floor"):
        sample_size(_requests("fixed-4k"), 32, COST, 1)


class _Stop(Exception):
    pass


def test_headline_sizes_each_row_and_warns_when_a_given_size_is_short(monkeypatch, capsys):
    seen = []

    def stub(job):
        seen.append((job[2], len(job[0])))      # (devices, requests the tune searches on)
        raise _Stop

    class Inline:       # the headline's serial map, with the stub in place of the tunes
        def map(self, f, jobs):
            return [stub(j) for j in jobs]
    monkeypatch.setattr(headline, "Serial", Inline)
    for devices in (32, 128):
        with pytest.raises(_Stop):
            run_headline((devices,), ("fixed-4k",), out_dir=None, verbose=False)
    assert seen == [(d, sample_size(_requests("fixed-4k"), d, COST, NUM_REQUESTS)) for d in (32, 128)]
    seen.clear()
    with pytest.raises(_Stop):
        run_headline((128,), ("fixed-4k",), num_requests=2000, out_dir=None)
    assert seen == [(128, 2000)]
    assert "2000 requests may be too few" in capsys.readouterr().out


def test_a_size_stops_at_the_most_a_row_samples():
    """64-token prompts at 384 dies would need ~1M requests; the size stops at MAX_REQUESTS (the headline then
    warns), and a smaller `most` is honoured."""
    from asap.scheduler.request import Request
    from asap.studies.sample_size import MAX_REQUESTS
    tiny = lambda n: SLO.apply([Request(i, 64, i * 1e-3) for i in range(n)])      # noqa: E731
    assert requests_needed(tiny(100), 384, COST) > MAX_REQUESTS
    assert sample_size(tiny, 384, COST, NUM_REQUESTS) == MAX_REQUESTS
    assert sample_size(tiny, 384, COST, NUM_REQUESTS, most=5000) == 5000
    with pytest.raises(ValueError, match="floor"):
        sample_size(tiny, 384, COST, 6000, most=5000)
