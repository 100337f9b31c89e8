"""asap.comm: how attention and expert workers talk.

headers.py     Header / Kind: the typed control-plane half of a message
transport.py   Transport / TransportSpec interfaces, CommTimeout, the shared wire format, Rows, BufferPool
ring.py, shm.py    shared-memory transport (default on one machine; >= 256 KiB messages streamed)
semaphore.py   named POSIX semaphores: the shm transport's wake-ups (pid in the name: swept after a kill)
loopback.py    a rank's messages to itself
dist.py        torch.distributed point-to-point transport (gloo on CPU, NCCL on GPU)
mailbox.py     Mailbox: drains a transport and files messages by kind
primitives.py  dispatch_send / dispatch_recv / combine_send / combine_recv
"""
from asap.comm.dist import DistTransport, DistTransportSpec
from asap.comm.headers import HEADER_WORDS, Header, Kind
from asap.comm.mailbox import Mailbox, WorkItem
from asap.comm.primitives import (CombineInbox, PendingCombine, WorkQueue, combine_recv, combine_send,
                                  dispatch_recv, dispatch_send)
from asap.comm.shm import ShmTransport, ShmTransportSpec
from asap.comm.transport import CommTimeout, Message, Transport, TransportSpec

__all__ = [
    "HEADER_WORDS", "CombineInbox", "CommTimeout", "DistTransport", "DistTransportSpec", "Header", "Kind",
    "Mailbox", "Message", "PendingCombine", "ShmTransport", "ShmTransportSpec", "Transport",
    "TransportSpec", "WorkItem", "WorkQueue", "combine_recv", "combine_send", "dispatch_recv",
    "dispatch_send",
]
