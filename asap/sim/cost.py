"""The simulator's cost model is asap.cost (one cost model for the runtime and the simulator);
this module keeps the old import path."""
from asap.cost.comm import seconds_per_copy as _seconds_per_copy  # noqa: F401
from asap.cost.model import ACT_BYTES, ELEMENTWISE_PASSES, CostModel  # noqa: F401
