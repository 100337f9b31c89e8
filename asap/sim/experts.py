"""Expert load imbalance: per-expert load vectors -> what the busiest expert worker gets.

Loads come from measured routing statistics (`RoutingStats.loads()`, or a JSON
file holding that [moe_layer][expert] table) or from a Zipf skew (exponent 0 =
uniform). The placement policy (asap.scheduler.placement, reused as is) turns
loads into copies on workers; the cost model only needs, per MoE layer, the
largest fraction of the layer's top-k assignments that any one worker receives
(tokens of a replicated expert split evenly over its copies, which is what
`ReplicaChooser` does in expectation) and the number of expert slots per worker.
With a LoadModel of mode "drawn", the shares also carry per-batch draws (asap.cost.loads.StepLoads):
the same placement, planned on these loads (EPLB's statistics), with each batch's own popularity drift
and routing noise on top.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from asap.cost.loads import DEFAULT_MODE, DEFAULT_SKEW, LoadModel, StepLoads
from asap.cost.shares import ExpertShares
from asap.scheduler.placement import Placement, balanced_placement

__all__ = ["DEFAULT_SKEW", "ExpertShares", "LoadModel", "load_model", "plan_experts", "read_loads", "zipf_loads"]


def zipf_loads(num_layers: int, num_experts: int, exponent: float, seed: int = 0) -> list[list[float]]:
    """load(rank i) ~ 1 / i**exponent, shuffled over experts independently per layer."""
    if exponent < 0:
        raise ValueError(f"Zipf exponent must be >= 0, got {exponent}")
    base = 1.0 / np.arange(1, num_experts + 1) ** exponent
    base /= base.sum()
    rng = np.random.default_rng(seed)
    return [list(base[rng.permutation(num_experts)]) for _ in range(num_layers)]


def read_loads(path: str | Path) -> list[list[float]]:
    """A JSON file with a [moe_layer][expert] table (RoutingStats.loads()), bare or under "loads"."""
    data = json.loads(Path(path).read_text())
    table = data["loads"] if isinstance(data, dict) else data
    if not table or not all(isinstance(row, list) and row for row in table):
        raise ValueError(f"{path}: expected a non-empty [layer][expert] table of loads")
    return [[float(x) for x in row] for row in table]


def plan_experts(loads: list[list[float]], num_workers: int, num_redundant: int | None = None,
                 load_model: LoadModel | None = None, model=None) -> ExpertShares:
    """Place experts with `balanced_placement` (EPLB-style) and summarise the busiest worker per layer.

    num_redundant defaults to the fewest extra copies that give every worker the same slot count.
    Layers whose sorted loads are identical (e.g. a shuffled Zipf) share one placement computation.
    load_model (mode "drawn") adds per-batch draws; `model` (a ModelConfig) then gives top_k and the
    expert groups of its routing.
    """
    num_experts = len(loads[0])
    if num_redundant is None:
        num_redundant = (-num_experts) % num_workers
    shares: dict[tuple, float] = {}
    out = []
    for row in loads:
        total = float(sum(row))
        if total <= 0:
            raise ValueError("every MoE layer needs a positive total load")
        norm = [x / total for x in row]
        key = tuple(sorted(np.round(norm, 12)))
        if key not in shares:
            shares[key] = _max_share(balanced_placement([norm], num_workers, num_redundant), norm)
        out.append(shares[key])
    slots = (num_experts + num_redundant) // num_workers
    if load_model is None or load_model.mode == "expected":
        return ExpertShares(num_workers, tuple(out), slots)
    if model is None:
        raise ValueError("drawn expert loads need the model (top_k, n_group, topk_group)")
    placement = _placement(loads, num_workers, num_redundant)
    draws = StepLoads(placement, loads, model.top_k, model.n_group, model.topk_group, load_model.skew,
                      load_model.seed)
    return ExpertShares(num_workers, tuple(out), slots, draws)


def _placement(loads: list[list[float]], num_workers: int, num_redundant: int) -> Placement:
    """balanced_placement of every layer, computed once per distinct sorted load row and permuted
    (a shuffled Zipf's layers all share one computation)."""
    cache: dict[tuple, tuple] = {}
    layers = []
    for row in loads:
        norm = np.asarray(row, dtype=float) / float(sum(row))
        order = np.lexsort((np.arange(len(norm)), -norm))          # heaviest first, ties by expert id
        key = tuple(np.round(norm[order], 12))
        if key not in cache:
            cache[key] = balanced_placement([list(norm[order])], num_workers, num_redundant).replicas[0]
        by_rank = cache[key]
        rank = np.empty(len(norm), dtype=np.int64)
        rank[order] = np.arange(len(norm))
        layers.append(tuple(by_rank[r] for r in rank))
    return Placement(num_workers, tuple(layers))


def _max_share(placement: Placement, load: list[float]) -> float:
    per_worker = np.zeros(placement.num_workers)
    for e, workers in enumerate(placement.replicas[0]):
        per_worker[list(workers)] += load[e] / len(workers)
    return float(per_worker.max())


# Defaults for every simulated run (asap.cost.loads): per-batch drawn loads, with the popularity drift
# derived from TensorRT-LLM's published EPLB load table (asap.studies.calibrate says how, and what it checks).
# expert_load="expected" reproduces runs made before per-step loads bit for bit.
DEFAULT_LOAD_MODE = DEFAULT_MODE


def load_model(mode: str | None = None, skew: float | None = None, seed: int = 0) -> LoadModel:
    """The expert-load model of a run: mode "drawn" (per-batch loads: asap.cost.loads) or "expected"
    (every batch gets the expected busiest worker: the model before per-step loads, bit for bit);
    skew is the per-batch popularity drift (None: DEFAULT_SKEW, fitted in asap.studies.calibrate)."""
    return LoadModel(DEFAULT_LOAD_MODE if mode is None else mode, DEFAULT_SKEW if skew is None else float(skew), seed)
