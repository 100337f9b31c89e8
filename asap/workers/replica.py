"""One attention replica's request-side work, shared by the async and the sync loops.

A Replica takes requests in, plans a step (chunked prefill under the token
budget, split into micro-batches), runs the attention stage of a micro-batch,
and finishes a step (logits of completed prompts, results to the engine).
The loops in async_loop.py and sync_loop.py differ only in how experts are reached.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from asap.model.batch import Batch
from asap.model.stages import StageOut, prompt_logprobs
from asap.pipeline.plan import plan_step
from asap.scheduler.errors import QueueFull
from asap.scheduler.replica import ReplicaScheduler
from asap.scheduler.request import Request
from asap.workers.messages import Planned, Result, RoutingCounts, Started, Submit
from asap.workers.timing import AttentionTimer


@dataclass
class MicroBatch:
    batch: Batch
    h: torch.Tensor          # [T,D] hidden states between layers
    finishing: list[int]     # indices into batch.chunks whose chunk ends its prompt
    deadline: float = math.inf   # earliest TTFT deadline of its requests (deadline-first experts)


class Replica:
    def __init__(self, index: int, compute, scheduler: ReplicaScheduler, results, send_kv: bool = True):
        self.index, self.compute, self.scheduler, self.results = index, compute, scheduler, results
        self.send_kv = send_kv
        self.kv = compute.new_kv()
        self.prompts: dict[int, torch.Tensor | None] = {}   # token ids, on compute.device (None: emulated)
        self.logprobs_k: dict[int, int] = {}             # requests that asked for prompt logprobs: id -> top-k
        self.logprob_parts: dict[int, list] = {}         # their per-chunk pieces so far
        cfg = compute.cfg
        dev = compute.device
        self.routing = torch.zeros(cfg.num_layers, cfg.num_experts, dtype=torch.long, device=dev)  # expert placement
        self._routing_sent = time.monotonic()
        self.attention_timer = AttentionTimer(compute)    # the step driver's (asap.workers.step); outlives a step

    # ---- requests in / results out ---------------------------------------------------------------
    def intake(self, msg: Submit) -> None:
        req = Request(msg.request_id, msg.num_tokens, arrival=msg.arrival, deadline=msg.deadline,
                      priority=msg.priority)
        try:
            self.scheduler.add(req)
        except QueueFull as e:
            self.results.put(Result(msg.request_id, self.index, error=f"replica {self.index} queue full: {e}"))
            return
        self.prompts[msg.request_id] = None if msg.prompt is None else \
            torch.as_tensor(msg.prompt, dtype=torch.long).to(self.compute.device)   # once per request
        if msg.prompt_logprobs is not None and not self.compute.emulated:
            self.logprobs_k[msg.request_id], self.logprob_parts[msg.request_id] = msg.prompt_logprobs, []
        if self.kv is not None:
            self.kv.allocate(msg.request_id, msg.num_tokens)

    def fail(self, request_ids, error: str) -> None:
        for rid in request_ids:
            if self.scheduler.abort(rid) is not None:
                self.prompts.pop(rid, None)
                self.logprobs_k.pop(rid, None), self.logprob_parts.pop(rid, None)
                if self.kv is not None and rid in self.kv:
                    self.kv.pop(rid)
                self.results.put(Result(rid, self.index, error=error, finished_at=time.monotonic()))

    @property
    def has_work(self) -> bool:
        return len(self.scheduler) > 0

    # ---- a step ----------------------------------------------------------------------------------
    def plan(self, now: float, k: int) -> tuple[dict[int, int], list[MicroBatch]]:
        """Schedule the next step and split it into at most k micro-batches (none if nothing is queued): the
        simulator's plan (asap.pipeline.plan), with tensors."""
        step = plan_step(self.scheduler, now, k)
        for rid in (rid for rid, start in step.starts.items() if start == 0):
            self.results.put(Started(rid, self.index, now))
        if step:
            self.results.put(Planned(self.index, {rid: (step.starts[rid], n) for rid, n in step.schedule.items()}))
        return step.schedule, [self._microbatch(p.chunks, p.deadline) for p in step.microbatches]

    def inputs_in(self, schedule) -> float:
        """When a step's inputs were in: the latest arrival of its requests (a continuing chunk's KV is in
        from its last step, and that step's end bounds the device anyway); 0.0 for an empty step. Emulated
        compute starts the step no earlier (asap.workers.emulation.clock), not when this process got round to it."""
        return max((self.scheduler.get(rid).arrival for rid in schedule), default=0.0)

    def empty_microbatch(self) -> MicroBatch:
        """A micro-batch of no tokens (the sync baseline's idle ranks still take part in every all-to-all)."""
        return self._microbatch([])

    def _microbatch(self, chunks, deadline: float = math.inf) -> MicroBatch:
        batch = Batch.build(chunks, self.compute.device)
        if self.compute.emulated:
            ids = torch.zeros(batch.num_tokens, dtype=torch.long, device=self.compute.device)
        else:     # one slice per chunk, no Python per token
            parts = [self.prompts[c.request_id][c.start:c.start + c.num_tokens] for c in chunks]
            ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=self.compute.device)
        finishing = [i for i, c in enumerate(chunks)
                     if c.start + c.num_tokens == self.scheduler.get(c.request_id).num_tokens]
        return MicroBatch(batch, self.compute.embed(ids), finishing, deadline)

    def attention(self, mb: MicroBatch, layer: int) -> StageOut:
        s = self.compute.attention_stage(layer, mb.h, mb.batch, self.kv)
        if s.topk_ids is not None:
            ids = s.topk_ids.reshape(-1)          # index_add_, not bincount: no host sync on a GPU
            self.routing[layer].index_add_(0, ids, torch.ones_like(ids))
        return s

    def _chunk_logprobs(self, mb: MicroBatch) -> None:
        """Prompt logprobs of the chunks in `mb` whose request asked for them (final hidden states in mb.h)."""
        for i, c in enumerate(mb.batch.chunks):
            if c.request_id not in self.logprobs_k:
                continue
            prompt = self.prompts[c.request_id]
            end = min(c.start + c.num_tokens, len(prompt) - 1)     # the last position predicts no prompt token
            rows = list(range(mb.batch.offsets[i], mb.batch.offsets[i] + end - c.start))
            next_ids = prompt[c.start + 1:end + 1]
            self.logprob_parts[c.request_id].append(
                prompt_logprobs(self.compute.side, mb.h, rows, next_ids, self.logprobs_k[c.request_id]))

    def _take_logprobs(self, rid: int):
        if self.logprobs_k.pop(rid, None) is None:
            return None
        parts = self.logprob_parts.pop(rid)
        return tuple(torch.cat([p[j] for p in parts]).cpu() for j in range(3))

    def finish(self, schedule: dict[int, int], mbs: list[MicroBatch]) -> None:
        for mb in mbs:
            if self.logprobs_k:
                self._chunk_logprobs(mb)
            if not mb.finishing:
                continue
            rows = [mb.batch.offsets[i + 1] - 1 for i in mb.finishing]
            logits = self.compute.logits(mb.h, rows).cpu()      # results leave the device once, here
            now = time.monotonic()
            for j, i in enumerate(mb.finishing):
                rid = mb.batch.chunks[i].request_id
                kv = _to_host(self.kv.pop(rid)) if self.kv is not None else None
                self.results.put(Result(rid, self.index, int(logits[j].argmax()), logits[j].clone(),
                                        kv if self.send_kv else None, finished_at=now,
                                        prompt_logprobs=self._take_logprobs(rid)))
        for req in self.scheduler.commit(schedule):
            self.prompts.pop(req.id, None)
        if time.monotonic() - self._routing_sent > 0.5:
            self.flush_routing()

    def flush_routing(self) -> None:
        if self.routing.any():
            self.results.put(RoutingCounts(self.index, self.routing.tolist()))
            self.routing.zero_()
        self._routing_sent = time.monotonic()


def _to_host(kv):
    """A request's KV ([layer] -> {name: tensor}) on the CPU, for the engine process: every layer packed
    into one buffer on the device and copied to the host once per request, not once per tensor."""
    ts = [t for layer in kv for t in layer.values()]
    if all(t.device.type == "cpu" for t in ts):
        return kv
    if len({t.dtype for t in ts}) > 1:
        return [{k: t.cpu() for k, t in layer.items()} for layer in kv]
    parts = iter(torch.cat([t.reshape(-1) for t in ts]).cpu().split([t.numel() for t in ts]))
    return [{k: next(parts).view(t.shape) for k, t in layer.items()} for layer in kv]
