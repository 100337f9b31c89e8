"""Promises of asap.measure.report and asap.bench.plots: table, JSON, PNGs, Chrome trace."""
import json

import pytest

from asap.bench import RequestResult, find_max_rate, format_table, run_record, summarize, write_chrome_trace, write_json
from asap.measure.metrics import SUMMARY_KEYS
from asap.bench.plots import plot_attainment_vs_rate, plot_timeline, plot_ttft_cdf

SPANS = [{"worker": "attn0", "kind": "compute", "start": 0.0, "end": 0.010},
         {"worker": "attn0", "kind": "stall", "start": 0.010, "end": 0.012},
         {"worker": "expert0", "kind": "idle", "start": 0.0, "end": 0.004},
         {"worker": "expert0", "kind": "compute", "start": 0.004, "end": 0.011}]


def results(scale):
    return [RequestResult(i, i * 0.1, 100, scale * (i + 1) / 10, None, None) for i in range(10)] + \
           [RequestResult(10, 1.0, 100, None, "boom", None)]


def search(threshold):
    return find_max_rate(lambda r: {"slo_attainment": 1.0 if r <= threshold else 0.5}, tol=0.05)


def test_table_shows_runs_side_by_side_with_labels():
    records = [run_record("async", summarize(results(1.0), slo=0.5), search(8.0)),
               run_record("sync (emulated)", summarize(results(2.0), slo=0.5))]
    table = format_table(records)
    lines = table.splitlines()
    assert lines[0].split()[0] == "label" and "async" in lines[0] and "sync (emulated)" in lines[0]
    assert any(line.startswith("slo_attainment") for line in lines)
    max_rate_line = next(line for line in lines if line.startswith("max_slo_rate"))
    assert max_rate_line.split()[1:] == [f"{records[0]['max_slo_rate']:.3f}", "-"]


def test_json_has_documented_keys(tmp_path):
    rec = run_record("simulated", summarize(results(1.0), slo=0.5), search(8.0))
    write_json(tmp_path / "out" / "bench.json", [rec])
    [loaded] = json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]
    assert set(SUMMARY_KEYS) <= set(loaded) and loaded["label"] == "simulated"
    assert loaded["max_slo_rate"] == rec["max_slo_rate"]
    assert len(loaded["search"]["points"]) == len(rec["search"]["points"]) > 0
    assert set(loaded["search"]["points"][0]) == {"rate", "summary"}


def test_plots_write_non_empty_pngs(tmp_path):
    plot_ttft_cdf({"async": results(1.0), "sync": results(2.0)}, tmp_path / "cdf.png", slo_s=0.5)
    plot_attainment_vs_rate({"async": search(8.0)["points"], "sync": search(4.0)["points"]}, tmp_path / "rate.png")
    plot_timeline(SPANS, tmp_path / "timeline.png")
    for name in ("cdf.png", "rate.png", "timeline.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_chrome_trace_has_one_event_per_span(tmp_path):
    write_chrome_trace(SPANS, tmp_path / "trace.json")
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(SPANS)
    assert {e["tid"] for e in spans if e["name"] == "compute"} == {0, 1}
    assert spans[1]["ts"] == pytest.approx(10_000) and spans[1]["dur"] == pytest.approx(2_000)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {0: "attn0", 1: "expert0"}


@pytest.mark.parametrize("bad, match", [({"worker": "w", "kind": "busy", "start": 0, "end": 1}, "kind"),
                                        ({"worker": "w", "kind": "idle", "start": 2, "end": 1}, "before"),
                                        ({"kind": "idle", "start": 0, "end": 1}, "worker")])
def test_bad_spans_raise(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        write_chrome_trace([bad], tmp_path / "t.json")
