"""A copy of a hardware profile with every op's compute and memory rate scaled, for sensitivity checks.

The simulator's cost model is optimistic against some published points (`asap sim calibrate`: +27% against
CloudMatrix-Infer's prefill throughput). How much a comparison depends on that error shows by rerunning it on
a profile slowed until the point matches: links, latencies and overheads stay as they are, so communication
weighs relatively more. It prints the calibration point before and after (SIMULATED).

    python benchmarks/scaled_profile.py cloudmatrix384 0.786 out/cm384_x0.786.json
    python benchmarks/rate_search.py --hardware out/cm384_x0.786.json ...
"""
from __future__ import annotations

import argparse
import json
import sys

from asap.cost.hardware import get_hardware
from asap.studies.calibrate import POINTS, closed_batch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("hardware", help="a built-in profile name or a profile JSON")
    p.add_argument("factor", type=float, help="multiplies every op's flops_per_s and bytes_per_s (0 < f <= 1 slows)")
    p.add_argument("out", help="where to write the scaled profile JSON")
    a = p.parse_args(argv)
    if not a.factor > 0:
        p.error(f"factor must be > 0, got {a.factor}")
    d = get_hardware(a.hardware).to_json()
    d["name"], d["calibrated"] = f"{d['name']}-x{a.factor:g}", False
    d["source"] = f"{d['source']}; every op rate x {a.factor:g} (benchmarks/scaled_profile.py)"
    for op in d["ops"].values():
        op["flops_per_s"] *= a.factor
        op["bytes_per_s"] *= a.factor
    with open(a.out, "w") as f:
        json.dump(d, f, indent=1)
    for name, hw, published, skew, _ in POINTS:
        if hw == str(a.hardware):
            before = closed_batch("deepseek-v3", hw, skew=skew)[0]
            after = closed_batch("deepseek-v3", a.out, skew=skew)[0]
            print(f"[SIMULATED] {name}: {before:.0f} -> {after:.0f} tok/s per device against {published:.0f} "
                  f"published ({before / published - 1:+.1%} -> {after / published - 1:+.1%})")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
