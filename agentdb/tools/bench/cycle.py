"""The agentdb side of the task cycle: per step, batched, and no-op.

Each run claims batches of one ``task_type`` on every connection until the
queue is empty. Per step and batched do the same work (claim under a lease,
reserve an operation, complete it, finish the task with its event and an
outbox row); no-op does only what a queue's no-op job does (claim, finish).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

from agentdb import _db, leases, operations, tasks
from agentdb.errors import AgentDBError
from agentdb.models import Message, Reservation, Task
from agentdb.tools.bench.harness import HOUR, Clock, Cycle

__all__ = ["AGENTDB_RUNS", "CycleRun", "batched_steps"]

#: ``run(conns, task_type, clock, batch)``: drain the queue on ``conns``, say what happened.
CycleRun: TypeAlias = Callable[[Sequence[_db.Conn], str, Clock, int], Awaitable[Cycle]]
_Handle: TypeAlias = Callable[[_db.Conn, list[Task], Cycle], Awaitable[None]]


async def _drain(
    conns: Sequence[_db.Conn],
    task_type: str,
    clock: Clock,
    batch: int,
    name: str,
    handle: _Handle,
) -> Cycle:
    """One worker per connection: claim ``batch`` tasks, ``handle`` them, until none is due."""
    result = Cycle(0)

    async def worker(conn: _db.Conn, owner: str) -> None:
        while claimed := await leases.claim(
            conn, owner, batch=batch, lease_ttl=HOUR, task_types=[task_type]
        ):
            clock.mark()
            await handle(conn, claimed, result)

    await asyncio.gather(*(worker(c, f"{name}-{i}") for i, c in enumerate(conns)))
    return result


async def _single_steps(conn: _db.Conn, claimed: list[Task], result: Cycle) -> None:
    """Reserve, complete and finish each task, one statement per step."""
    for t in claimed:
        res = await operations.reserve(
            conn, t.tenant_id, t.id, f"{t.id}/send", "send", {"n": t.params["n"]}, lease=t.lease
        )
        if res.fresh:  # the provider call would go here, outside any transaction
            await operations.complete(
                conn,
                res.operation,
                result={"ok": True},
                provider_reference=f"ref-{t.params['n']}",
                lease=t.lease,
            )
        await tasks.transition(
            conn,
            t.tenant_id,
            t.id,
            expected_version=t.state_version,
            to_state="succeeded",
            lease=t.lease,
            outbox=[Message("task.done", {"n": t.params["n"]})],
        )
        result.done += 1


async def batched_steps(conn: _db.Conn, claimed: list[Task], result: Cycle) -> None:
    """The same steps, one statement each for the whole claimed batch."""
    held = [(t, t.lease) for t in claimed if t.lease is not None]
    reserved = await operations.reserve_many(
        conn,
        [
            operations.ReserveRequest(lease, f"{t.id}/send", "send", {"n": t.params["n"]})
            for t, lease in held
        ],
    )
    # The provider calls would go here, outside any transaction.
    settled = await operations.complete_many(
        conn,
        [
            operations.Completion(
                r.operation,
                result={"ok": True},
                provider_reference=f"ref-{t.params['n']}",
                lease=lease,
            )
            for (t, lease), r in zip(held, reserved, strict=True)
            if isinstance(r, Reservation) and r.fresh
        ],
    )
    finished = await tasks.finish_many(
        conn,
        claimed,
        outbox={t.id: [Message("task.done", {"n": t.params["n"]})] for t in claimed},
    )
    result.refused += sum(isinstance(r, AgentDBError) for r in (*reserved, *settled, *finished))
    result.done += sum(isinstance(r, Task) for r in finished)


async def _noop_steps(conn: _db.Conn, claimed: list[Task], result: Cycle) -> None:
    """Finish the batch (state + event): no operation, no outbox row."""
    finished = await tasks.finish_many(conn, claimed)
    refused = sum(isinstance(r, AgentDBError) for r in finished)
    result.refused += refused
    result.done += len(finished) - refused


def _run(name: str, handle: _Handle) -> CycleRun:
    async def run(conns: Sequence[_db.Conn], task_type: str, clock: Clock, batch: int) -> Cycle:
        return await _drain(conns, task_type, clock, batch, name, handle)

    return run


#: The agentdb contenders' kinds, as :class:`agentdb.tools.bench.runner` names them.
AGENTDB_RUNS: dict[str, CycleRun] = {
    "agentdb-single": _run("single", _single_steps),
    "agentdb-batched": _run("batched", batched_steps),
    "agentdb-noop": _run("noop", _noop_steps),
}
