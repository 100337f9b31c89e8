"""Benchmark core: run workloads against targets, summarise, search the max SLO rate, report."""
from asap.bench.metrics import SUMMARY_KEYS, RequestResult, summarize
from asap.bench.rate_search import find_max_rate
from asap.bench.report import format_table, print_table, run_record, write_chrome_trace, write_json
from asap.bench.runner import ReplayTarget, SimulatedTarget, Target, future_submit, rate_measure, replay

__all__ = ["SUMMARY_KEYS", "RequestResult", "summarize", "find_max_rate",
           "format_table", "print_table", "run_record", "write_chrome_trace", "write_json",
           "ReplayTarget", "SimulatedTarget", "Target", "future_submit", "rate_measure", "replay"]
