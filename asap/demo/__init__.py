"""`asap demo`: what ASAP is for, in three labelled parts (asap/demo/cli.py runs them).

settings.py    the demo's workload, cluster and SLO (full and --quick)
tuning.py      each engine's best-tuned configuration (asap.studies.tune, run offline into tuned.json)
real.py        REAL: async and sync equal the reference engine on this CPU
emulated.py    EMULATED: a DeepSeek-V3 cluster of real worker processes, compute timed by the cost model
simulated.py   SIMULATED: the emulated run replayed, and the headline case (conversation trace, 32 dies)
report.py      the closing summary and the verdict
"""
