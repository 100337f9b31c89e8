"""Studies on the simulator: what the project measures with it, above the engine.

- config.py      EngineConfig: one configuration of either engine
- space.py       the configuration spaces an operator of each engine would search
- screen.py      the screen and the vet: which candidates get a rate search
- tune.py        the configuration search (tune): one rule for both engines
- headline.py    `asap sim headline`: best-tuned sync vs best-tuned async per workload and cluster size
- headline_output.py  what it prints and writes (rows, JSON, plot, traces)
- plan.py        `asap plan`: the analytic A:E split and a short search for one deployment
- explain.py     `asap sim explain`: where a simulated run's time goes (busy / stall / idle, link, batches)
- calibrate.py   the cost model against every published prefill point; op-rate fits
- experiments.py requests at a rate, the SLO rule of 5x the idle TTFT, reference TTFTs
- profile.py, kernels.py  `asap profile`: time the runtime's real kernels and fit this CPU's profile
- parallel.py    run a search's simulations serially, in a process pool or on Ray
- code_version.py the fingerprint of the code a stored simulated result depends on
- cli.py, __main__.py  the `asap sim` / `python -m asap.studies` commands

The simulator itself (asap.sim) sits below the engine; studies sit above it because profiling drives the
runtime's kernels, and nothing below imports a study.
"""
