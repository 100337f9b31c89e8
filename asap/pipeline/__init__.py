"""The step pipeline: one replica's step as a pure state machine (step.py), the depth and batch-cap
policies (depth.py) and the expert-exchange interface (exchange.py). Pure Python, no torch: the
async and sync worker loops and the simulator's engines all drive these same objects."""
from asap.pipeline.depth import StepDepth, expert_batch_cap
from asap.pipeline.exchange import Exchange
from asap.pipeline.step import FINISH, Attend, Dispatch, Finish, StepPipeline, Wait

__all__ = ["FINISH", "Attend", "Dispatch", "Exchange", "Finish", "StepDepth", "StepPipeline", "Wait",
           "expert_batch_cap"]
