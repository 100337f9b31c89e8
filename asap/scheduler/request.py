"""The request as every scheduling policy, engine and the simulator see it.

Times are seconds on one clock (wall time in the engines, virtual time in the
simulator). `prompt` is None where only lengths matter (simulator, emulated
compute); `num_tokens` is then the prompt length. `hash_ids` are the prompt's 512-token
prefix-block hashes where a trace gives them (Mooncake), else empty; the simulator's prefix
cache (asap/scheduler/prefix_cache.py) reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Request:
    id: int
    num_tokens: int
    arrival: float = 0.0
    deadline: float | None = None          # absolute TTFT deadline, same clock as `arrival`
    prompt: list[int] | None = None
    num_computed: int = 0                  # prompt tokens already prefilled (chunked prefill)
    priority: int = 0                      # higher runs first among equals; admission may demote to -1
    meta: dict = field(default_factory=dict)
    hash_ids: tuple[int, ...] = ()         # one id per 512-token prefix block (an id names its whole prefix)

    def __post_init__(self):
        if self.prompt is not None and len(self.prompt) != self.num_tokens:
            raise ValueError(f"request {self.id}: num_tokens={self.num_tokens} but prompt has {len(self.prompt)}")
        if self.num_tokens <= 0:
            raise ValueError(f"request {self.id}: empty prompt")

    @property
    def num_remaining(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def done(self) -> bool:
        return self.num_computed >= self.num_tokens
