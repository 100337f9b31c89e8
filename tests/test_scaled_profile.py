"""benchmarks/scaled_profile.py scales every op's compute and memory rate, leaves the links alone, and the
calibration point it prints moves by about that factor."""
import json
import os
import re
import subprocess
import sys

from asap.cost.hardware import get_hardware

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "scaled_profile.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_scales_op_rates_only_and_the_point_follows(tmp_path):
    out = tmp_path / "cm_half.json"
    p = _run("cloudmatrix384", 0.5, out)
    assert p.returncode == 0, p.stderr
    base, scaled = get_hardware("cloudmatrix384"), get_hardware(str(out))
    assert scaled.link == base.link and scaled.memory_bytes == base.memory_bytes
    b, s = base.to_json()["ops"], scaled.to_json()["ops"]
    assert set(b) == set(s) and b
    for name in b:
        assert s[name]["flops_per_s"] == b[name]["flops_per_s"] * 0.5
        assert s[name]["bytes_per_s"] == b[name]["bytes_per_s"] * 0.5
        assert s[name]["overhead_s"] == b[name]["overhead_s"]          # launch overheads stay
    assert json.loads(out.read_text())["calibrated"] is False
    # the CloudMatrix point: halving compute costs throughput, but less than half (links stay as fast)
    m = re.search(r"\[SIMULATED\] CloudMatrix[^:]*: (\d+) -> (\d+) tok/s", p.stdout)
    assert m, p.stdout
    before, after = int(m.group(1)), int(m.group(2))
    assert 0.5 * before <= after < 0.75 * before


def test_a_factor_that_is_not_positive_is_refused(tmp_path):
    p = _run("cloudmatrix384", 0, tmp_path / "x.json")
    assert p.returncode == 2 and "factor must be > 0" in p.stderr
    assert not (tmp_path / "x.json").exists()
