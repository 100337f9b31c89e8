"""One-way latency and bandwidth of dispatch and combine, next to a memcpy of the same bytes.

    python benchmarks/comm_speed.py [--transport shm gloo] [--tokens 1 128 1024 4096] [--hidden 7168]

Two spawned processes, one attention side (rank 0) and one expert side (rank 1),
talk through the real primitives: dispatch_send -> dispatch_recv carries
[T, D] bf16 activations plus top-k ids (int64) and weights (fp32); the expert
side answers at once with combine_send of a [T, D] bf16 partial, which rank 0
takes with combine_recv. Each direction is timed one way from the sender's
clock to the moment the receiver holds the tensors (time.monotonic is one
clock for the whole machine), so the table needs no round-trip halving. The
memcpy column is `dst.copy_(src)` of the same bytes into a warm buffer, in this
process, in the same run, on one thread (each worker moves its messages on one
thread: threads_per_worker defaults to 1), with the all-threads copy beside it.
The targets are the issue's: a message of >= 1 MB at most 2x memcpy + 30 us, a
1-token message at most 50 us. The receiver is waiting when a message comes (it
polls for 300 us before it sleeps on its semaphore), as in a pipelined step.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import multiprocessing as mp
import statistics
import time

import torch

TOP_K = 8
_getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu     # the core this process runs on now (Linux)


def _reps(T: int) -> int:
    return 200 if T <= 1 else 60 if T <= 128 else 20 if T <= 1024 else 8


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _expert(spec, sizes, hidden, out, device="cpu"):
    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    from asap.comm import Mailbox, WorkQueue, combine_send, dispatch_recv
    t = spec.connect(1)
    q = WorkQueue(Mailbox(t))
    lat, sent, cores = {}, {}, collections.Counter()
    for T in sizes:
        lat[T], sent[T] = [], []
        for _ in range(_reps(T) + 3):
            (item,) = dispatch_recv(q, timeout=60)
            x = item.x.to(device)              # where the expert weights would be
            _sync(device)
            lat[T].append(time.monotonic() - item.header.sent_at)
            cores[_getcpu()] += 1
            sent[T].append(time.monotonic())
            combine_send(t, item, x)
    out.put((lat, sent, cores))
    t.close()


def _attention(spec, sizes, hidden, out, device="cpu"):
    torch.set_num_threads(1)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    from asap.comm import CombineInbox, Mailbox, combine_recv, dispatch_send
    t = spec.connect(0)
    inbox = CombineInbox(Mailbox(t))
    got, cores = {}, collections.Counter()
    seq = 0
    for T in sizes:
        x = torch.randn(T, hidden, device=device).to(torch.bfloat16)
        ids = torch.randint(0, 64, (T, TOP_K), device=device)
        w = torch.rand(T, TOP_K, device=device)
        dest = torch.ones(T, TOP_K, dtype=torch.long, device=device)
        got[T] = []
        for _ in range(_reps(T) + 3):
            _sync(device)
            pc = dispatch_send(t, x, ids, w, dest, replica=0, layer=0, microbatch=0, seq=seq)
            y = combine_recv(inbox, pc, timeout=60)
            _sync(device)
            got[T].append(time.monotonic())
            cores[_getcpu()] += 1
            seq += 1
        assert torch.equal(y, x), "combine returned other values than were dispatched"
    out.put((got, cores))
    t.close()


def _memcpy(nbytes: int, reps: int, threads: int = 1) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _time_copy(nbytes, reps)
    finally:
        torch.set_num_threads(before)


def _time_copy(nbytes: int, reps: int) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(max(reps, 5)):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _spec(transport: str, world: int, ring_bytes: int):
    if transport == "shm":
        from asap.comm import ShmTransportSpec
        return ShmTransportSpec(world, ring_bytes=ring_bytes, send_timeout=60)
    from asap.comm import DistTransportSpec
    from asap.workers.layout import free_port
    return DistTransportSpec(transport, f"tcp://127.0.0.1:{free_port()}", world, send_timeout=60,
                             device="cuda" if transport == "nccl" else "cpu")


def run(transport: str, sizes: list[int], hidden: int, devices: tuple[str, str] = ("cpu", "cpu")) -> list[dict]:
    """devices: where rank 0's activations and rank 1's expert inputs live (nccl: cuda:0, cuda:1)."""
    ctx = mp.get_context("spawn")
    biggest = max(sizes) * (hidden * 2 + TOP_K * 12)
    spec = _spec(transport, 2, 3 * biggest + (1 << 20))
    out = ctx.Queue()
    procs = [ctx.Process(target=f, args=(spec, sizes, hidden, out, dev))
             for f, dev in zip((_attention, _expert), devices)]
    for p in procs:
        p.start()
    try:
        a, b = out.get(timeout=600), out.get(timeout=600)
    finally:
        for p in procs:
            p.join(30)
        spec.cleanup()
    ((back, a_cores), (lat, sent, e_cores)) = (a, b) if len(a) == 2 else (b, a)
    rows = []
    for T in sizes:
        ds, cs = lat[T][3:], [r - s for r, s in zip(back[T][3:], sent[T][3:])]
        d, c = statistics.median(ds), statistics.median(cs)
        db, cb = T * (hidden * 2 + TOP_K * 12), T * hidden * 2
        rows.append(dict(T=T, dispatch_bytes=db, dispatch_s=d, dispatch_best_s=min(ds), combine_best_s=min(cs),
                         dispatch_memcpy_s=_memcpy(db, _reps(T)),
                         dispatch_memcpy_all_s=_memcpy(db, _reps(T), torch.get_num_threads()),
                         combine_bytes=cb, combine_s=c, combine_memcpy_s=_memcpy(cb, _reps(T)),
                         combine_memcpy_all_s=_memcpy(cb, _reps(T), torch.get_num_threads())))
    rows[0]["cores"] = (a_cores, e_cores)
    return rows


def _target(nbytes: int, memcpy_s: float) -> float | None:
    if nbytes >= 1 << 20:
        return 2 * memcpy_s + 30e-6
    return 50e-6 if nbytes < 64 << 10 else None


def _fmt_s(s: float) -> str:
    return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _fmt_b(n: int) -> str:
    return f"{n / 1e3:.1f} KB" if n < 1e6 else f"{n / 1e6:.2f} MB"


def print_table(transport: str, rows: list[dict]) -> None:
    print(f"\n{transport}: one way, median and best of the run (measured on this machine); memcpy = copy_ on 1 thread (as each "
          f"worker copies), and on all {torch.get_num_threads()} threads")
    a_cores, e_cores = rows[0]["cores"]
    share = lambda c: ", ".join(f"{k} ({v / sum(c.values()):.0%})" for k, v in sorted(c.items()))
    print(f"cores (share of messages): attention side {share(a_cores)}; expert side {share(e_cores)}"
          + ("; the two sides shared one core" if a_cores.keys() == e_cores.keys() and len(a_cores) == 1 else ""))
    print("| op | T | bytes | one way | best | GB/s | memcpy | memcpy, all threads | target | met |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for op in ("dispatch", "combine"):
            b, s, m = r[f"{op}_bytes"], r[f"{op}_s"], r[f"{op}_memcpy_s"]
            tgt = _target(b, m)
            met = "-" if tgt is None else ("yes" if s <= tgt else "no")
            print(f"| {op} | {r['T']} | {_fmt_b(b)} | {_fmt_s(s)} | {_fmt_s(r[f'{op}_best_s'])} | "
                  f"{b / s / 1e9:.1f} | {_fmt_s(m)} | "
                  f"{_fmt_s(r[f'{op}_memcpy_all_s'])} | "
                  f"{'-' if tgt is None else _fmt_s(tgt)} | {met} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", nargs="+", default=["shm", "gloo"], choices=["shm", "gloo"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 128, 1024, 4096])
    ap.add_argument("--hidden", type=int, default=7168)
    args = ap.parse_args(argv)
    if min(args.tokens) < 1 or args.hidden < 1:
        ap.error("--tokens and --hidden must be >= 1")
    for transport in args.transport:
        print_table(transport, run(transport, args.tokens, args.hidden))


if __name__ == "__main__":
    main()
