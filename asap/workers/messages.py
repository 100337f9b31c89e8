"""Control-plane messages between the engine process and its workers.

Small typed records on multiprocessing queues. Activations never travel here:
they go through asap.comm (shared-memory rings or torch.distributed).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Submit:                      # engine -> attention worker (async) or rank (sync)
    request_id: int
    prompt: list[int] | None       # None with emulated compute
    num_tokens: int
    arrival: float                 # time.monotonic() in the engine (same clock in every process on one host)
    deadline: float | None = None
    priority: int = 0              # admission may demote (-1)
    prompt_logprobs: int | None = None   # top-k of prompt-token logprobs to return (None: none)


@dataclass(frozen=True)
class Abort:                       # engine -> replica: the caller gave up; drop the request (engine ignores its Result)
    request_id: int


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Wake:                        # a sync rank to itself: a peer started a step while this rank was idle
    pass


@dataclass
class Result:                      # worker -> engine
    request_id: int
    replica: int
    first_token: int = -1
    logits: object = None          # float32 [vocab] tensor (real compute)
    kv: object = None              # per-layer dicts of tensors (real compute)
    error: str | None = None
    finished_at: float = 0.0
    prompt_logprobs: object = None # (token_logprobs [T-1], top_ids [T-1,k], top_logprobs [T-1,k]) if asked


@dataclass
class Started:                     # worker -> engine: a request's first chunk is scheduled (queue time, running)
    request_id: int
    replica: int
    at: float


@dataclass
class Planned:                     # replica -> engine, each step it plans: the router's load view (asap.engine.loads)
    replica: int
    step: dict                     # {request_id: (num_computed at the step's start, tokens this step)}


@dataclass
class Ready:
    rank: int
    role: str


@dataclass
class Spans:                       # worker -> engine, flushed periodically: (kind, start, end) triples
    worker: str
    spans: list = field(default_factory=list)


@dataclass
class Failure:                     # a worker hit an error it cannot recover from
    worker: str
    error: str


@dataclass
class RoutingCounts:               # replica -> engine: tokens routed to each expert since the last report
    replica: int
    counts: list                   # [num_layers][num_experts]
