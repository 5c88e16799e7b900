"""Deadlines (G21): past it a task is not claimed, not finished, starts no effect; swept to dead.

Time is the database's: a test that needs a deadline to pass waits until the
server's clock says it has (``now() > deadline_at``), never a fixed sleep.
The raw-SQL attacks on the guard are in tests/test_attacks.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import leases, operations, tasks
from agentdb.errors import ConfigurationError, DeadlineExceeded, LeaseLost, PastDeadline
from agentdb.models import Task
from agentdb.worker import Job, Succeed, Worker
from tests import factories as F
from tests.conftest import Tenants

SOON = timedelta(milliseconds=600)


async def _passed(admin: asyncpg.Connection, task_id: uuid.UUID) -> None:
    """Until the database's clock is past the task's deadline."""
    for _ in range(600):
        if await admin.fetchval(
            "SELECT deadline_at < clock_timestamp() FROM agent_tasks WHERE id = $1", task_id
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the deadline never passed")


async def _events(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[asyncpg.Record]:
    return await admin.fetch(
        "SELECT event_type, from_state, to_state, actor_id, payload FROM agent_events"
        " WHERE task_id = $1 AND task_state_version IS NOT NULL ORDER BY task_state_version",
        task_id,
    )


async def _soon(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str, **kw: object) -> Task:
    return await tasks.create(
        pool,
        tenant,
        task_type,
        deadline=datetime.now(UTC) + SOON,
        **kw,  # type: ignore[arg-type]
    )


async def test_G21_a_deadline_needs_a_time_zone(pool: asyncpg.Pool, tenants: Tenants) -> None:
    with pytest.raises(ConfigurationError, match="no time zone"):
        await tasks.create(pool, tenants.a, "d-naive", deadline=datetime(2030, 1, 1))
    when = datetime(2030, 1, 1, tzinfo=UTC)
    on_time = await tasks.create(pool, tenants.a, "d-aware", deadline=when)
    assert on_time.deadline_at == when


async def test_G21_a_task_past_its_deadline_is_not_claimed_and_the_sweep_ends_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    late = await _soon(pool, tenants.a, "d-claim")
    on_time = await tasks.create(
        pool, tenants.a, "d-claim", deadline=datetime.now(UTC) + timedelta(hours=1)
    )
    await _passed(admin_conn, late.id)
    claimed = await leases.claim(pool, "w", batch=10, task_types=["d-claim"])
    assert [t.id for t in claimed] == [on_time.id]  # the control is claimed, the late one not

    swept = await leases.expire_deadlines(pool, actor="sweeper")
    assert swept == [(tenants.a, late.id)]
    dead = await tasks.get(pool, tenants.a, late.id)
    assert (dead.state, dead.lease_owner) == ("dead", None)
    assert (dead.last_error or "").startswith("deadline passed at ")
    last = (await _events(admin_conn, late.id))[-1]
    assert (last["event_type"], last["from_state"], last["to_state"], last["actor_id"]) == (
        "task.deadline_passed", "pending", "dead", "sweeper",
    )  # fmt: skip
    assert "deadline_at" in json.loads(last["payload"])
    assert await leases.expire_deadlines(pool) == []  # nothing twice
    assert (await tasks.get(pool, tenants.a, on_time.id)).state == "running"


async def test_G21_a_finish_after_the_deadline_is_refused_by_the_database(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await _soon(pool, tenants.a, "d-finish")
    [held] = await leases.claim(pool, "holder", task_types=["d-finish"])
    assert held.lease is not None
    lease = held.lease
    # Positive control, before the deadline: the holder reserves.
    early = await operations.reserve(
        pool, tenants.a, task.id, "d-1", "charge", {"n": 1}, lease=lease
    )
    assert early.fresh
    await _passed(admin_conn, task.id)
    for to_state in ("succeeded", "failed", "pending", "running"):
        with pytest.raises(DeadlineExceeded) as refused:
            await tasks.transition(
                pool, tenants.a, task.id, expected_version=held.state_version,
                to_state=to_state, lease=lease,
            )  # fmt: skip
        assert refused.value.guarantee == "G21"
    with pytest.raises(DeadlineExceeded):
        await leases.release(pool, lease)
    with pytest.raises(DeadlineExceeded):  # not even kept alive by a heartbeat
        await leases.renew(pool, lease)
    with pytest.raises(DeadlineExceeded):  # no new effect starts for a late task
        await operations.reserve(pool, tenants.a, task.id, "d-2", "charge", {"n": 2}, lease=lease)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "running"

    await leases.expire_deadlines(pool)  # the sweep takes the lease with it
    with pytest.raises(PastDeadline) as renewed:
        await leases.renew(pool, lease)
    assert isinstance(renewed.value, LeaseLost)
    assert renewed.value.guarantee == "G21"
    with pytest.raises(PastDeadline):
        await operations.complete(pool, early.operation, result={"ok": True}, lease=lease)
    # What was reserved in time stays in the ledger, to be reconciled without a lease.
    assert (await operations.complete(pool, early.operation, result={"ok": 1})).state == (
        "succeeded"
    )
    last = (await _events(admin_conn, task.id))[-1]
    assert (last["event_type"], last["from_state"]) == ("task.deadline_passed", "running")
    assert json.loads(last["payload"])["lease_owner"] == "holder"


async def test_G21_a_cancel_still_ends_a_late_task(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await _soon(pool, tenants.a, "d-cancel")
    await _passed(admin_conn, task.id)
    assert (await tasks.cancel(pool, tenants.a, task.id)).state == "cancelled"
    assert await leases.expire_deadlines(pool) == []


async def test_G21_the_worker_sweeps_a_late_task_and_stops_its_handler(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    stopped = asyncio.Event()

    async def handler(job: Job) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    task = await _soon(pool, tenants.a, "d-worker", lease_ttl=timedelta(seconds=1))
    worker = Worker(pool, {"d-worker": handler}, poll_interval=0.05, maintenance_interval=0.1)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(stopped.wait(), 20)
        await F.until(lambda: worker.stats.past_deadline == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert (worker.stats.succeeded, worker.stats.failed) == (0, 0)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "dead"
    assert [e["event_type"] for e in await _events(admin_conn, task.id)] == [
        "task.created", "task.claimed", "task.deadline_passed",
    ]  # fmt: skip


async def test_G21_a_handler_that_returns_after_the_deadline_writes_nothing_and_the_task_dies(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async def handler(job: Job) -> Succeed:
        await _passed(admin_conn, job.task.id)
        return Succeed()

    task = await _soon(pool, tenants.a, "d-late")
    # Maintenance runs once at start and then not for an hour: the refusal, not the
    # periodic sweep, is what ends this task.
    worker = Worker(pool, {"d-late": handler}, poll_interval=0.05, maintenance_interval=3600)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await F.until(lambda: worker.stats.late_writes_refused == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert worker.stats.succeeded == 0
    assert (await tasks.get(pool, tenants.a, task.id)).state == "dead"
    types = [e["event_type"] for e in await _events(admin_conn, task.id)]
    assert types == ["task.created", "task.claimed", "task.deadline_passed"]


async def test_G21_a_late_task_in_a_batched_finish_is_refused_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    late = await _soon(pool, tenants.a, "d-batch")
    await tasks.create(pool, tenants.a, "d-batch", deadline=datetime.now(UTC) + timedelta(hours=1))
    held = await leases.claim(pool, "w", batch=10, task_types=["d-batch"])
    assert len(held) == 2
    await _passed(admin_conn, late.id)
    results = await tasks.finish_many(pool, held)
    by_id = dict(zip([t.id for t in held], results, strict=True))
    assert isinstance(by_id[late.id], DeadlineExceeded)
    [on_time] = [r for tid, r in by_id.items() if tid != late.id]
    assert isinstance(on_time, Task)
    assert on_time.state == "succeeded"  # the rest of the batch committed
    assert (await tasks.get(pool, tenants.a, late.id)).state == "running"  # for the sweep


async def test_G21_a_tenant_whose_due_work_is_all_late_takes_no_turn_of_the_claim(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The claim's walk over tenants skips late tasks: a claim of one task that reaches the
    late tenant first still finds the other tenant's work (counted as a tenant with due
    work, the late one would use the claim's only turn and give nothing)."""
    late = await _soon(pool, tenants.a, "d-walk")
    other = await tasks.create(pool, tenants.b, "d-walk")
    await _passed(admin_conn, late.id)
    # The walk starts after `after`: put the late tenant first in its order.
    after = None if tenants.a < tenants.b else tenants.b
    got = await leases.claim(pool, "w", batch=1, task_types=["d-walk"], after_tenant=after)
    assert [t.id for t in got] == [other.id]
    assert (await tasks.get(pool, tenants.a, late.id)).state == "pending"


async def test_G21_a_late_task_under_an_expired_lease_is_not_taken_over(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Recovery of expired leases skips late tasks too: the sweep ends them instead."""
    task = await _soon(pool, tenants.a, "d-recover")
    assert await leases.claim(pool, "gone", task_types=["d-recover"])
    await F.expire_lease(admin_conn, task.id)  # the holder died, before the deadline
    await _passed(admin_conn, task.id)
    assert await leases.claim(pool, "rescuer", task_types=["d-recover"]) == []
    assert await leases.expire_deadlines(pool) == [(tenants.a, task.id)]
