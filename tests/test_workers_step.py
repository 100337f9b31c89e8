"""The runtime's step driver (asap/workers/step.py): what it measures for the depth policy, and the
transport view it hands dispatch_send."""
import contextlib
import time
from types import SimpleNamespace

import pytest
import torch

from asap.comm import ShmTransportSpec
from asap.model.stages import StageOut
from asap.comm.loopback import Loopback
from asap.workers.step import run_step


class _Spans:
    @contextlib.contextmanager
    def span(self, name):
        yield


class _QueuedCompute:
    """Attention returns at once (a kernel launch); synchronize() is where the queued work is waited for."""
    cfg = SimpleNamespace(moe_layers=(False, False))

    def __init__(self, kernel_s):
        self.kernel_s, self.syncs = kernel_s, 0

    def synchronize(self):
        self.syncs += 1
        time.sleep(self.kernel_s)

    def inputs_ready(self, t):
        pass


@pytest.mark.timeout(30)
def test_the_attention_time_fed_to_the_depth_policy_includes_the_device_sync():
    compute = _QueuedCompute(kernel_s=0.05)
    replica = SimpleNamespace(compute=compute,
                              attention=lambda mb, layer: StageOut(h=torch.zeros(1, 2), x=None, topk_ids=None,
                                                                   topk_weights=None))
    exchange = SimpleNamespace(poll=lambda: None)
    ctx = SimpleNamespace(spans=_Spans(), comm_timeout_s=1.0)
    mbs = [SimpleNamespace(h=None)]
    pipe = run_step(ctx, replica, mbs, exchange)
    assert compute.syncs == 2                             # once per attention (1 micro-batch x 2 layers)
    assert pipe.num_attn == 2 and pipe.attn_s >= 2 * 0.05  # launch-only timing would read ~0


def test_the_transports_the_exchanges_send_on_say_their_world_size():
    """dispatch_send reads world_size; without it, it pays a dest.max() host sync. PointToPoint sends on the
    transport itself, AllToAll on its Loopback."""
    spec = ShmTransportSpec(3, ring_bytes=1 << 16)
    try:
        t = spec.connect(0)
        for s in (t, Loopback(t)):
            assert getattr(s, "world_size", None) == 3
        t.close()
    finally:
        spec.cleanup()
