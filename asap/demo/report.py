"""The closing summary: what was measured and how, and the verdict the numbers give (whatever it is)."""
from __future__ import annotations

from asap.demo.tuning import rate_of

TIE = 0.05      # attainment differences below this are called a tie


def compare(label: str, sync: dict, asyn: dict) -> str:
    a, s = asyn["slo_attainment"], sync["slo_attainment"]
    p90 = sync["ttft_p90_ms"] / asyn["ttft_p90_ms"] if asyn["ttft_p90_ms"] else float("nan")
    if a - s > TIE:
        who = f"async ahead: {a:.0%} of requests within their SLO against sync's {s:.0%}"
    elif s - a > TIE:
        who = f"sync ahead: {s:.0%} of requests within their SLO against async's {a:.0%}"
    else:
        who = f"a tie on SLO attainment ({a:.0%} async, {s:.0%} sync)"
    return f"{label}: {who}; sync's P90 TTFT is {p90:.1f}x async's"


def summary_lines(real: dict, emulated: dict, simulated: dict) -> list[str]:
    e = emulated["engines"]
    chk = simulated["emulated_check"]["engines"]
    gap = max(abs(chk[k]["slo_attainment"] - e[k]["summary"]["slo_attainment"]) for k in chk)
    stall = {k: v["stall_fraction"] for k, v in e.items()}
    scale = _throughput(simulated["tuned"], simulated.get("tuned_source", ""), simulated.get("runs"))
    return [
        f"REAL (measured on this CPU, real weights and compute, {real['model']}): async and sync "
        + ("return exactly the reference engine's first tokens, logits and KV"
           if real["exact"] else "DO NOT match the reference engine: see the table above"),
        f"EMULATED (measured: {emulated['devices']} dies as real worker processes (one per die, or per attention TP "
        f"group) exchanging real messages; compute and link = "
        f"waits from the cost model of DeepSeek-V3 on CloudMatrix384-like dies; best emulatable configurations): "
        + compare("", e["sync"]["summary"], e["async"]["summary"]).lstrip(": ")
        + f"; workers stalled {stall['sync']:.0%} of the time in sync, {stall['async']:.0%} in async; at "
        f"{emulated['devices']} dies (SIMULATED by the tuner) "
        f"{_throughput(emulated['tuned'], emulated.get('tuned_source', ''))}",
        f"SIMULATED (discrete-event simulator, same cost model, not measured): replaying the emulated run it gives "
        f"attainments within {gap:.0%} of the emulation's; on {simulated['devices']} dies, {scale}",
        "Why async wins where it does: sync starts a step only when every rank does, and each MoE layer ends in an "
        "all-to-all every rank must reach, so a short prompt waits for the longest chunk in flight anywhere; "
        "async replicas run at their own pace and expert workers serve whatever is ready. Where sync's best "
        "configuration splits the cluster into small instances with tensor-parallel attention, its barrier "
        "domains shrink and the gap closes or turns; and on a small cluster async must give its expert pool at "
        "least the dies that hold every routed expert's weights, while sync spreads them over all its dies and "
        "runs attention on every die too, so there sync can come out ahead.",
        "Caveats: emulated and simulated figures depend on the cost model (asap/cost); the REAL part checks "
        "exactness, not speed (on two CPU cores the engines are close: README, 2-device section).",
    ]


def _throughput(tuned: dict, source: str = "", runs: list | None = None) -> str:
    rs, ra = rate_of(tuned["sync"]), rate_of(tuned["async"])
    if not (rs and ra):
        return "no SLO-compliant throughput is stored for this size (see the section above)"
    if "STALE" in source:       # the code under the stored tuning changed: its ratio is no result
        live = "; ".join(f"at {r['rate']:g} req/s sync {r['engines']['sync']['slo_attainment']:.0%} and async "
                         f"{r['engines']['async']['slo_attainment']:.0%} within SLO" for r in runs or [])
        return (f"the stored tuning is STALE (the simulator changed since; rerun `python -m asap.demo.tuning`), so "
                f"its throughputs (async {ra:.1f} vs sync {rs:.1f} req/s) are not a result"
                + (f"; the live runs at those rates: {live}" if live else ""))
    bs, ba = tuned["sync"]["max_slo_rate"] is None, tuned["async"]["max_slo_rate"] is None
    if bs and ba:
        return (f"both engines still pass at the highest rate the tuning sample can certify (async >= {ra:.1f}, "
                f"sync >= {rs:.1f} req/s), so it cannot rank them")
    if bs or ba:    # one maximum is only a lower bound, so the ratio is a bound, and only if that one leads
        bounded, other = ("sync", "async") if bs else ("async", "sync")
        rb, ro = rate_of(tuned[bounded]), rate_of(tuned[other])
        if rb < ro:
            return (f"{bounded}'s best still passes at the highest rate the tuning sample can certify "
                    f"({rb:.1f} req/s, a lower bound), below {other}'s {ro:.1f}: the sample cannot rank them")
        return (f"the SLO-compliant throughput of each engine's best configuration is async {'>= ' if ba else ''}"
                f"{ra:.1f} vs sync {'>= ' if bs else ''}{rs:.1f} req/s ({bounded}'s is a lower bound: it still "
                f"passes at the highest rate the tuning sample can certify): "
                + (f"sync ahead, async <= {ra / rs:.2f}x" if bs else f"async >= {ra / rs:.2f}x"))
    return (f"the SLO-compliant throughput of each engine's best configuration is async {ra:.1f} vs sync "
            f"{rs:.1f} req/s: " + (f"async {ra / rs:.2f}x" if ra >= rs else f"sync ahead, async {ra / rs:.2f}x"))
