"""What a headline row hands the next device count: each engine's best by the headline's criterion and its
best by the every-length-bucket criterion, whether the run goes on or is resumed from its JSON."""
import dataclasses

import pytest

from asap.studies import headline
from asap.studies.config import EngineConfig
from asap.studies.carry import replicate
from asap.studies.headline import DEFAULT_SLO, run_headline, search_rule
from asap.workload.slo import parse_slo


class _Stop(Exception):
    pass


def _engine_row(engine: str, best: EngineConfig, runner_up: EngineConfig, every_bucket: EngineConfig) -> dict:
    def cand(c, rate):
        return {"config": dataclasses.asdict(c), "coarse_rate": rate, "fine_rate": rate}
    return {"candidates": [cand(runner_up, 1.0), cand(best, 2.0)], "max_slo_rate": 2.0,
            "every_bucket": {"config": dataclasses.asdict(every_bucket)}}


@pytest.mark.parametrize("rows_before", [1, 2])
def test_a_resumed_row_starts_from_the_best_of_both_criteria(monkeypatch, rows_before):
    """The 64-die conversation row's every-bucket tune never tried sync's every-bucket best of the 32-die row:
    a resumed row carried only the main criterion's best. Now both criteria's bests are carried (and, from a
    row's first device count, REFINE by the main criterion, as a run that goes on carries them), and every
    carried candidate is refined (the synthetic 128-die row refined one of two that tied on its search sample)."""
    seen, refined = {}, {}

    class Inline:       # the headline's serial map: records each engine's candidates instead of tuning
        def map(self, f, jobs):
            seen.update((j[1], j[6]["candidates"]) for j in jobs)
            refined.update((j[1], j[6]["refine"]) for j in jobs)
            raise _Stop
    monkeypatch.setattr(headline, "Serial", Inline)
    workers = {"sync": (None,) * 3, "async": (4, 2, 1)}     # async: 4 attention dies of 8
    picks = {e: tuple(EngineConfig(e, tp, b, attention_workers=a)
                      for tp, b, a in zip((1, 2, 4), (4096, 8192, 16384), workers[e])) for e in workers}
    rows = [{"workload": "fixed-4k", "devices": 8 * k, **{e: _engine_row(e, *picks[e]) for e in picks}}
            for k in range(1, rows_before + 1)]
    earlier = {"slo": str(parse_slo(DEFAULT_SLO)), "model": "deepseek-v3", "hardware": "cloudmatrix384",
               "rows": rows, "sustained": search_rule(False, False), "prefix_cache": False}
    last = 8 * rows_before
    with pytest.raises(_Stop):
        run_headline((2 * last,), ("fixed-4k",), resume=earlier, out_dir=None, verbose=False)
    for e, (best, runner_up, eb) in picks.items():
        carried = set(seen[e])
        assert replicate(best, 2 * last, last) in carried and replicate(eb, 2 * last, last) in carried
        assert (replicate(runner_up, 2 * last, last) in carried) == (rows_before == 1)
        assert refined[e] >= len(seen[e])
