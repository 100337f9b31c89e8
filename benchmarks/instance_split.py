"""Independent instances against one lone instance at the same rate per instance (SIMULATED).

A headline row at many devices runs its configuration as N independent instances behind a
least-outstanding-work router (asap.sim.run.split_instances). This runs the same configuration once as
N instances at N x the rate, and once alone on the first requests at the rate per instance, and prints the
attainment of each instance: whether a row's per-die rate carries over from the smaller row.

    python benchmarks/instance_split.py --rate 306.7 --num-requests 34000 --instances 6 \\
        --config '{"engine": "async", "attention_workers": 32, "token_budget": 8192, "selector": "fullest"}'
"""
from __future__ import annotations

import argparse
import json

from asap.cost.model import CostModel
from asap.measure.metrics import summarize
from asap.pipeline.plan import token_weighted_length
from asap.sim.run import get_hardware, get_model, instance_tokens_per_s, run, split_instances
from asap.studies.experiments import at_rate
from asap.workload.presets import workload_requests
from asap.workload.slo import parse_slo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="fixed-4k")
    p.add_argument("--rate", type=float, required=True, help="req/s over all instances")
    p.add_argument("--num-requests", type=int, required=True)
    p.add_argument("--instances", type=int, required=True)
    p.add_argument("--devices-per-instance", type=int, default=64)
    p.add_argument("--config", required=True, help="EngineSpec settings as JSON (one instance's)")
    a = p.parse_args(argv)
    cfg = json.loads(a.config)
    reqs = at_rate(parse_slo("2s+1ms/tok").apply(workload_requests(a.workload, a.num_requests)), a.rate)
    many = run(reqs, devices=a.devices_per_instance * a.instances, instances=a.instances, **cfg)
    cost = CostModel(get_model("deepseek-v3"), get_hardware("cloudmatrix384"), attn_tp=cfg.get("attention_tp", 1))
    ranks = cfg.get("attention_workers") or a.devices_per_instance // cfg.get("attention_tp", 1)
    parts = split_instances(reqs, a.instances, instance_tokens_per_s(cost, ranks, cfg.get("token_budget", 16384),
                                                                      token_weighted_length(reqs)))
    by_id = {r.request_id: r for r in many.results}
    each = [summarize([by_id[q.id] for q in part])["slo_attainment"] for part in parts]
    print(f"[SIMULATED] {a.instances} instances at {a.rate:g} req/s on {a.num_requests}: "
          f"{summarize(many.results)['slo_attainment']:.1%} within SLO; by instance "
          + " / ".join(f"{x:.0%}" for x in each) + f" ({[len(x) for x in parts]} requests)")
    n = a.num_requests // a.instances
    lone = run(at_rate(reqs[:n], a.rate / a.instances), devices=a.devices_per_instance, **cfg)
    print(f"[SIMULATED] one instance alone at {a.rate / a.instances:g} req/s on {n}: "
          f"{summarize(lone.results)['slo_attainment']:.1%} within SLO")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
