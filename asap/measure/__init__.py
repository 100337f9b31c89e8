"""Measurement, below both the simulator and bench: per-request results and their summary (metrics.py),
the max-SLO-rate search that cannot lie (rate_search.py), tables and result files (report.py)."""
