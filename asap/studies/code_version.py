"""A fingerprint of the code a simulated result depends on, so a stored result can say whether it is current.

It hashes the simulator and everything it runs: the cost model, the step core, the simulator's core, the
policies, the rate search and the workloads (asap/cost, asap/pipeline, asap/sim, asap/scheduler,
asap/measure, asap/workload), plus the studies a stored result is made by (STUDIES: the tuner with its
configurations, space and screen, the experiments' SLO rule and the headline's search). Each file counts by
its syntax tree without its docstrings (comments never reach the tree): an edit to the documentation alone
leaves it as it was, any change to the code does not. `asap sim headline` records it in its JSON; the
demo's stored tuning (asap/demo/tuning.py) compares it with `is_current`.

A change that only makes the simulator faster changes the fingerprint but no result. Where
`benchmarks/sim_equivalence.py --record` found two checkouts to simulate the same battery bit for bit, it
records the pair in equivalent.json (beside this file); `is_current` follows those records, so results
stored under the older fingerprint stay current without a rerun.
"""
from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

PACKAGES = ("cost", "pipeline", "sim", "scheduler", "measure", "workload")
STUDIES = ("studies/tune.py", "studies/tune_tasks.py", "studies/config.py", "studies/space.py", "studies/screen.py",
           "studies/experiments.py", "studies/headline.py", "studies/carry.py", "studies/skeptic.py")
EQUIVALENT = Path(__file__).resolve().with_name("equivalent.json")


def fingerprint() -> str:
    """12 hex digits of a SHA-256 over the simulation code (see the module docstring)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    files = [f for sub in PACKAGES for f in sorted((root / sub).rglob("*.py"))] + [root / s for s in STUDIES]
    for f in files:
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


def is_current(stored: str | None) -> bool:
    """Whether a result stored under fingerprint `stored` holds for this code: it is this code's fingerprint,
    or recorded equivalences (EQUIVALENT: [{"from", "to", ...}]) link it to this code's."""
    now = fingerprint()
    if stored is None or stored == now:
        return stored == now
    ledger = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.is_file() else []
    to: dict[str, list[str]] = {}
    for e in ledger:                        # "the same, bit for bit" goes both ways
        to.setdefault(e["from"], []).append(e["to"])
        to.setdefault(e["to"], []).append(e["from"])
    seen, todo = set(), [stored]
    while todo:
        fp = todo.pop()
        if fp == now:
            return True
        if fp not in seen:
            seen.add(fp)
            todo += to.get(fp, [])
    return False
