"""The async worker: claim due tasks under leases, run handlers, keep leases alive, recover.

A handler is ``async def handle(job: Job) -> Outcome | None``. The natural shape
is the safe one (G13)::

    async def send_invoice(job: Job) -> None:
        res = await job.reserve(f"invoice-{job.task.params['id']}/charge", "charge", {...})
        if res.fresh:                                   # committed before the call
            ref = await provider.charge(..., idempotency_key=res.operation.idempotency_key)
            await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
        # returning None marks the task succeeded (with its event, one statement)

No transaction is open while the handler awaits the provider. The worker
renews the lease every ``ttl / 3``; when a renewal finds the lease gone the
handler is cancelled and nothing further is written (G12). A handler that
raises is retried with exponential backoff and jitter until the task's
attempts run out (then 'dead'). Operations an earlier, crashed attempt left
reserved or in flight are never re-run blindly: :meth:`Job.reserve` hands
them to the reconcile hook registered for their action, or marks them
'unknown' and retries the task later.

A handler that is not an async callable is refused when the worker starts;
whatever else it does - returns something that is not an outcome, raises, is
cancelled, or returns an outcome the database refuses - the task does not
stay 'running': the worker that ran it fails, retries or releases it, with
``last_error`` and its event.

:mod:`~agentdb.worker.outcomes` says what each outcome writes and how each way
an attempt ends is recorded; :mod:`~agentdb.worker.finish` what happens when
the finishing write is refused or lost with its connection;
:mod:`~agentdb.worker.job` is the handler's view of one attempt;
:mod:`~agentdb.worker.loop` is the claim loop, heartbeat and shutdown.
"""

from __future__ import annotations

from agentdb._runtime import backoff
from agentdb.errors import OperationUnsettled
from agentdb.worker.job import Job
from agentdb.worker.loop import Worker, WorkerStats
from agentdb.worker.outcomes import (
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
    "Fail",
    "Handler",
    "Job",
    "OperationUnsettled",
    "Outcome",
    "ReconcileHook",
    "Reconciled",
    "Retry",
    "Succeed",
    "Wait",
    "Worker",
    "WorkerStats",
    "backoff",
]
