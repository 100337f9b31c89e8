"""SIMULATED: the emulated run replayed, and the headline case from stored tuning, through the simulator.

Both SIMULATED (the simulator reuses the engines' scheduling policies; compute and communication
times come from the same cost model the emulated workers wait on):
- the emulated run replayed by the simulator on the same devices and configurations, so the reader
  can see how far emulation and simulation agree;
- the headline case (asap.demo.settings: the Mooncake conversation trace on 32 dies): each engine's
  best-tuned configuration over its whole space (the 32-die row of `asap sim headline`, stored in
  asap/demo/tuned.json) and its SLO-compliant throughput, then both engines simulated live at each of the
  two rates on the trace's first `sim_requests` requests, with the attainment per prompt-length bucket:
  who holds the SLO at whose maximum, and which prompts pay where one does not.
"""
from __future__ import annotations

import time

from asap.measure.buckets import by_length, format_buckets
from asap.measure.metrics import summarize
from asap.demo.settings import DemoSettings, demo_requests, headline_requests
from asap.demo.tuning import headline_configs, rate_of, rate_text
from asap.studies.experiments import at_rate
from asap.sim.run import run


def simulate(requests, engine_config, s: DemoSettings, devices: int) -> dict:
    c = engine_config
    res = run(requests, c.spec(s.model, s.hardware, devices))
    return summarize(res.results) | {"config": c.describe(devices), "sim_wall_s": res.wall_s,
                                     "buckets": by_length(res.results)}


def run_simulated(s: DemoSettings, emulated: dict, log) -> dict:
    t0 = time.monotonic()
    from asap.studies.config import EngineConfig
    same = demo_requests(s, s.devices, s.num_requests, s.rate)
    check = {e: simulate(same, EngineConfig(**t["config"]), s, s.devices) for e, t in emulated["tuned"].items()}
    out = {"devices": s.sim_devices, "workload": s.sim_workload, "slo": s.sim_slo, "num_requests": s.sim_requests,
           "emulated_check": {"devices": s.devices, "rate": s.rate, "engines": check}, "runs": []}
    tuned = headline_configs(s)
    if tuned is None:
        out.update(tuned=None, tuned_source="NOT TUNED (no headline entry in asap/demo/tuned.json; run "
                                            "`python -m asap.demo.tuning --devices 32`)")
    else:
        out.update(tuned=tuned["tuning"], tuned_source=tuned["source"], rule=tuned["rule"])
        base = headline_requests(s, s.sim_requests)
        for rate in sorted({round(rate_of(t), 3) for t in tuned["tuning"].values() if rate_of(t)}):
            log(f"SIMULATED: {s.sim_requests} {s.sim_workload} requests at {rate:g} req/s on {s.sim_devices} dies")
            at = at_rate(base, rate)
            out["runs"].append({"rate": rate, "engines": {e: simulate(at, tuned[e], s, s.sim_devices)
                                                          for e in ("sync", "async")}})
    out["wall_s"] = time.monotonic() - t0
    return out


def format_simulated(sim: dict, emulated: dict) -> list[str]:
    chk = sim["emulated_check"]
    lines = [f"the emulated run replayed by the simulator ({chk['devices']} dies, {chk['rate']:g} req/s):"]
    for engine, m in chk["engines"].items():
        em = emulated["engines"][engine]["summary"]
        lines.append(f"  {engine:<5} SLO attainment {m['slo_attainment']:.2f} (EMULATED {em['slo_attainment']:.2f}), "
                     f"TTFT p90 {m['ttft_p90_ms'] / 1000:.2f} s (EMULATED {em['ttft_p90_ms'] / 1000:.2f} s)")
    lines.append(f"the headline case: Mooncake {sim['workload']} trace on {sim['devices']} dies, SLO {sim['slo']}, "
                 f"each engine best-tuned over its whole space ({sim['tuned_source']}):")
    if sim["tuned"] is None:
        return lines
    rule = sim.get("rule", "default")
    lines.append("  search rule: " + (f">= 90% of requests within SLO, sustained: {rule}" if rule != "default" else
                                      ">= 90% of the sample's requests within SLO (the default)"))
    for engine, t in sim["tuned"].items():
        every = t.get("every_bucket_rate")
        lines.append(f"  {engine:<5} {t['describe']}: SLO-compliant throughput {rate_text(t, 2)} "
                     f"(>= 90% of requests, on {t['num_requests']}); "
                     + (f"{every:.2f} req/s with >= 90% in every length bucket" if every else
                        "no rate keeps >= 90% in every length bucket"))
    lines.append(f"  both engines live at both rates on the trace's first {sim['num_requests']} requests (a maximum "
                 f"certified on fewer can fall below 90% here), within SLO overall and by prompt length (tokens):")
    for r in sim["runs"]:
        for e, m in r["engines"].items():
            lines.append(f"    at {r['rate']:g} req/s {e:<5} {m['slo_attainment']:.0%}: {format_buckets(m['buckets'])}")
    lines.append(f"({sim['wall_s']:.0f} s of simulation)")
    return lines
