"""Discrete-event simulator of the async (ASAP) engine and the sync DP+EP baseline.

- hardware.py    device profiles (roofline rates, links), JSON schema + loader
- cost.py        per-op roofline cost model with a per-op breakdown
- experts.py     expert load imbalance (Zipf or measured) through the placement policy
- events.py      event classes; simulator.py the (time, seq) heap loop
- engine.py      what both engines share; async_engine.py / sync_engine.py the two loops
- run.py         simulate(...) / run(...): build an engine, run requests
- calibrate.py   DeepSeek-V3 prefill on 32 H800 vs DeepSeek's published figure; op-rate fits
- experiments.py SLO-compliant throughput, headline async vs sync sweep
- trace_export.py Chrome/Perfetto trace of a time window
"""
from asap.sim.cost import CostModel
from asap.sim.hardware import Hardware, Link, OpRate, get_hardware, load_profile
from asap.sim.run import SimRun, balanced_split, run, simulate

__all__ = ["CostModel", "Hardware", "Link", "OpRate", "SimRun", "balanced_split", "get_hardware", "load_profile",
           "run", "simulate"]
