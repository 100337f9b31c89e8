"""Dispatch and combine: the seam where attention hands tokens to experts and back.

Attention side:  pending = dispatch_send(...)   ...   y = combine_recv(inbox, pending, timeout)
Expert side:     items = dispatch_recv(queue)   ->    combine_send(t, item, partial) per item

Everything is point-to-point: combine_recv waits only for the ranks named in
its PendingCombine, so replicas, layers and microbatches may interleave freely.
Shapes: T tokens, K top-k slots, D hidden size, T_r tokens sent to rank r.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from asap.comm.headers import Header, Kind
from asap.comm.mailbox import Mailbox, WorkItem, wait_for
from asap.comm.streams import to_device
from asap.comm.transport import CommTimeout, Rows, Transport
from asap.scheduler.expert_select import OldestFirst

_OLDEST_FIRST = OldestFirst()     # the default selector (stateless)

# CPU tensors take shortcuts that read values on the host (free there, a sync on a GPU). Off, a CPU run
# takes the device path: tests count its host syncs without a GPU (tests/test_model_syncs.py).
HOST_SHORTCUTS = True

# While a selector holds ready work back and does not say until when, it is asked
# again this often even if nothing new arrives.
_RESELECT_S = 0.0005


@dataclass(frozen=True)
class PendingCombine:
    key: tuple[int, int, int, int]        # (replica, layer, microbatch, seq)
    num_tokens: int                       # T
    rows: dict[int, torch.Tensor]         # rank -> token indices sent there (ascending, int64)
    hidden_size: int                      # D, so an all-local batch still gets a [T, D] result
    dtype: torch.dtype
    device: torch.device
    whole: bool = False                   # one rank got every token in order: its partial is the answer


@dataclass(frozen=True)
class DispatchLayout:
    """Where one (layer, micro-batch)'s tokens go, computed once on the tensors' own device: the
    (token, rank) pairs sorted by rank, counted, and the counts copied to the host once."""
    rows: dict[int, torch.Tensor]         # rank -> token indices (ascending), ranks with a message only
    topk_ids: dict[int, torch.Tensor]     # rank -> [T_r, K], -1 where the pair goes elsewhere
    topk_weights: dict[int, torch.Tensor]  # rank -> [T_r, K], 0 where the pair goes elsewhere
    whole: int | None = None              # the one rank that gets every pair, if so (nothing to gather)


def dispatch_layout(dest: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, world_size: int,
                    always_to: Sequence[int] = ()) -> DispatchLayout:
    """dest [T, K]: rank per pair, -1 for none. A fixed number of tensor ops whatever T, K and the
    number of ranks; the only device-to-host copy is one [W + 3] vector (per-rank counts, -1 and bad entries)."""
    T, K = dest.shape
    W, dev = world_size, dest.device
    r = _single_rank(dest, W)
    if r is not None:
        return _to_one(r, T, topk_ids, topk_weights, always_to)
    # Columns: 0 below -1 (an error), 1 "nowhere" (-1), 2..W+1 the ranks, W+2 past the last rank (an error).
    col = (dest + 2).clamp_(0, W + 2)              # add + clamp, no integer division (slow on CPU)
    member = torch.zeros(T, W + 3, dtype=torch.bool, device=dev)
    member.scatter_(1, col, True)                  # [T, W+3]: token t has a pair for column c
    host = member.sum(0).tolist()                  # the one copy to the host
    if host[0] or host[W + 2]:
        raise ValueError(f"dest entries must be a rank in [0, {W}) or -1")
    counts, nowhere = host[2:W + 2], host[1]
    ranks = sorted({r for r in range(W) if counts[r]} | set(always_to))
    live = [r for r in range(W) if counts[r]]
    if len(live) == 1 and counts[live[0]] == T and not nowhere:     # every pair to one rank, as is
        return _to_one(live[0], T, topk_ids, topk_weights, always_to)
    total = sum(counts)
    flat = member[:, 2:W + 2].t().reshape(-1)                 # rank-major: r * T + t
    if dev.type == "cpu" and HOST_SHORTCUTS:   # int64 division is slow on a CPU; the counts are on the host
        pos = flat.nonzero().squeeze(1)
        rank_of = torch.repeat_interleave(torch.arange(W), torch.tensor(counts))
    else:                     # nonzero_static: no second sync; the counts stay on the host
        pos = torch.nonzero_static(flat, size=total).squeeze(1)
        rank_of = pos // T
    tokens = pos - rank_of * T                                # sorted by rank, then token
    mine = dest[tokens] == rank_of[:, None]                   # [P, K]
    ids = topk_ids[tokens].masked_fill(~mine, -1).split(counts)
    ws = topk_weights[tokens].masked_fill(~mine, 0).split(counts)
    tok = tokens.split(counts)
    empty = tokens[:0]
    return DispatchLayout({r: tok[r] if r < W else empty for r in ranks},
                          {r: ids[r] if r < W else topk_ids[:0] for r in ranks},
                          {r: ws[r] if r < W else topk_weights[:0] for r in ranks})


def _single_rank(dest: torch.Tensor, W: int) -> int | None:
    """The rank every pair goes to, if there is one, found without a host sync to save: CPU only."""
    if not dest.is_cpu or not dest.numel() or not HOST_SHORTCUTS:
        return None
    lo, hi = torch.aminmax(dest)
    lo, hi = int(lo), int(hi)
    return lo if lo == hi and 0 <= lo < W else None


def _to_one(r: int, T: int, topk_ids, topk_weights, always_to) -> DispatchLayout:
    """Every pair goes to rank r: nothing to gather or mask (always_to ranks get 0 rows)."""
    dev = topk_ids.device
    if not always_to or tuple(always_to) == (r,):
        return DispatchLayout({r: _arange(T, dev)}, {r: topk_ids}, {r: topk_weights}, whole=r)
    ranks = sorted({r} | set(always_to))
    rows = {q: _arange(T, dev) if q == r else torch.zeros(0, dtype=torch.long, device=dev) for q in ranks}
    return DispatchLayout(rows, {q: topk_ids if q == r else topk_ids[:0] for q in ranks},
                          {q: topk_weights if q == r else topk_weights[:0] for q in ranks}, whole=r)


_ARANGE: dict[torch.device, torch.Tensor] = {}


def _arange(T: int, device: torch.device) -> torch.Tensor:
    """torch.arange(T) as a slice of one cached range per device (a slice is cheaper than a new
    tensor; nothing writes to token indices)."""
    a = _ARANGE.get(device)
    if a is None or a.numel() < T:
        a = _ARANGE[device] = torch.arange(max(T, 4096), device=device)
    return a[:T]


def dispatch_send(t: Transport, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                  dest: torch.Tensor, *, replica: int, layer: int, microbatch: int, seq: int,
                  deadline: float = math.inf, always_to: Sequence[int] = (), epoch: int = 0,
                  ready_ns: int = 0, sent_at: float | None = None) -> PendingCombine:
    """Send each rank the tokens that have >= 1 (token, k) pair routed to it; dest[t, k] is that
    pair's rank, -1 for none. Ranks in always_to get a message (maybe 0 rows) regardless.
    epoch: the sending replica's epoch, stamped in every header (asap.comm.mailbox); ready_ns: when the
    messages are due (an emulated link; 0 = on receipt); sent_at: when they left (default now; an
    emulated device says when its op ended: the oldest-first experts order by it).
    The rows of x are gathered by the transport straight into its buffer (transport.Rows)."""
    now = time.monotonic() if sent_at is None else sent_at
    xs, ks = x.shape, topk_ids.shape
    if len(xs) != 2 or len(ks) != 2:
        raise ValueError(f"x must be [T, D] and topk_ids [T, K]; got {tuple(xs)}, {tuple(ks)}")
    if ks[0] != xs[0] or topk_weights.shape != ks or dest.shape != ks:
        raise ValueError(f"x {tuple(xs)}, topk_ids {tuple(ks)}, topk_weights "
                         f"{tuple(topk_weights.shape)} and dest {tuple(dest.shape)} disagree on [T, K]")
    world = getattr(t, "world_size", None)
    if world is None:        # a wrapper that does not say: one more host copy
        world = max([int(dest.max()) + 1 if dest.numel() else 0, *[r + 1 for r in always_to]])
    r = _single_rank(dest, world)
    if r is not None and all(q == r for q in always_to):     # the common case: send x as it is
        t.send(r, Header.of(Kind.DISPATCH, replica, layer, microbatch, seq, xs[0], deadline, now, ready_ns, epoch),
               [x, topk_ids, topk_weights])
        return PendingCombine((replica, layer, microbatch, seq), xs[0], {r: _arange(xs[0], x.device)}, xs[1],
                              x.dtype, x.device, whole=True)
    lay = dispatch_layout(dest, topk_ids, topk_weights, world, always_to)
    for r, idx in lay.rows.items():
        rows = x if lay.whole == r else Rows(x, idx)
        header = Header.of(Kind.DISPATCH, replica, layer, microbatch, seq, idx.numel(), deadline, now, ready_ns, epoch)
        t.send(r, header, [rows, lay.topk_ids[r], lay.topk_weights[r]])
    return PendingCombine((replica, layer, microbatch, seq), xs[0], lay.rows, xs[1], x.dtype, x.device,
                          whole=lay.whole is not None)


class WorkQueue:
    """Expert-side view of a Mailbox: the DISPATCH items that have arrived and not been taken."""

    def __init__(self, mailbox: Mailbox):
        self.mailbox = mailbox

    def __len__(self) -> int:
        return len(self.mailbox.work)


def dispatch_recv(q: WorkQueue, timeout: float | None = 0.0, selector=None) -> list[WorkItem]:
    """The next work to run, from any replica and layer, as chosen by selector (an object with
    `.select(ready: list[WorkInfo], now) -> list[int]`; default oldest-first; `ready` is in the mailbox's
    order). Several items are returned only when the selector merges same-layer work. [] if nothing is
    chosen within timeout."""
    selector = selector or _OLDEST_FIRST
    work = q.mailbox.work

    def choose():
        return list(selector.select([it.info for it in work], time.monotonic()))

    def pick():
        if not work:
            return None
        chosen = choose()
        if not chosen:
            return None
        if len(set(chosen)) != len(chosen) or not all(0 <= i < len(work) for i in chosen):
            raise ValueError(f"selector returned bad indices {chosen} for {len(work)} ready items")
        if len({work[i].header.layer for i in chosen}) != 1:
            raise ValueError(f"selector merged items of different layers: {chosen}")
        picked, taken = [work[i] for i in chosen], set(chosen)
        work[:] = [it for i, it in enumerate(work) if i not in taken]
        return picked

    def nap():
        if not work:
            return None                     # nothing held back: only an arrival can change the answer
        until = getattr(selector, "wait_until", None)   # AggregationWindow says when it will release
        return max(0.0, until - time.monotonic()) if until is not None else _RESELECT_S

    return wait_for(q.mailbox, pick, timeout, nap=nap) or []


def combine_send(t: Transport, item: WorkItem, partial: torch.Tensor, ready_ns: int = 0,
                 sent_at: float | None = None) -> None:
    """Return the expert output for item's rows ([T_r, D], same row order) to the rank it came from
    (due at ready_ns under an emulated link). sent_at: when it left this worker's device (default: now;
    emulated compute says when its op ended, asap.workers.emulation.clock)."""
    if partial.dim() != 2 or partial.shape[0] != item.header.num_tokens:
        raise ValueError(f"partial must be [{item.header.num_tokens}, D], got {tuple(partial.shape)}")
    header = item.header.replace(kind=Kind.COMBINE, num_tokens=partial.shape[0],
                                 sent_at=time.monotonic() if sent_at is None else sent_at, ready_ns=ready_ns)
    t.send(item.src, header, [partial])


class CombineInbox:
    """Attention-side view of a Mailbox: COMBINE partials stashed by dispatch key."""

    def __init__(self, mailbox: Mailbox):
        self.mailbox = mailbox


def combine_recv(inbox: CombineInbox, pending: PendingCombine, timeout: float | None) -> torch.Tensor:
    """Wait for every rank in pending.rows, then return [T, D]: the partials scattered back to token
    order and summed in ascending rank order (so the result is the same every run)."""
    partials = inbox.mailbox.partials
    if not wait_for(inbox.mailbox, lambda: pending.rows.keys() <= partials.get(pending.key, {}).keys(), timeout):
        missing = sorted(pending.rows.keys() - partials.get(pending.key, {}).keys())
        raise CommTimeout(f"combine {pending.key}: no answer from ranks {missing} within {timeout}s")
    got = partials.pop(pending.key, {})
    for r, idx in pending.rows.items():
        if got[r].shape != (idx.numel(), pending.hidden_size):
            raise RuntimeError(f"combine {pending.key}: rank {r} sent {tuple(got[r].shape)}, "
                               f"expected {(idx.numel(), pending.hidden_size)}")
    live = [r for r in sorted(pending.rows) if pending.rows[r].numel()]
    if pending.whole and len(live) == 1:              # one rank answered for every token: that is y
        return to_device(got[live[0]], pending.device, pending.dtype)    # off shm: on the comm stream
    if len(live) == 1:                                # one partial: no sum, so no rounding to worry about
        out = torch.zeros(pending.num_tokens, pending.hidden_size, dtype=pending.dtype, device=pending.device)
        part = to_device(got[live[0]], out.device, out.dtype)
        return out.index_copy_(0, pending.rows[live[0]].to(out.device), part)
    # Accumulate 16-bit partials in fp32: rounding once at the end, not once per rank.
    acc = torch.float32 if pending.dtype in (torch.float16, torch.bfloat16) else pending.dtype
    out = torch.zeros(pending.num_tokens, pending.hidden_size, dtype=acc, device=pending.device)
    for r in live:
        idx = pending.rows[r].to(out.device)
        out.index_add_(0, idx, to_device(got[r], out.device, acc))   # indices unique per rank: no atomics race
    return out.to(pending.dtype)
