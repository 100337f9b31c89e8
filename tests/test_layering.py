"""Package dependencies point down only, read from the imports of every module (function-level ones too).

The declared order, lowest first; a package may import itself and packages below it:

  scheduler   policies: small pure-CPU objects (no torch), used by everything above
  model       the math, written once (ModelConfig lives in model/config.py)
  config      RuntimeConfig; re-exports ModelConfig
  cost        the one cost model (formulas once), over config
  pipeline    the step state machine and the exchange interface: pure Python, over scheduler
  workload    arrivals, lengths, traces -> Request
  measure     per-request results, their summary, the rate search, tables (below sim and bench alike)
  sim         the simulator's core: events, both simulated engines, their exchanges, experts, memory, run
  comm        the data plane (typed headers + tensors); uses the expert-selection policy
  workers     what runs in a worker process: loops over the pipeline and comm
  engine      the user API, which starts workers
  asap        the package root (re-exports engine's LLM)
  studies     what is studied on the simulator: tune, headline, plan, explain, calibrate, profile
  bench       metrics, replay, targets (engines or the simulator)
  demo        `asap demo`: the headline comparison, simulated, emulated or real, over bench
  kv          the client side of the KV hand-off (pull a prefilled KV cache from a server)
  server      the HTTP server over an engine
  cli         the `asap` command: every package registers its sub-commands here

Why studies sit above engine: `asap profile` (studies/profile.py, studies/kernels.py) times the
workers' real kernels and the shm link to fit the simulator's CPU profile, so it needs the runtime. The
simulator's core needs none of it and sits below the runtime. Why comm may import scheduler:
the expert side's batching choice is a policy (scheduler/expert_select.py), and policies are the
bottom layer, not a peer.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "asap"
ORDER = ["scheduler", "model", "config", "cost", "pipeline", "workload", "measure", "sim", "comm", "workers", "engine",
         "asap", "studies", "bench", "demo", "kv", "server", "cli"]
PURE = ("scheduler", "pipeline")          # no torch, no numpy, no processes

# Known upward package edges, all in files the author of this test does not own; each is a cycle to
# remove (the lead's list). Package-level, so a new file on a known edge does not break the build.
ALLOWED: set = set()


def _package(path: Path) -> str:
    """A module's layer: its package, except that command modules (cli.py, __main__.py: what `asap X` and
    `python -m asap.X` run) sit with the `asap` command on top, whichever package they live in."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] in ("cli", "__main__"):
        return "cli"
    if len(parts) == 1:
        return {"__init__": "asap"}.get(parts[0], parts[0])
    return parts[0]


def _imports(path: Path):
    """(imported top-level name, imported asap package or None) for every import in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names] if node.module == "asap" else [])
        elif isinstance(node, ast.ImportFrom):
            names = [f"asap.{_package(path)}"]           # relative import: its own package
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "asap":
                yield parts[0], None
            elif len(parts) == 1:
                yield "asap", "asap"
            else:
                pkg = parts[1]
                if parts[-1] in ("cli", "__main__"):            # a command module: the top layer
                    pkg = "cli"
                yield "asap", pkg if (ROOT / pkg).is_dir() or pkg in ("config", "cli") else "asap"


def _modules():
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_is_in_the_declared_order():
    packages = {_package(p) for p in _modules()}
    assert packages <= set(ORDER), f"place these packages in tests/test_layering.py ORDER: {packages - set(ORDER)}"


def test_dependencies_point_down_only():
    rank = {name: i for i, name in enumerate(ORDER)}
    upward, used = [], set()
    for path in _modules():
        src, rel = _package(path), str(path.relative_to(ROOT.parent))
        for _, dst in _imports(path):
            if dst is None or dst == src or rank[dst] < rank[src]:
                continue
            if (src, dst) in ALLOWED:
                used.add((src, dst))
                continue
            upward.append(f"{rel} ({src}) imports {dst}")
    assert not upward, "upward imports:\n" + "\n".join(sorted(set(upward)))
    stale = ALLOWED - used
    assert not stale, f"these cycles are gone: remove them from ALLOWED: {sorted(stale)}"


def test_policies_and_the_pipeline_are_pure_python():
    for path in _modules():
        if _package(path) in PURE:
            heavy = {top for top, _ in _imports(path)} & {"torch", "numpy", "multiprocessing"}
            assert not heavy, f"{path.relative_to(ROOT.parent)} imports {heavy}"


def test_no_scheduler_policy_imports_the_simulator_or_bench():
    for path in _modules():
        rel = str(path.relative_to(ROOT.parent))
        if _package(path) == "scheduler":
            bad = {dst for _, dst in _imports(path) if dst in ("sim", "bench")}
            assert not bad, f"{rel} imports {bad}"
