"""Headline (SIMULATED): async vs sync SLO-compliant prefill throughput, DeepSeek-V3 on a
CloudMatrix384-like profile, Mooncake conversation arrivals, 32/64/128/384 devices.
Writes out/sim_headline/{headline.json,headline.png,attainment.png}.
Usage: python benchmarks/sim_headline.py [--devices 32 64] [--num-requests N] [--max-prompt 32768]
"""
import sys

from asap.studies.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["headline", *sys.argv[1:]]))
