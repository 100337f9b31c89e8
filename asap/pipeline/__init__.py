"""The step core, pure Python (no torch): what the async and sync worker loops and both simulated engines
call. plan.py plans a step (chunks, offsets, micro-batches with their work and deadline); step.py is the
step's state machine and `drive`, the one action switch; depth.py the depth and batch-cap policies;
exchange.py the typed expert-exchange protocol and the sync all-to-all's serving rule."""
from asap.pipeline.depth import StepDepth, expert_batch_cap
from asap.pipeline.exchange import Exchange, num_to_serve
from asap.pipeline.plan import PlannedMicroBatch, StepPlan, plan_step, token_weighted_length
from asap.pipeline.step import FINISH, Attend, Dispatch, Finish, StepDriver, StepPipeline, Wait, drive

__all__ = ["FINISH", "Attend", "Dispatch", "Exchange", "Finish", "PlannedMicroBatch", "StepDepth", "StepDriver",
           "StepPipeline", "StepPlan", "Wait", "drive", "expert_batch_cap", "num_to_serve", "plan_step",
           "token_weighted_length"]
