"""Simulator speed: 10k Mooncake requests through DeepSeek-V3 (61 layers) at 384 devices (SIMULATED).

    python benchmarks/sim_speed.py [--engine async|sync] [--num-requests N]       # = asap sim speed
    python benchmarks/sim_speed.py --against /tmp/base [--repeat 2]              # old vs new, side by side

`--against DIR` runs the same simulation with the code of another checkout (e.g. `git worktree add /tmp/base
0d92dc9`) and with this one, alternately, each in a fresh process, and prints both CPU times, their ratio, and
whether the two runs' TTFTs are the same bit for bit (a SHA-256 of every TTFT's bytes). CPU time, not wall
time, is compared: the machine may be shared.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# Uses only what both old and new checkouts have: trace_requests, at_rate, run.
ONE_RUN = """
import hashlib, json, struct, sys, time
try:
    from asap.studies.experiments import TRACE, at_rate, trace_requests
except ImportError:      # a checkout from before asap/studies
    from asap.sim.experiments import TRACE, at_rate, trace_requests
from asap.sim.run import run
engine, n, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
base = trace_requests(TRACE, n)
rate = devices * 4000.0 / (sum(r.num_tokens for r in base) / len(base))
t, cpu = time.perf_counter(), time.process_time()
res = run(at_rate(base, rate), engine, "deepseek-v3", "cloudmatrix384", devices)
wall, cpu = time.perf_counter() - t, time.process_time() - cpu
ttfts = [float("nan") if r.ttft is None else r.ttft for r in res.results]
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "num_events": res.num_events,
                  "ttft_sha256": hashlib.sha256(struct.pack(f"<{len(ttfts)}d", *ttfts)).hexdigest()[:16]}))
"""


def one(root: Path, engine: str, n: int, devices: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", ONE_RUN, engine, str(n), str(devices)], env=env, cwd="/",
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(against: Path, engine: str, n: int, devices: int, repeat: int) -> int:
    here = Path(__file__).resolve().parents[1]
    same = True
    for i in range(repeat):
        old, new = one(against, engine, n, devices), one(here, engine, n, devices)
        same &= old["ttft_sha256"] == new["ttft_sha256"] and old["num_events"] == new["num_events"]
        print(f"[SIMULATED] {engine} x{devices}, {n} requests, run {i + 1}: {against} {old['cpu_s']:.1f} s CPU "
              f"({old['wall_s']:.1f} s wall), this checkout {new['cpu_s']:.1f} s CPU ({new['wall_s']:.1f} s wall): "
              f"{old['cpu_s'] / new['cpu_s']:.2f}x; TTFTs {old['ttft_sha256']} vs {new['ttft_sha256']} "
              f"({'the same' if old['ttft_sha256'] == new['ttft_sha256'] else 'DIFFERENT'})", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", type=Path, default=None, help="another checkout's root, to compare with")
    p.add_argument("--repeat", type=int, default=1)
    a, rest = p.parse_known_args()
    if a.against is None:
        from asap.studies.__main__ import main
        sys.exit(main(["speed", *rest]))
    q = argparse.ArgumentParser()
    q.add_argument("--engine", default="async", choices=["async", "sync"])
    q.add_argument("--num-requests", type=int, default=10000)
    q.add_argument("--devices", type=int, default=384)
    b = q.parse_args(rest)
    sys.exit(compare(a.against, b.engine, b.num_requests, b.devices, a.repeat))
