"""`asap sim bound` (asap.studies.bound): the work ceiling is a true ceiling. A burst of requests all
arriving at once finishes no sooner, on either engine, than the least compute it needs spread over every
device: makespan x devices >= the sum of min_device_seconds."""
import json

import pytest

from asap.cost.model import CostModel
from asap.scheduler.request import Request
from asap.sim.run import get_hardware, get_model, run
from asap.studies.bound import format_bound, min_device_seconds, parse_rates, work_bound


def _burst(lengths):
    return [Request(i, n, 0.0) for i, n in enumerate(lengths)]


@pytest.mark.parametrize("model,devices,kw", [
    ("deepseek-v3", 16, dict(engine="sync", attention_tp=4, token_budget=16384)),
    ("deepseek-v3", 32, dict(engine="sync", token_budget=8192)),
    ("deepseek-v3", 32, dict(engine="async", colocated=True, token_budget=16384, microbatches=2)),
    ("deepseek-v3", 32, dict(engine="async", attention_workers=16, token_budget=16384)),
    ("qwen3-235b-a22b", 16, dict(engine="sync", token_budget=8192)),
])
def test_no_engine_beats_the_ceiling(model, devices, kw):
    lengths = [500, 3000, 9000, 40000, 1200, 70000, 2000, 16000] * 3
    reqs = _burst(lengths)
    res = run(reqs, model_cfg=model, hardware="cloudmatrix384", devices=devices, **kw)
    assert all(r.ok for r in res.results)
    makespan = max(r.ttft for r in res.results)
    cost = CostModel(get_model(model), get_hardware("cloudmatrix384"))
    work = sum(min_device_seconds(cost, n) for n in lengths)
    assert makespan * devices >= work


def test_the_ceiling_is_close_where_the_work_packs_evenly():
    """Not vacuous: 512 prompts of 4K on sync DP32 (every rank full, as on even traffic) finish within 1.3x
    of the ceiling's time."""
    lengths = [4096] * 512
    res = run(_burst(lengths), "sync", "deepseek-v3", "cloudmatrix384", 32, token_budget=4096)
    makespan = max(r.ttft for r in res.results)
    work = sum(min_device_seconds(CostModel(get_model("deepseek-v3"), get_hardware("cloudmatrix384")), n)
               for n in lengths)
    assert work <= makespan * 32 < 1.3 * work


def test_the_ceiling_and_its_buckets():
    cost = CostModel(get_model("deepseek-v3"), get_hardware("cloudmatrix384"))
    # attention is quadratic: a prompt 4x as long costs more than 4x the compute
    assert min_device_seconds(cost, 65536) > 4 * min_device_seconds(cost, 16384) > 16 * min_device_seconds(cost, 1024)
    x = work_bound(_burst([1000, 1000, 100000]), [32, 64], cost)
    assert x["ceiling"][64] == pytest.approx(2 * x["ceiling"][32])
    assert x["ceiling"][32] == pytest.approx(32 / x["mean_device_s"])
    b = x["buckets"]
    assert b["<4K"]["num_requests"] == 2 and b["<4K"]["share_of_requests"] == pytest.approx(2 / 3)
    assert b[">64K"]["share_of_work"] > 0.95           # one long prompt outweighs the two short ones
    text = format_bound(x, {"fast": 2 * x["ceiling"][64], "slow": x["ceiling"][64] / 2})
    assert "ABOVE the ceiling" in text.split("fast:")[1].splitlines()[0]
    assert "ABOVE" not in text.split("slow:")[1]
    assert "SIMULATED" in text.splitlines()[0]


@pytest.mark.parametrize("bad", ["sync", "sync=", "=3", "sync=-1", "sync=abc", "sync=0"])
def test_bad_rates_are_refused(bad):
    with pytest.raises(ValueError, match="NAME=REQ_PER_S"):
        parse_rates([bad])


def test_the_command_line(capsys):
    from asap.cli import main
    assert main(["sim", "bound", "--workload", "fixed-4k", "--num-requests", "20", "--devices", "32",
                 "--rate", "sync=32.38"]) == 0
    out = capsys.readouterr().out
    assert "32 devices: no engine sustains more than" in out and "sync: 32.38 req/s" in out
    assert main(["sim", "bound", "--workload", "fixed-4k", "--devices", "0"]) == 2
    assert "devices must be >= 1" in capsys.readouterr().err
    assert main(["sim", "bound", "--workload", "fixed-4k", "--rate", "sync"]) == 2
    assert "NAME=REQ_PER_S" in capsys.readouterr().err


def test_a_headline_against_its_ceilings(tmp_path, capsys):
    """`asap sim bound --headline`: each row against the ceiling of the requests its maxima were confirmed on,
    and the most any engine could lead sync by; a file that is not a headline gets one line, not a traceback."""
    from asap.cli import main
    from asap.studies.bound import headline_bounds
    from asap.workload.presets import workload_requests
    cost = CostModel(get_model("deepseek-v3"), get_hardware("cloudmatrix384"))
    ceiling = work_bound(workload_requests("fixed-4k", 40), 32, cost)["ceiling"][32]
    row = {"workload": "fixed-4k", "devices": 32, "requests_available": 20,
           "sync": {"max_slo_rate": ceiling / 2, "num_requests": 40, "every_bucket": {"max_slo_rate": ceiling / 4}},
           "async": {"max_slo_rate": 1.2 * ceiling, "num_requests": 40}}
    unranked = {"workload": "fixed-4k", "devices": 64, "sync": {"max_slo_rate": None, "num_requests": None},
                "async": {"max_slo_rate": None, "num_requests": None}}
    doc = {"model": "deepseek-v3", "hardware": "cloudmatrix384", "rows": [row, unranked]}
    (r,) = headline_bounds(doc)                      # the row without a sample has nothing to set against it
    assert r["ceiling"] == pytest.approx(ceiling) and r["most_lead"] == pytest.approx(2.0)
    path = tmp_path / "headline.json"
    path.write_text(json.dumps(doc))
    assert main(["sim", "bound", "--headline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fixed-4k, 32 devices, 40 requests" in out and "could lead sync by more than 2.00x" in out
    assert "async leads 2.40x" in out and "(120.0%, ABOVE the ceiling)" in out and "(50.0%)" in out
    assert "every bucket >= 90%: sync" in out and "(25.0%)" in out and "SIMULATED" in out.splitlines()[0]
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text("{}")
    for argv, err in [(["--headline", str(tmp_path / "bad.json")], "not JSON"),
                      (["--headline", str(tmp_path / "other.json")], "not a headline"),
                      (["--headline", str(tmp_path / "missing.json")], "cannot read it"),
                      (["--headline", str(path), "--rate", "sync=1"], "leave --rate out")]:
        assert main(["sim", "bound", *argv]) == 2
        e = capsys.readouterr().err
        assert err in e and "Traceback" not in e
