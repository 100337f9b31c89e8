"""The closing summary: what was measured and how, and the verdict the numbers give (whatever it is)."""
from __future__ import annotations

from asap.demo.tuning import rate_of
from asap.studies.tune import TARGET

TIE = 0.05      # attainment differences (and relative throughput differences) below this are called a tie


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
    scale = _throughput(simulated["tuned"], simulated.get("tuned_source", ""), simulated.get("runs")) \
        if simulated.get("tuned") else "no tuning is stored for it (" + simulated.get("tuned_source", "") + ")"
    every = _every_bucket(simulated)
    emulated_verdict = ("not judged: the figures are FLAGGED (" + emulated["flag"] + ")" if emulated.get("flag")
                        else compare("", e["sync"]["summary"], e["async"]["summary"]).lstrip(": "))
    return [
        f"REAL (measured on this CPU, real weights and compute, {real['model']}): async and sync "
        + ("return exactly the reference engine's first tokens, logits and KV"
           if real["exact"] else "DO NOT match the reference engine: see the table above"),
        f"EMULATED (measured: {emulated['devices']} dies as real worker processes (one per die, or per attention TP "
        f"group) exchanging real messages; compute and link = "
        f"waits from the cost model of DeepSeek-V3 on CloudMatrix384-like dies; best emulatable configurations): "
        + emulated_verdict
        + f"; workers stalled {stall['sync']:.0%} of the time in sync, {stall['async']:.0%} in async; at "
        f"{emulated['devices']} dies (SIMULATED by the tuner) "
        f"{_throughput(emulated['tuned'], emulated.get('tuned_source', ''))}",
        f"SIMULATED (discrete-event simulator, same cost model, not measured): replaying the emulated run it gives "
        f"SLO attainments {gap * 100:.0f} points or less from the emulation's; on the headline case (Mooncake "
        f"{simulated.get('workload', 'conversation')} trace, {simulated['devices']} dies), {scale}{every}",
        *verdict_lines(emulated, simulated),
        "Caveats: emulated and simulated figures depend on the cost model (asap/cost); the REAL part checks "
        "exactness, not speed (on two CPU cores the engines are close).",
    ]


def leads(emulated: dict, simulated: dict) -> list[tuple[str, str | None, int]]:
    """(what was compared, "async" | "sync" | None for no lead, on how many dies) per comparison this run made."""
    n, big = emulated["devices"], simulated["devices"]
    out = []
    if not emulated.get("flag"):
        e = emulated["engines"]
        out.append((f"the EMULATED runs on {n} dies", _ahead(e["async"]["summary"]["slo_attainment"],
                                                              e["sync"]["summary"]["slo_attainment"]), n))
    out.append((f"the tuned throughputs on {n} dies (SIMULATED)",
                _tuned_lead(emulated["tuned"], emulated.get("tuned_source", "")), n))
    if simulated.get("tuned"):
        out.append((f"the tuned throughputs on {big} dies (SIMULATED)",
                    _tuned_lead(simulated["tuned"], simulated.get("tuned_source", "")), big))
    for r in simulated.get("runs", []):
        a, s = (r["engines"][k]["slo_attainment"] for k in ("async", "sync"))
        holds = {k: v >= TARGET for k, v in (("async", a), ("sync", s))}
        who = "async" if holds["async"] and not holds["sync"] else "sync" if holds["sync"] and not holds["async"] \
            else None
        out.append((f"both engines live at {r['rate']:g} req/s on {big} dies (SIMULATED)", who, big))
    return out


def verdict_lines(emulated: dict, simulated: dict) -> list[str]:
    """What this run showed, from its own numbers; the explanation only of what it showed."""
    found = leads(emulated, simulated)
    by = {k: [what for what, who, _ in found if who == k] for k in ("async", "sync", None)}
    lines = ["VERDICT of this run: " + "; ".join(
        f"{label}: {', '.join(by[k])}" for k, label in (("async", "async ahead in"), ("sync", "sync ahead in"),
                                                         (None, "no lead in")) if by[k])]
    if by["async"]:
        lines.append("Why async can lead: sync starts a step only when every rank does, and each MoE layer ends in "
                     "an all-to-all every rank must reach, so a short prompt waits for the longest chunk in flight "
                     "anywhere; async replicas run at their own pace and expert workers serve whatever is ready."
                     + _who_pays(simulated))
    if by["sync"]:
        lines.append("Where sync leads, the layouts differ: " + _why_sync(emulated, simulated,
                                                                   {n for _, who, n in found if who == "sync"}))
    if not by["async"] and not by["sync"]:
        lines.append("Nothing in this run separates the engines: it shows no advantage for async (or for sync).")
    return lines


def _why_sync(emulated: dict, simulated: dict, sizes: set[int]) -> str:
    """The facts of this run's configurations that favour sync, at the sizes where it led (computed, not
    asserted)."""
    from asap.sim.hardware import get_hardware
    from asap.sim.memory import min_expert_workers
    from asap.sim.run import get_model
    need = min_expert_workers(get_model(emulated["model"]), get_hardware(emulated["hardware"]))
    parts = []
    for n, tuned in ((emulated["devices"], emulated["tuned"]), (simulated["devices"], simulated["tuned"])):
        if not tuned:
            continue
        a, s = tuned["async"]["config"], tuned["sync"]["config"]
        if n not in sizes or a.get("attention_workers") is None or a.get("colocated"):   # not led there, a layout
            continue                                # not spelled out, or no expert pool (co-located)
        per = n // (a.get("instances") or 1)
        experts = per - a["attention_workers"] * (a.get("attention_tp") or 1)
        parts.append(f"on {n} dies async's best gives {experts} of {per} dies to its expert pool (at least {need} "
                     f"hold every routed expert's weights) and attention to the other {per - experts}, while sync "
                     f"runs attention and experts on every die"
                     + (f" in {s['instances']} independent instances of TP{s['attention_tp']} attention, whose "
                        f"barriers span only their own dies" if (s.get("instances") or 1) > 1 else
                        f" with TP{s['attention_tp']} attention" if (s.get("attention_tp") or 1) > 1 else ""))
    return "; ".join(parts) + "." if parts else "the stored configurations do not spell out their layouts."


def _ahead(a: float, s: float) -> str | None:
    return "async" if a - s > TIE else "sync" if s - a > TIE else None


def _tuned_lead(tuned: dict, source: str) -> str | None:
    """Who the stored tuning ranks first, or None where it cannot rank them (stale, missing, bounds)."""
    rs, ra = rate_of(tuned["sync"]), rate_of(tuned["async"])
    if not (rs and ra) or "STALE" in source or "NOT TUNED" in source:
        return None
    bs, ba = tuned["sync"]["max_slo_rate"] is None, tuned["async"]["max_slo_rate"] is None
    if bs and ba:
        return None
    if bs or ba:            # a lower bound leads only where it is already above the other's maximum
        bounded = "sync" if bs else "async"
        other = "async" if bs else "sync"
        return bounded if rate_of(tuned[bounded]) > rate_of(tuned[other]) * (1 + TIE) else None
    return "async" if ra > rs * (1 + TIE) else "sync" if rs > ra * (1 + TIE) else None


def _throughput(tuned: dict, source: str = "", runs: list | None = None) -> str:
    rs, ra = rate_of(tuned["sync"]), rate_of(tuned["async"])
    if not (rs and ra):
        return "no SLO-compliant throughput is stored for this size (see the section above)"
    if "STALE" in source:       # the code under the stored tuning changed: its ratio is no result
        live = "; ".join(f"at {r['rate']:g} req/s sync {r['engines']['sync']['slo_attainment']:.0%} and async "
                         f"{r['engines']['async']['slo_attainment']:.0%} within SLO" for r in runs or [])
        why = "the search rule" if "search rule" in source else "the simulator"
        return (f"the stored tuning is STALE ({why} changed since; rerun `python -m asap.demo.tuning`), so "
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


def _every_bucket(simulated: dict) -> str:
    """The stored rates under ">= 90% in every prompt-length bucket", where both are stored and current."""
    tuned = simulated.get("tuned") or {}
    rs, ra = ((tuned.get(e) or {}).get("every_bucket_rate") for e in ("sync", "async"))
    if not (rs and ra) or "STALE" in simulated.get("tuned_source", ""):
        return ""
    return (f"; held to >= 90% in every prompt-length bucket, async {ra:.2f} vs sync {rs:.2f} req/s "
            f"({ra / rs:.2f}x)")


def _who_pays(simulated: dict) -> str:
    """Which prompts miss in the live run where async holds and sync does not (computed from that run)."""
    for r in simulated.get("runs", []):
        a, s = r["engines"]["async"], r["engines"]["sync"]
        if not (a["slo_attainment"] >= TARGET > s["slo_attainment"]) or "buckets" not in s:
            continue
        gaps = [(ba["slo_attainment"] - bs["slo_attainment"], k, bs["slo_attainment"], ba["slo_attainment"])
                for k, bs in s["buckets"].items() if (ba := a["buckets"][k])["slo_attainment"] is not None
                and bs["slo_attainment"] is not None]
        if gaps:
            _, k, bs, ba = max(gaps)
            out = (f" In the live run at {r['rate']:g} req/s on {simulated['devices']} dies the prompts that pay on "
                   f"sync are the {k}-token ones: {bs:.0%} within SLO on sync, {ba:.0%} on async.")
            lost, k, bs, ba = min(gaps)
            if lost < -TIE:         # a bucket async serves worse: say so too
                out += f" Async's {k}-token prompts pay instead: {ba:.0%} within SLO, against sync's {bs:.0%}."
            return out
    return ""
