"""The async worker: claim due tasks under leases, run handlers, keep leases alive, recover.

A handler is ``async def handle(job: Job) -> Outcome | None``, written as
straight-line code: each named step and effect is recorded on the ledger, so
the worker can re-enter it from the top after every wait and every crash
(G25)::

    async def send_invoice(job: Job) -> Succeed:
        inv = job.task.params["invoice"]
        total = await job.step("price", price_lines, inv)          # once, then replayed
        review = await job.wait_for_signal("review", "approval")    # sleeps, holding no worker
        if review.decision != "approved":
            return Fail("rejected by " + review.sender)
        charge = await job.effect("charge", psp.charge, total)      # reserved, then called
        return Succeed(payload={"charge": charge["id"]})

No transaction is open while the handler awaits the provider (G13): an
effect's reservation commits before the call, and the provider gets the
operation's idempotency key. The worker renews the lease every ``ttl / 3``
and asks once a second whether a cancel or the deadline sweep took it; when
the lease is gone the handler is cancelled and nothing further is written
(G12, G20, G21). A handler that raises is retried with exponential backoff
and jitter until the task's attempts run out (then 'dead'); a run that ends
waiting gives its attempt back.

:mod:`~agentdb.worker.durable` is the straight-line API and its rules;
:mod:`~agentdb.worker.outcomes` says what each outcome writes and how each way
an attempt ends is recorded; :mod:`~agentdb.worker.finish` what happens when
the finishing write is refused or lost with its connection;
:mod:`~agentdb.worker.job` is the handler's view of one attempt (and the
lower-level ``reserve`` / ``complete`` / ``Wait`` for handlers that keep their
own state); :mod:`~agentdb.worker.loop` is the claim loop, heartbeat, lease
watch and shutdown.
"""

from __future__ import annotations

from agentdb._runtime import backoff
from agentdb.errors import OperationUnsettled
from agentdb.worker.durable import ChildResult, NotPerformed, Performed, Suspended
from agentdb.worker.job import Job
from agentdb.worker.loop import Worker, WorkerStats
from agentdb.worker.outcomes import (
    MANUAL,
    Fail,
    Handler,
    Outcome,
    Reconciled,
    ReconcileHook,
    Retry,
    Succeed,
    Wait,
)

__all__ = [
    "MANUAL",
    "ChildResult",
    "Fail",
    "Handler",
    "Job",
    "NotPerformed",
    "OperationUnsettled",
    "Outcome",
    "Performed",
    "ReconcileHook",
    "Reconciled",
    "Retry",
    "Succeed",
    "Suspended",
    "Wait",
    "Worker",
    "WorkerStats",
    "backoff",
]
