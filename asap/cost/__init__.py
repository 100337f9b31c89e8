"""One cost model below the runtime and the simulator: op formulas (ops), hardware profiles
(hardware), communication (comm) and the per-op CostModel (model)."""
from asap.cost.hardware import Hardware, Link, OpRate, get_hardware, load_profile
from asap.cost.model import CostModel
from asap.cost.shares import ExpertShares

__all__ = ["CostModel", "ExpertShares", "Hardware", "Link", "OpRate", "get_hardware", "load_profile"]
