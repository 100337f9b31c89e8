"""Discrete-event simulator of the async (ASAP) engine and the sync DP+EP baseline.

- hardware.py    device profiles (roofline rates, links), JSON schema + loader
- cost.py        per-op roofline cost model with a per-op breakdown
- experts.py     expert load imbalance (Zipf or measured) through the placement policy
- events.py      event classes; simulator.py the (time, seq) heap loop
- engine.py      what both engines share; async_engine.py / sync_engine.py the two loops
- exchange.py    the simulated links (async point-to-point, sync all-to-all) behind the pipeline's Exchange
- memory.py      what fits on a device (weights, KV, the expert pool's floor)
- spec.py        EngineSpec, the one typed engine; from_runtime.py maps a RuntimeConfig onto it
- run.py         simulate(...) / run(...): build an engine, run requests (instances, sync fleets)
- trace_export.py Chrome/Perfetto trace of a time window

The simulator's core only: what the project studies with it (tuning, the headline, plan, calibration,
explain, profiling) is asap.studies, above the engine.
"""
from asap.sim.cost import CostModel
from asap.sim.hardware import Hardware, Link, OpRate, get_hardware, load_profile
from asap.sim.run import SimRun, balanced_split, run, simulate

__all__ = ["CostModel", "Hardware", "Link", "OpRate", "SimRun", "balanced_split", "get_hardware", "load_profile",
           "run", "simulate"]
