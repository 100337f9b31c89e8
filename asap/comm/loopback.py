"""Messages a rank sends to itself, without touching the wire.

The sync baseline's all-to-all includes every rank, the sender too; its own
share stays in process. Wraps any Transport.
"""
from __future__ import annotations

from collections import deque

import torch

from asap.comm.headers import Header
from asap.comm.transport import Message, Rows, Transport


class Loopback(Transport):
    def __init__(self, inner: Transport):
        self.inner = inner
        self.rank, self.world_size = inner.rank, inner.world_size
        self.send_timeout = inner.send_timeout
        self._local: deque[Message] = deque()

    def send(self, dst: int, header: Header, tensors: list[torch.Tensor]) -> None:
        if dst == self.rank:     # a copy, as over the wire: the caller may reuse its tensors
            self._local.append(Message(self.rank, header, [t.materialize() if isinstance(t, Rows) else t.clone()
                                                           for t in tensors]))
        else:
            self.inner.send(dst, header, tensors)

    def poll(self) -> Message | None:
        return self._local.popleft() if self._local else self.inner.poll()

    def recv(self, timeout: float | None) -> Message | None:
        return self._local.popleft() if self._local else self.inner.recv(timeout)

    def close(self) -> None:
        self.inner.close()
