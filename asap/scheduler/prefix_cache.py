"""Prefix caching: a replica keeps the KV of prompt blocks it prefilled, and a later prompt that starts
with the same blocks skips them (vLLM's automatic prefix caching, SGLang's radix cache), in blocks of
BLOCK_TOKENS tokens named by a hash of the whole prefix up to and including the block (Mooncake's
`hash_ids`), so a block id can only match at its own position.

- `PrefixCache(capacity_blocks)`: the block ids one replica holds, LRU-evicted in blocks.
  `match` returns the longest run of leading blocks present; `insert` adds a prefilled prompt's
  blocks. Within a prompt the first block is made the most recent, so eviction takes a prefix's tail
  before its head (a tail without its head could never match again). The KV of requests still in
  flight is not tracked separately: the capacity is the whole KV pool, as in vLLM, where blocks
  in use and cached blocks share one pool (an upper bound on what is free for caching).
- `PrefixCachedScheduler`: a ReplicaScheduler whose intake looks the request up (the replica the
  router chose) and starts its prefill after the cached tokens, and whose commit inserts the
  blocks of every prompt whose prefill finished. Only full blocks are cached (a prompt's partial
  last block is computed every time), and at least one prompt token is always computed: the
  first token's logits need the last position's forward pass, so a fully cached prompt still
  takes one step.

Both simulated engines use this one class per replica (async) or DP group (sync), so the policy is
the same for both; the router does not look at the caches (a cache-aware router is future work).
Pure Python, no torch.
"""
from __future__ import annotations

from collections import OrderedDict

from asap.scheduler.replica import ReplicaScheduler
from asap.scheduler.request import Request

BLOCK_TOKENS = 512          # tokens per prefix block (Mooncake's hash_ids granularity)


class PrefixCache:
    """The prefix blocks one replica holds: at most `capacity_blocks` (None = unbounded), LRU."""

    def __init__(self, capacity_blocks: int | None):
        if capacity_blocks is not None and (isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int)
                                            or capacity_blocks < 0):
            raise ValueError(f"capacity_blocks must be an int >= 0 or None, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()   # least recently used first
        self.num_lookups = 0
        self.num_hit_blocks = 0         # looked-up blocks found
        self.num_miss_blocks = 0        # looked-up blocks not found (or after the first miss)
        self.num_evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, hash_ids) -> int:
        """Leading blocks of `hash_ids` held (a block after a missing one never counts); refreshes them."""
        n = 0
        for h in hash_ids:
            if h not in self._blocks:
                break
            n += 1
        self._touch(hash_ids[:n])
        self.num_lookups += 1
        self.num_hit_blocks += n
        self.num_miss_blocks += len(hash_ids) - n
        return n

    def insert(self, hash_ids) -> None:
        """Hold the blocks of a prompt just prefilled, evicting least recently used blocks past capacity."""
        self._touch(hash_ids)
        cap = self.capacity_blocks
        if cap is not None:
            while len(self._blocks) > cap:
                self._blocks.popitem(last=False)
                self.num_evicted_blocks += 1

    def _touch(self, hash_ids) -> None:
        for h in reversed(hash_ids):        # the prefix's head ends up most recent
            self._blocks[h] = None
            self._blocks.move_to_end(h)

    @property
    def hit_rate(self) -> float:
        looked = self.num_hit_blocks + self.num_miss_blocks
        return self.num_hit_blocks / looked if looked else 0.0


class PrefixCachedScheduler(ReplicaScheduler):
    """A ReplicaScheduler with a PrefixCache: cached leading blocks are skipped at intake (the first chunk
    starts at ctx = cached tokens, so attention still reads them but no projection or expert sees them),
    and finished prompts' full blocks are inserted at commit."""

    def __init__(self, token_budget: int, cache: PrefixCache, **kw):
        super().__init__(token_budget, **kw)
        self.cache = cache
        self.num_prompt_tokens = 0      # prompt tokens of the requests taken in
        self.num_cached_tokens = 0      # of which skipped: served from the cache

    @classmethod
    def like(cls, sched: ReplicaScheduler, cache: PrefixCache) -> "PrefixCachedScheduler":
        """An empty scheduler with `sched`'s settings and `cache` (how an engine swaps its schedulers)."""
        if len(sched):
            raise ValueError("only an empty scheduler can be given a prefix cache")
        return cls(sched.token_budget, cache, order=sched.order, max_queue=sched.max_queue,
                   starvation_s=sched.starvation_s, max_running=sched.max_running)

    def add(self, req: Request) -> None:
        if req.num_computed == 0 and req.id not in self and self.num_waiting < self.max_queue:
            blocks = req.hash_ids[:req.num_tokens // BLOCK_TOKENS]
            cached = min(self.cache.match(blocks) * BLOCK_TOKENS, req.num_tokens - 1) if blocks else 0
            req.num_computed = cached
            self.num_prompt_tokens += req.num_tokens
            self.num_cached_tokens += cached
        super().add(req)

    def commit(self, schedule: dict[int, int]) -> list[Request]:
        finished = super().commit(schedule)
        for req in finished:
            if req.hash_ids:
                self.cache.insert(req.hash_ids[:req.num_tokens // BLOCK_TOKENS])
        return finished


def cache_stats(schedulers) -> dict | None:
    """Hit figures over the PrefixCachedSchedulers among `schedulers` (None when there are none): block hit
    rate of the lookups, and the share of prompt tokens served from the caches."""
    cached = [s for s in schedulers if isinstance(s, PrefixCachedScheduler)]
    if not cached:
        return None
    return merge_stats([{"hit_blocks": s.cache.num_hit_blocks,
                         "looked_blocks": s.cache.num_hit_blocks + s.cache.num_miss_blocks,
                         "cached_tokens": s.num_cached_tokens, "prompt_tokens": s.num_prompt_tokens,
                         "evicted_blocks": s.cache.num_evicted_blocks,
                         "capacity_blocks": s.cache.capacity_blocks} for s in cached])


def merge_stats(parts: list[dict]) -> dict:
    """cache_stats of several engines (independent instances) as one."""
    out = {k: sum(p[k] for p in parts) for k in ("hit_blocks", "looked_blocks", "cached_tokens", "prompt_tokens",
                                                 "evicted_blocks")}
    out["capacity_blocks"] = parts[0]["capacity_blocks"]      # per replica / DP group
    out["block_hit_rate"] = out["hit_blocks"] / out["looked_blocks"] if out["looked_blocks"] else 0.0
    out["token_hit_rate"] = out["cached_tokens"] / out["prompt_tokens"] if out["prompt_tokens"] else 0.0
    return out
