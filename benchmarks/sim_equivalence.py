"""Does this checkout simulate exactly what another does? Bit for bit, on a battery (SIMULATED).

    git worktree add /tmp/base <commit>
    python benchmarks/sim_equivalence.py --against /tmp/base            # compare, print every case
    python benchmarks/sim_equivalence.py --against /tmp/base --record   # and, if all agree, record it

A change that only makes the simulator faster must not move a single TTFT. This runs one battery in each
checkout (each in a fresh process, side by side) and compares a SHA-256 of every case's outcome (and prints
each simulation's CPU time in both, side by side: a rough speed comparison, the machine being shared):
- thirteen engine configurations, each simulated once: sync (2 instances of DP2 x TP8; DP32 with TBO off;
  a length-aware fleet; expected expert loads; fixed 4K prompts; the prefix cache) and async (a separate
  expert pool with the fullest-layer selector and a 2 ms window; adaptive depth; co-located; a co-located
  fleet; TP4 replicas with expected loads; fixed 4K; the prefix cache), on the first 500 requests of the
  conversation trace (or fixed-4k) under the SLO 2 s + 1 ms/token: the TTFTs and the event count;
- every stored demo tuning (this checkout's asap/demo/tuned.json, in both: a re-stored entry is not a
  simulator change): each engine's configuration at its stored maximum on the requests it was tuned on: the
  TTFTs;
- a whole tune (asap.studies.tune: screen, coarse and fine rate searches) of each engine over a slice of
  its space on 16 dies, the conversation trace's first 100 requests: every candidate's rates;
- a whole tune under the headline's `--sustained --vet` rule (sync, the same slice, 200 requests continued
  to 400: the screen, the vet, the finalists' searches on the vet's sample and their confirmation): every
  candidate's rates and the confirmed maximum;
- the vet alone where its leaders tie (the same slice, all screened as passing 4 req/s on fixed 4K, each
  passing the vet's whole grid on 400 requests): every leader's vetted bracket, in the vet's order.

With --record, where every case agrees and the two fingerprints (asap.studies.code_version) differ, the
pair goes into asap/studies/equivalent.json, so a result stored under the other checkout's fingerprint
(the demo's tuning, a headline JSON) still counts as current here. Nothing is recorded otherwise.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
from asap.studies.code_version import EQUIVALENT as LEDGER  # noqa: E402

BATTERY = r'''
import dataclasses, hashlib, json, os, struct, sys, time
from pathlib import Path
from asap.sim.run import run
from asap.sim.spec import EngineSpec
from asap.studies.code_version import fingerprint
from asap.studies.experiments import at_rate
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


def digest(results):
    ttfts = [float("nan") if r.ttft is None else r.ttft for r in results]
    return hashlib.sha256(struct.pack(f"<{len(ttfts)}d", *ttfts)).hexdigest()[:16]


out = {"fingerprint": fingerprint(), "cases": {}, "cpu_s": {}}
slo = parse_slo("2s+1ms/tok")
conv, fixed = slo.apply(workload_requests("conversation", 500)), slo.apply(workload_requests("fixed-4k", 500))
S = lambda **k: EngineSpec("sync", devices=32, **k)
A = lambda **k: EngineSpec("async", devices=32, **k)
cases = {
    "sync 2 x DP2 x TP8, 16K": (S(instances=2, attention_tp=8, token_budget=16384), 2.4, conv),
    "sync DP32, 4K, TBO off": (S(token_budget=4096, two_batch_overlap=False), 2.0, conv),
    "sync fleet DP2 x TP8 + TP16": (S(attention_tp=8, token_budget=32768, wide_replicas=1, wide_tp=16,
                                      router="round-robin"), 2.4, conv),
    "sync DP8 x TP4, expected loads": (S(attention_tp=4, token_budget=8192, expert_load="expected"), 2.0, conv),
    "sync DP32, 4K, fixed 4K": (S(token_budget=4096), 34.0, fixed),
    "async A=16, fullest, 2 ms": (A(attention_workers=16, token_budget=8192, selector="fullest", window_s=0.002),
                                  3.2, conv),
    "async A=18, adaptive depth": (A(attention_workers=18, token_budget=16384, microbatches="adaptive"), 2.5, conv),
    "async co-located": (A(colocated=True, token_budget=8192), 3.0, conv),
    "async co-located fleet": (A(colocated=True, token_budget=8192, wide_replicas=4, wide_tp=4,
                                 wide_token_budget=32768, window_s=0.002), 3.2, conv),
    "async 64 dies, A=8 x TP4, expected loads": (
        EngineSpec("async", devices=64, attention_workers=8, attention_tp=4, token_budget=16384, microbatches=3,
                   expert_load="expected"), 5.0, conv),
    "async A=17, fullest, fixed 4K": (A(attention_workers=17, token_budget=16384, selector="fullest",
                                        microbatches=3), 31.0, fixed),
    "sync DP4 x TP8, prefix cache": (S(attention_tp=8, token_budget=16384, prefix_cache=True), 2.4, conv),
    "async A=16, prefix cache": (A(attention_workers=16, token_budget=8192, prefix_cache=True), 3.2, conv),
}
for name, (spec, rate, reqs) in cases.items():
    cpu = time.process_time()
    res = run(at_rate(reqs, rate), spec)
    out["cpu_s"][name] = time.process_time() - cpu
    out["cases"][name] = f"{digest(res.results)} events={res.num_events}"

from asap.demo import tuning
from asap.demo.settings import FULL, QUICK, demo_requests, headline_requests
from asap.studies.tune import EngineConfig
# the stored configurations of one checkout (this one's, ASAP_EQUIV_TUNED), simulated by both
tuned = Path(os.environ.get("ASAP_EQUIV_TUNED", tuning.TUNED))
table = json.loads(tuned.read_text()) if tuned.is_file() else {}
stored = [(tuning.key(s, s.devices, True), s, s.devices) for s in (FULL, QUICK)] + [(tuning.headline_key(FULL), FULL, None)]
for k, s, devices in stored:
    entry = table.get(k)
    if entry is None:
        continue
    for engine in ("sync", "async"):
        e = entry[engine]
        n, rate = e.get("num_requests"), e.get("max_slo_rate") or e.get("lower_bound")
        if not n or not rate:
            continue
        if devices is None:
            reqs, dev = headline_requests(s, n), s.sim_devices
        else:
            reqs, dev = demo_requests(s, devices, tuning.TUNE_REQUESTS, rate=1.0)[:n], devices
        res = run(at_rate(reqs, rate), EngineConfig(**e["config"]).spec(s.model, s.hardware, dev))
        out["cases"][f"stored {k} {engine} at {rate:.4g} req/s"] = digest(res.results)

from asap.studies.tune import space, tune
reqs = slo.apply(workload_requests("conversation", 100))
for engine in ("sync", "async"):
    cands = space(engine, 16)[::6]
    cpu = time.process_time()
    t = tune(reqs, engine, 16, candidates=cands)
    out["cpu_s"][f"tune {engine} x16, {len(cands)} candidates"] = time.process_time() - cpu
    rows = [(r["describe"], r["coarse_rate"], r["fine_rate"], r["screen_attainment"]) for r in t.candidates]
    out["cases"][f"tune {engine} x16, {len(cands)} candidates"] = hashlib.sha256(
        json.dumps([rows, t.max_slo_rate, t.num_sims], default=str).encode()).hexdigest()[:16]
# the sustained rule with a longer sample and the vet (asap sim headline --sustained --vet), which the stored
# headline case is made by: the screen, the vet, each finalist's search on the vet's sample, the confirmation
longer = slo.apply(workload_requests("conversation", 400))
cands = space("sync", 16)[::6]
cpu = time.process_time()
t = tune(longer[:200], "sync", 16, candidates=cands, criterion="requests-sustained", longer=longer, screen=True,
         vet=True)
name = f"tune sync x16 --sustained --vet, {len(cands)} candidates"
out["cpu_s"][name] = time.process_time() - cpu
rows = [(r["describe"], r["coarse_rate"], r["fine_rate"], r["screen_attainment"], r.get("vet_rate"),
         r.get("sustained_rate")) for r in t.candidates]
out["cases"][name] = hashlib.sha256(json.dumps([rows, t.max_slo_rate, t.num_requests, t.num_sims],
                                               default=str).encode()).hexdigest()[:16]
# the vet's own ranking where its leaders tie: the same slice screened as passing 4 req/s on fixed 4K, every
# one passing the vet's grid on 400 requests (which the case above need not reach)
import inspect
from asap.measure.rate_search import burst_limit
try:                                   # the tune's tasks since their own module; before, tune.py
    from asap.studies.tune_tasks import CRITERIA, simulate as _simulate
except ImportError:
    from asap.studies.tune import CRITERIA, _simulate
try:                                   # the vet's home since the tuner's split; before it, tune.py
    from asap.studies.screen import vet as _vet
except ImportError:
    from asap.studies.tune import _vet
fixed400 = slo.apply(workload_requests("fixed-4k", 400))
tied = {c: {"score": None, "passed_rate": 4.0, "rate": 4.0, "attainment": 1.0, "ttft_p90_ms": 0.0, "n": 200}
        for c in cands}
kw = {"burst": burst_limit(400, sum(r.deadline - r.arrival for r in fixed400) / 400)} \
    if "burst" in inspect.signature(_vet).parameters else {}
name = f"vet sync x16, {len(cands)} leaders tied on fixed 4K"
cpu = time.process_time()
vetted = _vet(tied, lambda c, n: lambda r: _simulate((fixed400[:n], r, "sync", "deepseek-v3", "cloudmatrix384", 16,
                                                      c, 0.0, None)), 400, 0.9, CRITERIA["requests-sustained"], **kw)
out["cpu_s"][name] = time.process_time() - cpu
out["cases"][name] = hashlib.sha256(json.dumps([(c.describe(16), s["vet_rate"], s["vet_hi"])
                                                for c, s in vetted.items()]).encode()).hexdigest()[:16]
print(json.dumps(out))
'''


def battery(root: Path) -> subprocess.Popen:
    # both simulate this checkout's stored configurations: a re-store must not read as a simulator change
    env = dict(os.environ, PYTHONPATH=str(root))
    env.setdefault("ASAP_EQUIV_TUNED", str(HERE / "asap" / "demo" / "tuned.json"))
    return subprocess.Popen([sys.executable, "-c", BATTERY], env=env, cwd="/", stdout=subprocess.PIPE, text=True)


def collect(p: subprocess.Popen, root: Path) -> dict:
    out, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"the battery failed in {root} (exit {p.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def record(old: str, new: str, cases: int, against: Path) -> bool:
    """Append the pair to the ledger; False where it is there already."""
    ledger = json.loads(LEDGER.read_text()) if LEDGER.is_file() else []
    if any({e["from"], e["to"]} == {old, new} for e in ledger):
        return False
    commit = subprocess.run(["git", "-C", str(against), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    ledger.append({"from": old, "to": new, "cases": cases, "date": datetime.date.today().isoformat(),
                   "how": f"python benchmarks/sim_equivalence.py --against <checkout of {commit}> --record"})
    LEDGER.write_text(json.dumps(ledger, indent=1) + "\n")
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--against", type=Path, required=True, help="another checkout's root")
    p.add_argument("--record", action="store_true",
                   help="if every case agrees, record the two fingerprints as equivalent (asap/studies/equivalent.json)")
    a = p.parse_args(argv)
    if not (a.against / "asap").is_dir():
        p.error(f"{a.against} is not a checkout (no asap/ in it)")
    procs = [(a.against, battery(a.against)), (HERE, battery(HERE))]     # side by side
    (_, old), (_, new) = [(root, collect(proc, root)) for root, proc in procs]
    same = old["cases"] == new["cases"]
    for name in sorted(set(old["cases"]) | set(new["cases"])):
        o, n = old["cases"].get(name), new["cases"].get(name)
        ct = [d.get("cpu_s", {}).get(name) for d in (old, new)]
        speed = f" (CPU {ct[0]:.1f} s | {ct[1]:.1f} s: {ct[0] / ct[1]:.2f}x)" if None not in ct and ct[1] > 0 else ""
        print(f"[SIMULATED] {'same     ' if o == n else 'DIFFERENT'} {name}: {o} | {n}{speed}")
    print(f"[SIMULATED] {len(new['cases'])} cases, {'all the same' if same else 'NOT the same'}; fingerprints "
          f"{old['fingerprint']} ({a.against}) and {new['fingerprint']} (this checkout)")
    if a.record:
        if not same:
            print("nothing recorded: the checkouts differ")
        elif old["fingerprint"] == new["fingerprint"]:
            print("nothing recorded: the fingerprints are already the same")
        elif record(old["fingerprint"], new["fingerprint"], len(new["cases"]), a.against):
            print(f"recorded {old['fingerprint']} -> {new['fingerprint']} in {LEDGER}")
        else:
            print(f"{old['fingerprint']} and {new['fingerprint']} were recorded as the same already")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
