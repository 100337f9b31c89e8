"""The package installs beside any torch from 2.6 up (issue 26 point 1): it asks for a range, not a pin,
and CI installs the CPU build explicitly before the package, so a plain range never pulls a CUDA build."""
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")       # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_torch_is_a_range_from_2_6_that_takes_any_later_build():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(Requirement(d) for d in deps if Requirement(d).name == "torch")
    for ok in ("2.6.0", "2.8.0", "2.11.0", "2.13.0", "2.13.0+cpu", "2.11.0+cu128"):
        assert torch.specifier.contains(ok), ok
    assert not torch.specifier.contains("2.5.1")


def test_ci_installs_the_cpu_torch_before_the_package_and_runs_the_readme_command():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    torch_at = next(i for i, ln in enumerate(lines) if re.match(r"pip install torch==\d", ln))
    package_at = next(i for i, ln in enumerate(lines) if "pip install -e" in ln)
    assert torch_at < package_at
    assert lines[-1] == "python -m pytest"
