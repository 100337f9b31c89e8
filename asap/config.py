"""The engines' configuration (RuntimeConfig), ModelConfig re-exported from asap.model.config, and the
helpers that turn a config dataclass's fields into CLI flags (used by every `asap` sub-command)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

# ModelConfig lives with the model (asap/model/config.py, parsed by the family registry); re-exported here.
from asap.model.config import ModelConfig  # noqa: E402,F401


def _f(default, help: str):
    """A config field whose help text also becomes its CLI flag's help."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RuntimeConfig:
    """How the async and sync engines are laid out and scheduled."""
    attention_workers: int = _f(1, "async: number of attention replicas (A)")
    expert_workers: int = _f(1, "async: number of expert workers (E)")
    devices: int = _f(2, "sync: number of devices, DP x attention_tp, with EP over all of them; compare with A x "
                         "attention_tp + E")
    attention_tp: int = _f(1, "attention tensor parallelism per async replica or sync DP group; > 1 needs compute "
                              "emulated (one process stands for its TP group; real-compute TP is not built)")
    transport: str = _f("shm", "shm (one machine) or gloo/nccl (torch.distributed)")
    token_budget: int = _f(2048, "max prompt tokens per replica step (chunked prefill)")
    microbatches: int = _f(2, "micro-batches in flight per replica (ping-pong depth); sync: 1 or 2 (two-batch overlap)")
    adaptive_depth: bool = _f(False, "async: adapt the number of micro-batches to the expert round-trip")
    router: str = _f("queue-aware", "request router across replicas")
    order: str = _f("fcfs", "per-replica order: fcfs, sjf, edf, or the preemptive srpt and edf-preempt (a started "
                                "request yields to a shorter / earlier-deadline one at each chunk)")
    selector: str = _f("oldest", "expert work selection: oldest, largest, deadline, or fullest (the layer with "
                                 "the most ready tokens first, which merges the most work per expert weight read)")
    expert_max_wait_ms: float = _f(20.0, "selector fullest: a layer whose oldest work has waited this long goes "
                                         "first (no layer starves)")
    aggregation_window_ms: float = _f(0.0, "expert side: wait up to this long to merge same-layer work")
    expert_batch_tokens: int | None = _f(None, "async: most tokens an expert batch merges (default: 4 x token_budget)")
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
    stop_grace_s: float = _f(0.5, "on close/restart each stage of workers (attention, then experts) gets this "
                                  "long to exit before it is killed")
    threads_per_worker: int = _f(1, "torch intra-op threads per worker process")
    master_port: int = _f(0, "torch.distributed: TCP port (0 = pick a free one)")
    master_addr: str = _f("127.0.0.1", "torch.distributed: address of the engine's host (rank 0)")
    remote_experts: bool = _f(False, "async: expert workers are started elsewhere (`asap expert-worker` under "
                                     "torchrun on another node), not by this engine")
    colocated: bool = _f(False, "async: every device hosts an attention replica and an expert shard (1/N of the "
                                "experts), expert work first; needs expert_workers = attention_workers x "
                                "attention_tp (the N devices)")
    wide_replicas: int = _f(0, "async colocated: a length-aware fleet, this many wide replicas of wide_tp devices "
                               "beside the attention_workers narrow ones; prompts of >= wide_from_tokens go to the "
                               "wide group, the rest to the narrow one, overflowing to the other group when their "
                               "own would miss the deadline (asap.scheduler.length_router)")
    wide_tp: int = _f(4, "attention tensor parallelism of each wide replica (> 1 needs compute emulated)")
    wide_from_tokens: int = _f(32768, "prompts of at least this many tokens go to the wide replicas")
    wide_token_budget: int = _f(0, "the wide replicas' max prompt tokens per step (0: token_budget)")
    short_replicas: int = _f(0, "async: a short-prompt lane, the first this many of the attention_workers replicas "
                                "take only prompts under short_below_tokens (which overflow to the other replicas "
                                "when the lane would miss their deadline; longer prompts never enter the lane)")
    short_below_tokens: int = _f(4096, "the short-prompt lane takes prompts under this many tokens")

    def __post_init__(self):
        for name in ("attention_workers", "expert_workers", "devices", "attention_tp", "token_budget", "microbatches",
                     "max_queue", "threads_per_worker", "emulated_hidden", "ring_mb", "wide_tp", "wide_from_tokens"):
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
        if self.attention_tp > 1 and self.compute != "emulated":
            raise ValueError(f"attention_tp={self.attention_tp} needs compute='emulated': real-compute tensor "
                             "parallelism is not built")
        if self.wide_replicas:
            self._check_fleet()
        if self.short_replicas:
            if self.short_replicas < 0 or self.short_below_tokens < 1:
                raise ValueError(f"need short_replicas >= 0 and short_below_tokens >= 1, got {self.short_replicas}, "
                                 f"{self.short_below_tokens}")
            if self.short_replicas >= self.attention_workers:
                raise ValueError(f"short_replicas={self.short_replicas} must leave at least one of the "
                                 f"{self.attention_workers} attention_workers for the other prompts")
        if self.colocated:
            self._check_colocated()
        from asap.scheduler.replica import ORDERS
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        from asap.scheduler.expert_select import SELECTORS
        if self.selector not in SELECTORS:
            raise ValueError(f"selector must be one of {', '.join(SELECTORS)}, got {self.selector!r}")
        cap = self.expert_batch_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"expert_batch_tokens must be an int >= 1 (unset: 4 x token_budget), got {cap!r}")
        if not self.expert_max_wait_ms >= 0:
            raise ValueError(f"expert_max_wait_ms must be >= 0, got {self.expert_max_wait_ms}")
        if self.dilation <= 0:
            raise ValueError("dilation must be > 0")
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "stop_grace_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_timeout_s < 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must be at least 2 x heartbeat_interval_s")

    @property
    def expert_max_wait_s(self) -> float | None:
        """The fullest selector's age bound in seconds; None for the other selectors, which have none."""
        return self.expert_max_wait_ms / 1000 if self.selector == "fullest" else None

    @property
    def replica_tps(self) -> tuple[int, ...]:
        """async: each replica's attention TP, the narrow replicas first, then the wide ones (a fleet)."""
        return (self.attention_tp,) * self.attention_workers + (self.wide_tp,) * self.wide_replicas

    @property
    def replica_budgets(self) -> tuple[int, ...]:
        """async: each replica's token budget per step, in replica_tps' order."""
        return (self.token_budget,) * self.attention_workers + \
            (self.wide_token_budget or self.token_budget,) * self.wide_replicas

    def replica_devices(self, replica: int) -> range:
        """async colocated: the devices (= expert workers) replica `replica` runs on."""
        first = sum(self.replica_tps[:replica])
        return range(first, first + self.replica_tps[replica])

    def _check_fleet(self):
        if self.wide_replicas < 0:
            raise ValueError(f"wide_replicas must be >= 0, got {self.wide_replicas}")
        if not self.colocated:
            raise ValueError("wide_replicas (a length-aware fleet) is built for the async co-located layout: set "
                             "colocated (as the simulator does)")
        if self.wide_tp > 1 and self.compute != "emulated":
            raise ValueError(f"wide_tp={self.wide_tp} needs compute='emulated': real-compute tensor parallelism "
                             "is not built (wide_tp=1 runs for real)")
        if self.wide_token_budget < 0:
            raise ValueError(f"wide_token_budget must be >= 0 (0: token_budget), got {self.wide_token_budget}")

    def _check_colocated(self):
        devices = sum(self.replica_tps)
        if self.expert_workers != devices:
            fleet = " + wide_replicas x wide_tp" if self.wide_replicas else ""
            raise ValueError(f"colocated: every device hosts one expert shard, so expert_workers must equal "
                             f"attention_workers x attention_tp{fleet} = {devices} (the devices), got "
                             f"{self.expert_workers}")
        if self.transport == "nccl":
            raise ValueError("colocated: transport nccl cannot send between the two processes on one GPU; "
                             "use transport shm (or gloo)")
        if self.remote_experts:
            raise ValueError("colocated: the expert shards run on the replicas' own devices, not remote_experts")


def add_config_flags(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """One flag per field of a config dataclass, with the field's help: the CLI cannot drift from the config."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = (f.metadata.get("help") or "").replace("%", "%%")   # argparse formats help with %
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
        else:
            typ = {"int": int, "float": float, "str": str}.get(str(f.type).removesuffix(" | None"), str)
            shown = "" if "default" in help_text.lower() else " (default: %(default)s)"     # never twice
            parser.add_argument(flag, type=typ, default=f.default, help=help_text + shown)


def config_from_args(cls, args, **extra):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names}, **extra)
