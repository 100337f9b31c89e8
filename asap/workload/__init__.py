"""Workload generation: arrival processes x length distributions (or a trace) -> list[Request]."""
from asap.workload.arrivals import ArrivalProcess, Constant, Gamma, Poisson
from asap.workload.lengths import Fixed, FromTrace, LengthDistribution, LogNormal, Uniform
from asap.workload.traces import Trace, read_azure, read_mooncake, read_trace
from asap.workload.workload import Workload

__all__ = ["ArrivalProcess", "Constant", "Gamma", "Poisson",
           "Fixed", "FromTrace", "LengthDistribution", "LogNormal", "Uniform",
           "Trace", "read_azure", "read_mooncake", "read_trace", "Workload"]
