"""Per-step expert loads: the token-expert rows each expert worker really gets in one batch of one MoE layer.

The expected-load model (ExpertShares.max_share) gives every batch the same busiest worker. Real serving
is worse: each batch routes to its own mix of experts, and the placement (EPLB) was planned on statistics
of other batches. `StepLoads` draws that, per batch and MoE layer, seeded:

1. Dataset popularity p (per layer, what EPLB's statistics say): measured loads, or a Zipf skew
   (asap.sim.experts.zipf_loads; 0 = uniform). The placement (balanced_placement: redundant copies,
   packing) is planned on p; a replicated expert's tokens split evenly over its copies (ReplicaChooser).
2. The batch's popularity drifts from p: p_b = p * exp(skew * z - skew**2 / 2), z ~ N(0, 1) per expert,
   renormalised. `skew` is the log-normal spread of an expert's share in one batch around its long-run
   share: the "stale statistics" EPLB cannot see. skew = 0 is "simulated perfect EPLB".
3. The batch's tokens route by the model's rule: DeepSeek-V3 picks `topk_group` of `n_group` groups per
   token, then top-k experts inside them; Qwen3 plain top-k. Counts are drawn as multinomials (groups,
   then experts inside the picked groups), never per token.

Speed (the simulator calls this once per expert batch, ~10^5 times a run): the draws are banked. Per
layer, NUM_DRIFTS drift states give each worker's mean share q_w; one bank of NUM_NOISE noise vectors,
drawn once from the routing rule (step 3) for a reference batch through the layer-0 placement, gives
each worker's standardised count noise. A batch of R = T * top_k rows then gets
    rows_w = R * q_w + sqrt(R * q_w) * noise_w        (a drift state and a noise vector picked at random)
which is a numpy expression over the W workers (`rows`, what a sync all-to-all needs). An async expert
batch needs only the busiest worker (`max_rows`), so per layer NUM_TABLE (drift, noise) pairs have
max_w (q_w + noise_w sqrt(q_w) / sqrt(R)) tabulated on a log grid of R at construction; a draw is then a
table lookup and an interpolation in pure Python. The noise is Gaussian in shape at the reference size
(T_REF tokens); below it the count noise is rounded off at 0.

Where the default `skew` (0.12) comes from: a published expert-load statistic, TensorRT-LLM's EPLB table
(DeepSeek-R1, EP32, 9 slots per rank: busiest-rank imbalance 0.109, rank std 52 rows; the model: 0.108,
50.6). asap/studies/calibrate.py shows the derivation, its checks (SGLang's 1K/2K/4K series shape) and why
the skew that would reproduce SGLang's default point from its perfect-EPLB point (~0.56) is rejected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asap.scheduler.placement import Placement

MODES = ("expected", "drawn")
NUM_DRIFTS = 64         # drift states per MoE layer
NUM_NOISE = 64          # routing-noise vectors (shared by the layers)
T_REF = 8192            # tokens of the reference batch the noise is drawn for
_INDEX_BLOCK = 4096     # random (drift, noise) picks drawn at a time
NUM_TABLE = 64          # (drift, noise) pairs per layer tabulated for max_rows
_GRID_N = 22            # log-spaced sqrt(rows) from 1 to ~10^4.5 (a batch of 1 to ~10^8 tokens at top-8)
_GRID_LO, _GRID_HI = 0.0, 10.5
_GRID_INV = (_GRID_N - 1) / (_GRID_HI - _GRID_LO)
_GRID = np.linspace(_GRID_LO, _GRID_HI, _GRID_N)


@dataclass(frozen=True)
class LoadModel:
    """How expert loads are modelled. mode "expected": every batch gets the expected busiest worker
    (the old model, bit for bit); "drawn": per-batch draws (StepLoads) with popularity drift `skew`."""
    mode: str = "expected"
    skew: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"expert load mode must be one of {MODES}, got {self.mode!r}")
        if not self.skew >= 0:
            raise ValueError(f"expert popularity skew must be >= 0, got {self.skew}")


# The default load model of every simulated run and of emulated routing: per-batch draws, with the
# popularity drift derived from TensorRT-LLM's published EPLB load table (asap.studies.calibrate says how and
# what checks it). LoadModel("expected") reproduces runs made before per-step loads bit for bit.
DEFAULT_MODE = "drawn"
DEFAULT_SKEW = 0.12
DEFAULT_LOAD = LoadModel(DEFAULT_MODE, DEFAULT_SKEW, 0)


class StepLoads:
    """Per-batch rows per expert worker, drawn (seeded) from the routing model; see the module doc."""

    def __init__(self, placement: Placement, popularity: list[list[float]], top_k: int, n_group: int = 1,
                 topk_group: int = 1, skew: float = 0.0, seed: int = 0):
        W, L = placement.num_workers, placement.num_layers
        E = placement.num_experts
        if len(popularity) != L or any(len(row) != E for row in popularity):
            raise ValueError(f"popularity must be [{L} layers][{E} experts]")
        if n_group < 1 or E % n_group or not 1 <= topk_group <= n_group:
            raise ValueError(f"bad expert groups: n_group={n_group}, topk_group={topk_group}, E={E}")
        self.num_workers, self.top_k, self.skew = W, top_k, skew
        self.rng = np.random.default_rng([seed, 0xE1])
        self.slots = [_slot_table(placement, layer) for layer in range(L)]
        pop = np.asarray(popularity, dtype=float)
        self.popularity = pop / pop.sum(axis=1, keepdims=True)
        self.mean = [self._worker_share(layer, self.popularity[layer][None, :])[0] for layer in range(L)]
        drifts = [self._drifts(layer) for layer in range(L)]                 # [layer] (NUM_DRIFTS, W)
        # kept as lists of rows: indexing a list is cheaper than a 2-D array on the hot path
        self.q = [list(q) for q in drifts]
        self.sq = [list(np.sqrt(q)) for q in drifts]
        self.noise = list(self._routing_noise(n_group, topk_group))          # [NUM_NOISE] (W,)
        self._tables = [self._max_table(layer) for layer in range(L)]
        self._picks: list = [None] * L
        self._next = [0] * L
        self._max_picks: list = [None] * L
        self._next_max = [0] * L

    # ---- construction ----
    def _worker_share(self, layer: int, p: np.ndarray) -> np.ndarray:
        """(n, E) expert popularity -> (n, W) each worker's share of the layer's rows."""
        expert, weight, _ = self.slots[layer]
        return (p[:, expert] * weight).reshape(len(p), self.num_workers, -1).sum(axis=2)

    def _drifts(self, layer: int) -> np.ndarray:
        p = self.popularity[layer]
        if self.skew == 0:
            return self._worker_share(layer, p[None, :])
        z = self.rng.standard_normal((NUM_DRIFTS, len(p)))
        pb = p * np.exp(self.skew * z)
        return self._worker_share(layer, pb / pb.sum(axis=1, keepdims=True))

    def _routing_noise(self, n_group: int, topk_group: int) -> np.ndarray:
        """Standardised per-worker count noise of a T_REF-token batch routed by the model's rule."""
        p = self.popularity[0]
        E = len(p)
        groups = p.reshape(n_group, E // n_group)
        pg = groups.sum(axis=1)
        group_picks = self.rng.multinomial(T_REF * topk_group, pg, size=NUM_NOISE)        # (N, G)
        per_pick = self.top_k / topk_group
        counts = self.rng.multinomial(np.rint(group_picks * per_pick).astype(np.int64),
                                      groups / pg[:, None])                               # (N, G, E/G)
        rows = self._worker_share(0, counts.reshape(NUM_NOISE, E).astype(float))
        expect = T_REF * self.top_k * self.mean[0]
        return (rows - expect) / np.sqrt(np.maximum(expect, 1e-12))

    def _max_table(self, layer: int) -> list[list[float]]:
        """For NUM_TABLE random (drift, noise) pairs: max_w (q_w + c_w / r) on a log grid of r = sqrt(rows),
        so a batch's busiest worker is R * (that), interpolated: max_rows without numpy on the hot path."""
        i = self.rng.integers(0, len(self.q[layer]), NUM_TABLE)
        j = self.rng.integers(0, NUM_NOISE, NUM_TABLE)
        q = np.asarray(self.q[layer])[i]                                        # (C, W)
        c = np.asarray(self.sq[layer])[i] * np.asarray(self.noise)[j]           # (C, W)
        return np.stack([(q + c * math.exp(-g)).max(axis=1) for g in _GRID], axis=1).tolist()   # (C, G)

    # ---- draws ----
    def _pick(self, moe_idx: int) -> tuple[int, int]:
        """A random (drift state, noise vector), from a block of picks drawn ahead."""
        n = self._next[moe_idx]
        picks = self._picks[moe_idx]
        if picks is None or n == len(picks):
            ij = self.rng.integers(0, NUM_DRIFTS * NUM_NOISE, _INDEX_BLOCK)
            picks = self._picks[moe_idx] = list(zip((ij // NUM_NOISE % len(self.q[moe_idx])).tolist(),
                                                    (ij % NUM_NOISE).tolist()))
            n = 0
        self._next[moe_idx] = n + 1
        return picks[n]

    def rows(self, moe_idx: int, num_tokens: float) -> np.ndarray:
        """Token-expert rows per worker for one batch of `num_tokens` tokens at MoE layer `moe_idx`."""
        i, j = self._pick(moe_idx)
        R = num_tokens * self.top_k
        out = R * self.q[moe_idx][i] + R ** 0.5 * (self.sq[moe_idx][i] * self.noise[j])
        return np.maximum(out, 0.0, out=out)

    def max_rows(self, moe_idx: int, num_tokens: float) -> float:
        """The busiest worker's rows of one batch: the hot path (once per async expert batch), so from a
        table of NUM_TABLE drawn (drift, noise) pairs per layer, interpolated in log sqrt(rows) (<0.5%)."""
        n = self._next_max[moe_idx]
        picks = self._max_picks[moe_idx]
        if picks is None or n == len(picks):
            picks = self._max_picks[moe_idx] = self.rng.integers(0, NUM_TABLE, _INDEX_BLOCK).tolist()
            n = 0
        self._next_max[moe_idx] = n + 1
        row = self._tables[moe_idx][picks[n]]
        R = num_tokens * self.top_k
        x = (0.5 * math.log(R) - _GRID_LO) * _GRID_INV if R > 0 else 0.0
        k = min(max(int(x), 0), _GRID_N - 2)
        f = min(max(x - k, 0.0), 1.0)
        v = row[k] + f * (row[k + 1] - row[k])
        return R * v if v > 0 else 0.0

    def expected_max_share(self, moe_idx: int) -> float:
        """The busiest worker's share of the layer's rows with no drift and no noise (EPLB's own view)."""
        return float(self.mean[moe_idx].max())


def _slot_table(placement: Placement, layer: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(expert, weight) of every expert copy, grouped by worker (equal slots each): a copy carries
    1/copies of its expert's rows. Workers with fewer copies than the most get zero-weight padding."""
    per_worker: list[list[tuple[int, float]]] = [[] for _ in range(placement.num_workers)]
    for e, workers in enumerate(placement.replicas[layer]):
        for w in workers:
            per_worker[w].append((e, 1.0 / len(workers)))
    slots = max(len(s) for s in per_worker)
    expert = np.zeros((placement.num_workers, slots), dtype=np.int64)
    weight = np.zeros((placement.num_workers, slots))
    for w, s in enumerate(per_worker):
        for k, (e, wt) in enumerate(s):
            expert[w, k], weight[w, k] = e, wt
    return expert.ravel(), weight.ravel(), slots


class TokenRouting:
    """Per-token expert ids for emulated compute, drawn from the same load model as StepLoads: one batch's
    popularity drift (keyed, so every caller with the same key sees the same drift), then its tokens' picks
    by the model's rule (groups, then experts inside them), as counts turned into ids. A token may get the
    same expert twice (counts are drawn, not per-token top-k): the expert side then sees one more row,
    which is what its cost counts. popularity: [moe_layer][expert] dataset loads (None: uniform)."""

    def __init__(self, model, load: LoadModel, popularity: list[list[float]] | None = None):
        self.E, self.top_k = model.num_experts, model.top_k
        self.n_group, self.topk_group = model.n_group, model.topk_group
        self.load = load
        n_moe = sum(model.moe_layers)
        pop = np.ones((n_moe, self.E)) if popularity is None else np.asarray(popularity, dtype=float)
        self.popularity = pop / pop.sum(axis=1, keepdims=True)

    def route(self, moe_idx: int, num_tokens: int, key: tuple, rng: np.random.Generator) -> np.ndarray:
        """(num_tokens, top_k) expert ids; `key` picks the batch's drift, `rng` the tokens' own draws."""
        p = self.popularity[moe_idx]
        if self.load.skew:
            z = np.random.default_rng([self.load.seed, 0xD7, moe_idx, *key]).standard_normal(self.E)
            p = p * np.exp(self.load.skew * z)
            p = p / p.sum()
        groups = p.reshape(self.n_group, -1)
        pg = groups.sum(axis=1)
        group_picks = rng.multinomial(num_tokens * self.topk_group, pg)
        per_pick = self.top_k // self.topk_group
        counts = rng.multinomial(group_picks * per_pick, groups / pg[:, None]).ravel()
        short = num_tokens * self.top_k - int(counts.sum())     # top_k not a multiple of topk_group
        if short:
            counts += rng.multinomial(short, p)
        ids = rng.permutation(np.repeat(np.arange(self.E), counts))
        return ids.reshape(num_tokens, self.top_k)
