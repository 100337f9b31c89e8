"""benchmarks/same_sample.py judges a headline row's configuration at one rate by the tuner's sustain rule."""
import dataclasses
import json
import os
import subprocess
import sys

from asap.studies.config import EngineConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "same_sample.py")


def _headline(tmp_path):
    cfg = EngineConfig(engine="sync", attention_tp=4, token_budget=4096)
    row = {"workload": "fixed-4k", "devices": 16,
           "sync": {"config": dataclasses.asdict(cfg), "describe": cfg.describe(16)}, "async": {"config": None}}
    path = tmp_path / "headline.json"
    path.write_text(json.dumps({"model": "deepseek-v3", "hardware": "cloudmatrix384", "slo": "2s+1ms/tok",
                                "workloads": ["fixed-4k"], "rows": [row]}))
    return str(path)


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


def test_a_rate_far_below_capacity_holds_and_one_far_above_fails(tmp_path):
    h = _headline(tmp_path)
    low = _run(h, "--devices", "16", "--engine", "sync", "--rate", "2", "--num-requests", "150")
    assert low.returncode == 0, low.stderr
    assert "SIMULATED" in low.stdout and "90% of requests: holds" in low.stdout
    high = _run(h, "--devices", "16", "--engine", "sync", "--rate", "200", "--num-requests", "150")
    assert high.returncode == 0, high.stderr
    assert "90% of requests: fails" in high.stdout


def test_a_row_the_headline_lacks_is_a_clear_error(tmp_path):
    h = _headline(tmp_path)
    p = _run(h, "--devices", "16", "--engine", "async", "--rate", "2", "--num-requests", "150")
    assert p.returncode == 2 and "no async configuration" in p.stderr and "Traceback" not in p.stderr
