"""Promise of `asap demo`: sync and async on the same calibrated workload, a comparison table that
accounts for every request, and the JSON and plots in the output directory."""
import json

from asap.bench.demo import count_for
from asap.cli import main


def test_count_for_fills_the_token_budget_within_bounds():
    assert count_for([10, 10, 10, 10], 25, 1, 10) == 2
    assert count_for([10, 10, 10, 10], 5, 3, 10) == 3
    assert count_for([10] * 100, 1e9, 1, 16) == 16


def test_quick_demo_prints_the_table_and_writes_json_and_plots(tmp_path, capsys):
    out = tmp_path / "demo-out"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    for text in ("REAL compute", "SLO: TTFT <=", "calibration:", "wall time", "ttft_p90_ms", "slo_attainment",
                 "attention0", "expert0", "rank0", "rank1"):
        assert text in stdout, text
    table = stdout[stdout.index("label"):]
    assert table.splitlines()[0].split() == ["label", "sync", "async"]
    runs = json.loads((out / "demo.json").read_text())["runs"]
    assert [r["target"] for r in runs] == ["sync", "async"]
    n = runs[0]["num_requests"]
    assert n >= 12 and all(r["num_requests"] == n and r["num_failed"] == 0 for r in runs)
    assert runs[0]["calibration"]["slo_s"] > 0 and runs[0]["slo"] == runs[1]["slo"]
    for name in ("ttft_cdf.png", "timeline_sync.png", "timeline_async.png"):
        assert (out / name).stat().st_size > 0, name
