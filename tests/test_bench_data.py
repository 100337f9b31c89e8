"""Promises of the shipped trace: it lives inside the package, is small, reads like the full trace
(its first 20 minutes, unaltered), and is what `asap bench` uses when no --trace is given."""
import argparse
import gzip
import json
from pathlib import Path

import pytest

import asap
from asap.bench.cli import build_workload, register
from asap.workload.traces import default_trace_path, read_trace

FULL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation.jsonl"


def test_default_trace_is_inside_the_package_with_its_licence():
    path = default_trace_path()
    package = Path(asap.__file__).resolve().parent
    assert path.is_file() and package in path.resolve().parents
    assert path.stat().st_size <= 1 << 20
    notice = (path.parent / "NOTICE").read_text()
    assert "Apache License" in notice and "kvcache-ai/Mooncake" in notice


def test_default_trace_reads_as_a_mooncake_trace():
    trace = read_trace(default_trace_path())
    assert len(trace) == 3658
    assert trace.arrivals[0] == 0.0 and trace.arrivals[-1] < 20 * 60
    assert trace.input_lengths.min() >= 1 and 5000 < trace.input_lengths.mean() < 20000


@pytest.mark.skipif(not FULL.is_file(), reason="full Mooncake trace not present")
def test_default_trace_is_the_unaltered_start_of_the_full_trace():
    with gzip.open(default_trace_path(), "rt") as f:
        sample = f.read().splitlines()
    with FULL.open() as f:
        full = [next(f).rstrip("\n") for _ in range(len(sample) + 1)]
    assert sample == full[:len(sample)]
    assert json.loads(full[len(sample)])["timestamp"] >= 20 * 60_000     # the sample stops at 20 minutes


def test_gzip_and_plain_traces_read_the_same(tmp_path):
    lines = ['{"timestamp": 0, "input_length": 10, "output_length": 1}',
             '{"timestamp": 1500, "input_length": 20, "output_length": 2}']
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_text("\n".join(lines) + "\n")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, b = read_trace(plain), read_trace(packed)
    assert list(a.arrivals) == list(b.arrivals) == [0.0, 1.5]
    assert list(a.input_lengths) == list(b.input_lengths) == [10, 20]


def test_bench_defaults_to_the_shipped_trace(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)             # nothing relative to the working directory either
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--num-requests", "5"])
    w = build_workload(args, vocab_size=512, max_position=1 << 20, with_prompts=False)
    assert Path(w.trace) == default_trace_path()
    assert [r.num_tokens for r in w.build()] == [int(x) for x in read_trace(default_trace_path()).input_lengths[:5]]
