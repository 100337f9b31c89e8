"""Simulator speed: 10k Mooncake requests through DeepSeek-V3 (61 layers) at 384 devices (SIMULATED).

Target: <= 60 s on a 2-core machine. Usage: python benchmarks/sim_speed.py [--engine async|sync]
"""
import sys

from asap.sim.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["speed", *sys.argv[1:]]))
