"""SIMULATED: the demo's workload on the full 384-die CloudMatrix384, through the discrete-event simulator.

Both SIMULATED (the simulator reuses the engines' scheduling policies; compute and communication
times come from the same cost model the emulated workers wait on):
- the emulated run replayed by the simulator on the same devices and configurations, so the reader
  can see how far emulation and simulation agree;
- 384 dies: each engine's best-tuned configuration over the tuner's full space (attention TP and
  independent sync instances included) and its SLO-compliant throughput (the tuner's rate search),
  then both engines simulated live at each of the two rates on `sim_requests` requests.
"""
from __future__ import annotations

import time

from asap.measure.metrics import summarize
from asap.demo.settings import DemoSettings, demo_requests
from asap.demo.tuning import rate_of, rate_text, tuned_configs
from asap.sim.run import run


def simulate(requests, engine_config, s: DemoSettings, devices: int) -> dict:
    c = engine_config
    res = run(requests, c.engine, s.model, s.hardware, devices, c.attention_workers, **c.sim_kw())
    return summarize(res.results) | {"config": c.describe(devices), "sim_wall_s": res.wall_s}


def run_simulated(s: DemoSettings, emulated: dict, log, retune: bool = False) -> dict:
    t0 = time.monotonic()
    from asap.sim.tune import EngineConfig
    same = demo_requests(s, s.devices, s.num_requests, s.rate)
    check = {e: simulate(same, EngineConfig(**t["config"]), s, s.devices) for e, t in emulated["tuned"].items()}
    tuned = tuned_configs(s, s.sim_devices, emulatable_only=False, retune=retune)
    rates = sorted({round(rate_of(t), 3) for t in tuned["tuning"].values() if rate_of(t)}) or [s.sim_rate]
    at_scale = {}
    for rate in rates:
        log(f"SIMULATED: {s.sim_requests} requests at {rate:g} req/s on {s.sim_devices} dies")
        big = demo_requests(s, s.sim_devices, s.sim_requests, rate)
        at_scale[rate] = {e: simulate(big, tuned[e], s, s.sim_devices) for e in ("sync", "async")}
    return {"devices": s.sim_devices, "num_requests": s.sim_requests, "tuned": tuned["tuning"],
            "tuned_source": tuned["source"], "runs": [{"rate": r, "engines": v} for r, v in at_scale.items()],
            "emulated_check": {"devices": s.devices, "rate": s.rate, "engines": check},
            "wall_s": time.monotonic() - t0}


def format_simulated(sim: dict, emulated: dict) -> list[str]:
    chk = sim["emulated_check"]
    lines = [f"the emulated run replayed by the simulator ({chk['devices']} dies, {chk['rate']:g} req/s):"]
    for engine, m in chk["engines"].items():
        em = emulated["engines"][engine]["summary"]
        lines.append(f"  {engine:<5} SLO attainment {m['slo_attainment']:.2f} (EMULATED {em['slo_attainment']:.2f}), "
                     f"TTFT p90 {m['ttft_p90_ms'] / 1000:.2f} s (EMULATED {em['ttft_p90_ms'] / 1000:.2f} s)")
    lines.append(f"{sim['devices']} dies, each engine best-tuned over the full space ({sim['tuned_source']}):")
    for engine, t in sim["tuned"].items():
        lines.append(f"  {engine:<5} {t['describe']}: SLO-compliant throughput {rate_text(t)}")
    for run in sim["runs"]:
        lines.append(f"  at {run['rate']:g} req/s ({sim['num_requests']} requests): " + "; ".join(
            f"{e} attainment {m['slo_attainment']:.2f}, TTFT p50 {m['ttft_p50_ms'] / 1000:.2f} s p90 "
            f"{m['ttft_p90_ms'] / 1000:.2f} s" for e, m in run["engines"].items()))
    lines.append(f"({sim['wall_s']:.0f} s of simulation)")
    return lines
