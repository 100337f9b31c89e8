"""Benchmark core: run workloads against targets, summarise, search the max SLO rate, report."""
from asap.measure.metrics import SUMMARY_KEYS, RequestResult, summarize
from asap.measure.rate_search import find_max_rate
from asap.measure.report import format_table, print_table, run_record, write_chrome_trace, write_json
from asap.bench.runner import ReplayTarget, SimulatedTarget, Target, future_submit, rate_measure, replay

__all__ = ["SUMMARY_KEYS", "RequestResult", "summarize", "find_max_rate",
           "format_table", "print_table", "run_record", "write_chrome_trace", "write_json",
           "ReplayTarget", "SimulatedTarget", "Target", "future_submit", "rate_measure", "replay"]
