"""Errors the scheduling policies raise."""


class QueueFull(Exception):
    """A replica's waiting queue is at `max_queue`; the caller should route elsewhere or shed."""


class Rejected(Exception):
    """Admission control turned a request away (it would miss its SLO by more than the slack)."""
