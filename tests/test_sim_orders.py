"""The queue order as a tuning knob: the same orders for both engines, off (fcfs only) unless asked for, and
recorded by the headline so that runs under other orders are not resumed or merged together."""
import json

import pytest

from asap.studies.config import EngineConfig
from asap.studies.space import secondary, space


def test_by_default_the_space_is_fcfs_only_and_orders_add_a_variant_of_every_candidate_for_both_engines():
    for engine in ("sync", "async"):
        plain = space(engine, 32)
        assert {c.order for c in plain} == {"fcfs"}
        wider = space(engine, 32, orders=("fcfs", "srpt"))
        assert {c.order for c in wider} == {"fcfs", "srpt"}
        primary = space(engine, 32, full=False)
        assert all(any(v.order == "srpt" for v in secondary(c, ("fcfs", "srpt"))) for c in primary)
        assert [v for v in secondary(primary[0]) if v.order != "fcfs"] == []


def test_an_order_reaches_the_simulator_and_the_description():
    c = EngineConfig("async", colocated=True, attention_workers=32, token_budget=8192, order="srpt")
    assert c.spec("deepseek-v3", "cloudmatrix384", 32).order == "srpt"
    assert c.describe(32).endswith(", srpt order")
    assert EngineConfig("sync").spec("deepseek-v3", "cloudmatrix384", 32).order == "fcfs"
    assert "order" not in EngineConfig("sync").describe(32)


def test_the_headline_refuses_unknown_orders_and_resuming_under_other_orders():
    from asap.studies.headline import DEFAULT_SLO, run_headline
    from asap.workload.slo import parse_slo
    with pytest.raises(ValueError, match="orders must be some of"):
        run_headline((8,), ("fixed-4k",), orders=("lifo",), out_dir=None, verbose=False)
    earlier = {"slo": str(parse_slo(DEFAULT_SLO)), "model": "deepseek-v3", "hardware": "cloudmatrix384",
               "rows": []}                                  # recorded before orders were: fcfs
    with pytest.raises(ValueError, match=r"orders: \['fcfs'\] there, \['fcfs', 'srpt'\] here"):
        run_headline((8,), ("fixed-4k",), resume=earlier, orders=("fcfs", "srpt"), out_dir=None, verbose=False)
    with pytest.raises(ValueError, match="no row for workload"):     # the same orders get past that check
        run_headline((8,), ("fixed-4k",), resume=earlier, out_dir=None, verbose=False)


def test_headlines_under_other_orders_are_not_merged(tmp_path):
    from asap.studies.headline_output import merge_headlines
    doc = {"model": "deepseek-v3", "hardware": "cloudmatrix384", "slo": "2s+1ms/tok", "workloads": ["a"],
           "rows": [], "wall_s": 1.0}
    for name, orders in (("a", ["fcfs"]), ("b", ["fcfs", "srpt"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "headline.json").write_text(json.dumps(dict(doc, orders=orders)))
    with pytest.raises(ValueError, match="queue orders"):
        merge_headlines([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
