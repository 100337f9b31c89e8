"""benchmarks/short_trace.py writes a trace the Azure reader takes, with the prompt lengths it promises."""
import os
import statistics
import subprocess
import sys

import pytest

from asap.workload.presets import workload_requests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "short_trace.py")


def _write(path, *args):
    return subprocess.run([sys.executable, SCRIPT, str(path), *args], capture_output=True, text=True, timeout=60)


def test_the_generated_trace_reads_back_with_its_mean_and_cap(tmp_path):
    out = tmp_path / "short.csv"
    p = _write(out, "--num-requests", "3000", "--mean", "2048", "--cap", "16384", "--seed", "3")
    assert p.returncode == 0, p.stderr
    assert "GENERATED" in p.stdout
    reqs = workload_requests(str(out), 3000)
    lengths = [r.num_tokens for r in reqs]
    assert len(lengths) == 3000 and max(lengths) <= 16384 and min(lengths) >= 16
    assert 1800 <= sum(lengths) / len(lengths) <= 2300       # the cap trims the tail a little
    arrivals = [r.arrival for r in reqs]
    assert all(b >= a for a, b in zip(arrivals, arrivals[1:]))
    assert _write(tmp_path / "again.csv", "--num-requests", "3000", "--mean", "2048", "--cap", "16384",
                  "--seed", "3").returncode == 0
    assert (tmp_path / "again.csv").read_text() == out.read_text()     # seeded


def test_cv_makes_arrivals_burstier_and_keeps_their_mean(tmp_path):
    for cv in (1.0, 3.0):
        out = tmp_path / f"cv{cv}.csv"
        assert _write(out, "--num-requests", "4000", "--cv", str(cv)).returncode == 0
        t = [r.arrival for r in workload_requests(str(out), 4000)]
        gaps = [b - a for a, b in zip(t, t[1:])]
        mean = statistics.mean(gaps)
        assert 0.9 <= mean <= 1.1                                         # 1 req/s before any rescaling
        assert abs(statistics.pstdev(gaps) / mean - cv) <= 0.25 * cv


@pytest.mark.parametrize("bad", [["--num-requests", "1"], ["--mean", "0"], ["--sigma", "-1"], ["--cv", "0"]])
def test_bad_arguments_are_refused_with_a_message(tmp_path, bad):
    p = _write(tmp_path / "x.csv", *bad)
    assert p.returncode == 2 and "need" in p.stderr and not (tmp_path / "x.csv").exists()
