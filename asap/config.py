"""Model configuration, normalised from a Hugging Face `config.json`.

One frozen dataclass covers both supported families; fields that only one
family has are None for the other. Everything downstream (model, cost model,
simulator) reads this object, never the raw JSON.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("deepseek_v3", "qwen3_moe")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    intermediate_size: int          # dense MLP width (dense layers)
    moe_intermediate_size: int      # per-expert width
    num_experts: int                # routed experts per MoE layer
    top_k: int
    moe_layers: tuple[bool, ...]    # per layer: True = routed MoE, False = dense MLP
    norm_topk_prob: bool
    scoring: str                    # "sigmoid" (DeepSeek-V3) or "softmax" (Qwen3-MoE)
    tie_word_embeddings: bool = False
    # GQA (Qwen3-MoE)
    head_dim: int | None = None
    # MLA (DeepSeek-V3)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_interleave: bool = False
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if len(self.moe_layers) != self.num_layers:
            raise ValueError("moe_layers must have one entry per layer")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..num_experts={self.num_experts}")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise ValueError("n_group must divide num_experts and topk_group <= n_group")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")

    # ---- derived -------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.model_type == "deepseek_v3"

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i, m in enumerate(self.moe_layers) if m]

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def kv_cache_dims(self) -> dict[str, tuple[int, ...]]:
        """Per-token KV cache entry shapes of one layer (see docs/ARCHITECTURE.md)."""
        if self.is_mla:
            return {"kv_latent": (self.kv_lora_rank,), "k_rope": (self.qk_rope_head_dim,)}
        return {"k": (self.num_kv_heads, self.head_dim), "v": (self.num_kv_heads, self.head_dim)}

    def num_params(self) -> dict[str, int]:
        """Parameter counts split the way the runtime places them."""
        D = self.hidden_size
        if self.is_mla:
            H, q, kv = self.num_heads, self.q_lora_rank, self.kv_lora_rank
            q_proj = (D * q + q + q * H * self.qk_head_dim) if q else D * H * self.qk_head_dim
            attn = q_proj + D * (kv + self.qk_rope_head_dim) + kv + kv * H * (self.qk_nope_head_dim + self.v_head_dim) \
                + H * self.v_head_dim * D
        else:
            hd = self.head_dim
            attn = D * hd * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * hd * D + 2 * hd
        ffn = lambda inter: 3 * D * inter  # noqa: E731
        n_moe = sum(self.moe_layers)
        n_dense = self.num_layers - n_moe
        attention_side = self.num_layers * (attn + 2 * D) + n_dense * ffn(self.intermediate_size) \
            + n_moe * (self.num_experts * D + ffn(self.moe_intermediate_size * self.n_shared_experts)) \
            + self.vocab_size * D * (1 if self.tie_word_embeddings else 2) + D
        experts = n_moe * self.num_experts * ffn(self.moe_intermediate_size)
        return {"attention_side": attention_side, "experts": experts, "total": attention_side + experts}

    def to_dict(self) -> dict:
        return asdict(self)

    # ---- construction --------------------------------------------------
    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Build from a parsed HF config.json dict."""
        mt = hf.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {mt!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_type {rope_type!r} is not supported yet (only 'default')")
        L = hf["num_hidden_layers"]
        common = dict(
            model_type=mt, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=L,
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            intermediate_size=hf["intermediate_size"], moe_intermediate_size=hf["moe_intermediate_size"],
            top_k=hf["num_experts_per_tok"], norm_topk_prob=hf.get("norm_topk_prob", True),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
        )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
        if mt == "deepseek_v3":
            k = hf.get("first_k_dense_replace", 0)
            return cls(
                **common, num_experts=hf.get("n_routed_experts", hf.get("num_local_experts")), scoring="sigmoid",
                moe_layers=tuple(i >= k for i in range(L)),
                q_lora_rank=hf.get("q_lora_rank"), kv_lora_rank=hf["kv_lora_rank"],
                qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
                v_head_dim=hf["v_head_dim"], rope_interleave=hf.get("rope_interleave", True),
                n_shared_experts=hf.get("n_shared_experts") or 0, n_group=hf.get("n_group") or 1,
                topk_group=hf.get("topk_group") or 1, routed_scaling_factor=hf.get("routed_scaling_factor", 1.0),
            )
        step, only = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or [])
        n_exp = hf.get("num_experts", hf.get("num_local_experts"))
        if n_exp is None:
            raise ValueError("qwen3_moe config.json has neither num_experts nor num_local_experts")
        return cls(
            **common, num_experts=n_exp, scoring="softmax",
            moe_layers=tuple(i not in only and n_exp > 0 and (i + 1) % step == 0 for i in range(L)),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        p = Path(path) / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        return cls.from_hf(json.loads(p.read_text()))


def _f(default, help: str):
    """A config field whose help text also becomes its CLI flag's help."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RuntimeConfig:
    """How the async and sync engines are laid out and scheduled."""
    attention_workers: int = _f(1, "async: number of attention replicas (A)")
    expert_workers: int = _f(1, "async: number of expert workers (E)")
    devices: int = _f(2, "sync: number of DP+EP ranks (N); compare with A+E")
    transport: str = _f("shm", "shm (one machine) or gloo/nccl (torch.distributed)")
    token_budget: int = _f(2048, "max prompt tokens per replica step (chunked prefill)")
    microbatches: int = _f(2, "micro-batches in flight per replica (ping-pong depth); sync: 1 or 2 (two-batch overlap)")
    adaptive_depth: bool = _f(False, "async: adapt the number of micro-batches to the expert round-trip")
    router: str = _f("queue-aware", "request router across replicas")
    order: str = _f("fcfs", "per-replica order: fcfs, sjf or edf")
    selector: str = _f("oldest", "expert work selection: oldest, largest or deadline")
    aggregation_window_ms: float = _f(0.0, "expert side: wait up to this long to merge same-layer work")
    redundant_experts: int = _f(0, "extra expert copies per layer, placed EPLB-style (needs (E + this) % workers == 0)")
    admission: str = _f("off", "SLO-aware admission: off, reject or demote requests predicted to miss their deadline")
    admission_slack: float = _f(2.0, "admission acts when the predicted finish passes slack x the TTFT budget")
    max_queue: int = _f(1024, "bounded queue of waiting requests per replica")
    compute: str = _f("real", "real, or emulated (compute replaced by timed waits from a cost table)")
    emulated_hidden: int = _f(16, "emulated: hidden size of the tensors that still travel")
    dilation: float = _f(1.0, "emulated: multiply every emulated op time by this factor")
    hardware: str = _f("cpu", "emulated: hardware profile of the cost table")
    ring_mb: int = _f(32, "shm transport: ring size per directed worker pair (MiB)")
    comm_timeout_s: float = _f(60.0, "a request fails if a peer does not answer within this time")
    heartbeat_interval_s: float = _f(0.5, "each worker beats this often while it makes progress")
    heartbeat_timeout_s: float = _f(5.0, "a worker silent this long (hung, stopped, deadlocked) is declared failed")
    stop_grace_s: float = _f(1.0, "on close/restart each stage of workers (attention, then experts) gets this "
                                  "long to exit before it is killed")
    threads_per_worker: int = _f(1, "torch intra-op threads per worker process")
    master_port: int = _f(0, "torch.distributed: TCP port (0 = pick a free one)")
    master_addr: str = _f("127.0.0.1", "torch.distributed: address of the engine's host (rank 0)")
    remote_experts: bool = _f(False, "async: expert workers are started elsewhere (`asap expert-worker` under "
                                     "torchrun on another node), not by this engine")

    def __post_init__(self):
        for name in ("attention_workers", "expert_workers", "devices", "token_budget", "microbatches",
                     "max_queue", "threads_per_worker", "emulated_hidden", "ring_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.transport not in ("shm", "gloo", "nccl"):
            raise ValueError(f"transport must be shm, gloo or nccl, got {self.transport!r}")
        if self.compute not in ("real", "emulated"):
            raise ValueError(f"compute must be real or emulated, got {self.compute!r}")
        if self.admission not in ("off", "reject", "demote"):
            raise ValueError(f"admission must be off, reject or demote, got {self.admission!r}")
        if self.remote_experts and (self.transport == "shm" or not self.master_port):
            raise ValueError("remote_experts needs transport gloo or nccl and a fixed master_port")
        if self.dilation <= 0:
            raise ValueError("dilation must be > 0")
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "stop_grace_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be at least 2 x heartbeat_interval_s")
