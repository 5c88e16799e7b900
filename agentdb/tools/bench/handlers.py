"""The handlers the bench's ``agentdb worker`` processes run, as a user's would.

:func:`cycle`, the full task cycle: reserve one operation, complete it (where
the provider call would be, no transaction open), succeed with one outbox
message - the work of :func:`agentdb.tools.bench.cycle._single_steps`, done
through the worker's :class:`~agentdb.worker.Job`.

:func:`durable` and :func:`by_hand`, the durable-handler pair: six steps -
three computations and three effects, alternating - and five waits between
them, so the handler is re-entered five times. :func:`durable` is written
straight through (G25: each re-entry reads what was recorded in one
statement); :func:`by_hand` is what the same took before it, with
``job.reserve``: the stage reached kept in ``current_step``, computations
done again on every run, each effect done before replayed by its reserve.

:func:`unit` and :func:`agent_run`, the units of work measured against DBOS
(:mod:`agentdb.tools.bench.versus`; the DBOS side is
:mod:`agentdb.tools.bench.dbos_worker`): one effect and an outbox message;
and a model step, a tool effect, a wait for the approval the bench driver
sends (``signals.approve``), a second tool effect, and the outbox message.

The task type is the bench run's (``AGENTDB_BENCH_TASK_TYPE``): each run
drains a type of its own; ``AGENTDB_BENCH_HANDLER`` picks the handler.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from agentdb.models import Message
from agentdb.worker import Job, Succeed, Wait

__all__ = [
    "HANDLERS", "HANDLER_ENV", "TYPE_ENV", "agent_run", "by_hand", "cycle", "durable", "unit",
]  # fmt: skip

#: The variable naming the task type the processes serve.
TYPE_ENV = "AGENTDB_BENCH_TASK_TYPE"
#: The variable naming the handler they run: cycle (default), durable or by-hand.
HANDLER_ENV = "AGENTDB_BENCH_HANDLER"
# A wait that is due at once, but still a wait: the handler suspends and is re-entered.
_TICK = timedelta(microseconds=1)


async def cycle(job: Job) -> Succeed:
    """Reserve, complete, succeed with an outbox message."""
    n = job.task.params["n"]
    res = await job.reserve(f"{job.task.id}/send", "send", {"n": n})
    if res.fresh:  # the provider call would go here, outside any transaction
        await job.complete(res.operation, result={"ok": True}, provider_reference=f"ref-{n}")
    return Succeed(outbox=(Message("task.done", {"n": n}),))


def _compute(v: int) -> int:
    return v * 31 % 1_000_003


async def _provider(v: int, *, idempotency_key: str) -> dict[str, int]:
    return {"v": v}  # where the provider call would be, no transaction open


async def durable(job: Job) -> Succeed:
    """Six steps, five waits, written straight through (G25)."""
    v = await job.step("s1", _compute, job.task.params["n"])
    await job.sleep("w1", _TICK)
    await job.effect("e1", _provider, v)
    await job.sleep("w2", _TICK)
    v = await job.step("s2", _compute, v)
    await job.sleep("w3", _TICK)
    await job.effect("e2", _provider, v)
    await job.sleep("w4", _TICK)
    v = await job.step("s3", _compute, v)
    await job.sleep("w5", _TICK)
    await job.effect("e3", _provider, v)
    return Succeed(outbox=(Message("task.done", {"n": job.task.params["n"]}),))


async def by_hand(job: Job) -> Succeed | Wait:
    """The same six steps and five waits with job.reserve and current_step."""
    reached = int(job.task.current_step or "0")
    v = job.task.params["n"]
    for i, stage in enumerate(("s1", "e1", "s2", "e2", "s3", "e3")):
        if stage.startswith("s"):
            v = _compute(v)  # not recorded: done again on every run
        else:
            res = await job.reserve(f"{job.task.id}/{stage}", stage, {"v": v})
            if res.fresh:
                done = await _provider(v, idempotency_key=res.operation.idempotency_key)
                await job.complete(res.operation, result=done)
        if reached <= i < 5:
            return Wait(until=datetime.now(UTC), step=str(i + 1))
    return Succeed(outbox=(Message("task.done", {"n": job.task.params["n"]}),))


async def _tool(v: int, *, idempotency_key: str) -> dict[str, int]:
    return {"v": v}  # where the tool's provider call would be, no transaction open


async def unit(job: Job) -> Succeed:
    """One external call (reserved and committed before it, G13), one outbox message."""
    n = job.task.params["n"]
    await job.effect("provider", _provider, n)
    return Succeed(outbox=(Message("task.done", {"n": n}),))


async def agent_run(job: Job) -> Succeed:
    """Model step, tool effect, approval wait, tool effect, finish with an outbox message."""
    n = job.task.params["n"]
    v = await job.step("model", _compute, n)
    await job.effect("tool/1", _tool, v)
    await job.wait_for_signal("approval", "approval")
    await job.effect("tool/2", _tool, _compute(v))
    return Succeed(outbox=(Message("task.done", {"n": n}),))


_KINDS = {
    "cycle": cycle, "durable": durable, "by-hand": by_hand, "unit": unit, "agent-run": agent_run,
}  # fmt: skip
HANDLERS = {os.environ.get(TYPE_ENV, "bench.worker"): _KINDS[os.environ.get(HANDLER_ENV, "cycle")]}
