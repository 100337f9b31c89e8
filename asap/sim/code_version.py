"""A fingerprint of the code a simulated result depends on, so a stored result can say whether it is current.

It hashes the cost model, the step core, the simulator, the policies and the rate search (asap/cost,
asap/pipeline, asap/sim, asap/scheduler, asap/measure), each file's syntax tree without its docstrings
(comments never reach the tree): an edit to the documentation alone leaves it as it was, any change to
the code does not. asap/sim's commands and studies (NOT_SIMULATION) are off the simulation path and left
out. `asap sim headline` records it in its JSON; the demo's stored tuning (asap/demo/tuning.py) compares it.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PACKAGES = ("cost", "pipeline", "sim", "scheduler", "measure")
# asap/sim files off the simulation path: commands and other studies
NOT_SIMULATION = {"__main__.py", "cli.py", "headline.py", "plan.py", "validate.py", "profile.py", "calibrate.py",
                  "from_runtime.py", "trace_export.py", "explain.py", "parallel.py", "kernels.py", "code_version.py"}


def fingerprint() -> str:
    """12 hex digits of a SHA-256 over the simulation code (see the module docstring)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in PACKAGES:
        for f in sorted((root / sub).rglob("*.py")):
            if sub == "sim" and f.name in NOT_SIMULATION:
                continue
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + code_text(f.read_text()).encode() + b"\0")
    return h.hexdigest()[:12]


def code_text(source: str) -> str:
    """The source's syntax tree without docstrings (module, class and function), as text."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)
