"""Emulation, behind wrappers: what turns a worker into an emulated one, and nothing of it on the real path.

An emulated worker runs the real processes, messages, scheduling and queues, but waits out the cost model's
times instead of computing (compute.py), on a device clock that chains its ops as a GPU stream would
(clock.py), and charges the hardware profile's link for every message (link.py). The wrappers here put those
times where the real runtime has real ones:
  exchange.py  EmulatedPointToPoint / EmulatedAllToAll: the real exchanges, their messages stamped with the
               link's due times, combines crossing the link, the all-to-all's serving by due times;
  step.py      EmulatedRunner: the real step driver, telling the clock when each micro-batch's inputs were in;
  select.py    DeviceTimeSelector: an expert worker chooses at its device's time among the items due by then.
worker.py builds them for one worker (`emulated_worker`); the loops (asap.workers.async_loop, sync_loop) take
the `Emulation` it returns, or None for real compute. workers/step.py, workers/exchange.py and asap.comm
carry only the real path.
"""
