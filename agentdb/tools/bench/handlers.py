"""The handler the bench's ``agentdb worker`` processes run: the full task cycle, as a user's.

Reserve one operation, complete it (where the provider call would be, no
transaction open), succeed with one outbox message - the work of
:func:`agentdb.tools.bench.cycle._single_steps`, done through the worker's
:class:`~agentdb.worker.Job` as a user's handler does it. The task type is the
bench run's (``AGENTDB_BENCH_TASK_TYPE``): each run drains a type of its own.
"""

from __future__ import annotations

import os

from agentdb.models import Message
from agentdb.worker import Job, Succeed

__all__ = ["HANDLERS", "TYPE_ENV", "cycle"]

#: The variable naming the task type the processes serve.
TYPE_ENV = "AGENTDB_BENCH_TASK_TYPE"


async def cycle(job: Job) -> Succeed:
    """Reserve, complete, succeed with an outbox message."""
    n = job.task.params["n"]
    res = await job.reserve(f"{job.task.id}/send", "send", {"n": n})
    if res.fresh:  # the provider call would go here, outside any transaction
        await job.complete(res.operation, result={"ok": True}, provider_reference=f"ref-{n}")
    return Succeed(outbox=(Message("task.done", {"n": n}),))


HANDLERS = {os.environ.get(TYPE_ENV, "bench.worker"): cycle}
