"""Cancellation (G20): final for every writer, seen by the holder, never undoing a finish.

The raw-SQL attacks on the triggers are in tests/test_attacks.py; here the
runtime: the holder's writes after a cancel, the worker that stops its
handler, and cancels racing a completion or a reservation on separate
connections, interleaved by lock waits observed in the server.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import asyncpg
import pytest

from agentdb import leases, operations, tasks
from agentdb.errors import Cancelled, LeaseLost, NotFound, TaskFinished
from agentdb.models import Lease, Task
from agentdb.worker import Job, Worker
from tests import factories as F
from tests.conftest import Tenants


async def _task_events(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[asyncpg.Record]:
    return await admin.fetch(
        "SELECT event_type, from_state, to_state, actor_id, payload FROM agent_events"
        " WHERE task_id = $1 AND task_state_version IS NOT NULL ORDER BY task_state_version",
        task_id,
    )


async def _claimed(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str) -> tuple[Task, Lease]:
    task = await tasks.create(pool, tenant, task_type)
    [held] = await leases.claim(pool, "holder", task_types=[task_type])
    assert held.id == task.id
    assert held.lease is not None
    return held, held.lease


@pytest.mark.parametrize("state", ["pending", "waiting", "running"])
async def test_G20_cancel_moves_an_unfinished_task_to_cancelled_with_its_event(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, state: str
) -> None:
    task = await tasks.create(pool, tenants.a, f"c-{state}", waiting=state == "waiting")
    if state == "running":
        assert await leases.claim(pool, "holder", task_types=[f"c-{state}"])
    before = await tasks.get(pool, tenants.a, task.id)
    assert before.state == state

    done = await tasks.cancel(pool, tenants.a, task.id, reason="customer asked", actor="ops")

    assert (done.state, done.state_version, done.lease_owner) == (
        "cancelled", before.state_version + 1, None,
    )  # fmt: skip
    assert done.last_error == "cancelled: customer asked"
    last = (await _task_events(admin_conn, task.id))[-1]
    assert (last["event_type"], last["from_state"], last["to_state"], last["actor_id"]) == (
        "task.cancelled", state, "cancelled", "ops",
    )  # fmt: skip
    assert json.loads(last["payload"]) == {
        "reason": "customer asked",
        "from_state": state,
        "lease_owner": "holder" if state == "running" else None,
    }


async def test_G20_cancelling_twice_or_after_a_finish_writes_nothing(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    held, lease = await _claimed(pool, tenants.a, "c-finished")
    finished = await tasks.transition(
        pool, tenants.a, held.id, expected_version=held.state_version, to_state="succeeded",
        lease=lease,
    )  # fmt: skip
    n = len(await _task_events(admin_conn, held.id))
    after = await tasks.cancel(pool, tenants.a, held.id)
    assert (after.state, after.state_version) == ("succeeded", finished.state_version)
    assert len(await _task_events(admin_conn, held.id)) == n  # a cancel never undoes a finish

    other = await tasks.create(pool, tenants.a, "c-twice")
    first = await tasks.cancel(pool, tenants.a, other.id)
    again = await tasks.cancel(pool, tenants.a, other.id)
    assert (again.state, again.state_version) == ("cancelled", first.state_version)
    assert [e["event_type"] for e in await _task_events(admin_conn, other.id)] == [
        "task.created", "task.cancelled",
    ]  # fmt: skip


async def test_G20_cancel_is_scoped_to_the_tenant(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await tasks.create(pool, tenants.a, "c-scope")
    with pytest.raises(NotFound):
        await tasks.cancel(pool, tenants.b, task.id)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "pending"


async def test_G20_the_holders_renew_reserve_settle_and_finish_are_refused_as_cancelled(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    held, lease = await _claimed(pool, tenants.a, "c-holder")
    # Positive control: under its lease the holder renews and reserves.
    lease = await leases.renew(pool, lease)
    first = await operations.reserve(
        pool, tenants.a, held.id, "c-1", "charge", {"n": 1}, lease=lease
    )
    assert first.fresh

    await tasks.cancel(pool, tenants.a, held.id, reason="stop")

    with pytest.raises(Cancelled) as renewed:
        await leases.renew(pool, lease)
    assert isinstance(renewed.value, LeaseLost)
    assert renewed.value.guarantee == "G20"
    with pytest.raises(Cancelled):
        await operations.reserve(pool, tenants.a, held.id, "c-2", "charge", {"n": 2}, lease=lease)
    with pytest.raises(Cancelled):
        await operations.complete(pool, first.operation, result={"ok": True}, lease=lease)
    with pytest.raises(Cancelled):
        await tasks.transition(
            pool, tenants.a, held.id, expected_version=held.state_version, to_state="succeeded",
            lease=lease,
        )  # fmt: skip
    # Without a lease, no writer reserves for it either: the database refuses (AG012).
    with pytest.raises(TaskFinished):
        await operations.reserve(pool, tenants.a, held.id, "c-3", "charge", {"n": 3})
    keys = await admin_conn.fetch(
        "SELECT idempotency_key, state FROM agent_operations WHERE task_id = $1", held.id
    )
    # What was reserved before the cancel stays in the ledger, and can be reconciled.
    assert [(r["idempotency_key"], r["state"]) for r in keys] == [("c-1", "reserved")]
    settled = await operations.complete(pool, first.operation, result={"found": "at provider"})
    assert settled.state == "succeeded"
    assert (await tasks.get(pool, tenants.a, held.id)).state == "cancelled"


async def test_G20_a_worker_stops_the_handler_of_a_cancelled_task_and_writes_nothing_more(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    reserved = asyncio.Event()
    stopped = asyncio.Event()

    async def handler(job: Job) -> None:
        await job.reserve("w-1", "charge", {"n": 1})
        reserved.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    task = await tasks.create(pool, tenants.a, "c-worker", lease_ttl=timedelta(seconds=1))
    worker = Worker(pool, {"c-worker": handler}, poll_interval=0.05)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(reserved.wait(), 20)
        await tasks.cancel(pool, tenants.a, task.id, reason="user")
        await asyncio.wait_for(stopped.wait(), 20)  # at the next heartbeat (TTL/3)
        await F.until(lambda: worker.stats.cancelled == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert (worker.stats.cancelled, worker.stats.succeeded, worker.stats.failed) == (1, 0, 0)
    events = await _task_events(admin_conn, task.id)
    assert [e["event_type"] for e in events][-1] == "task.cancelled"  # nothing after it
    [op] = await admin_conn.fetch("SELECT state FROM agent_operations WHERE task_id = $1", task.id)
    # Stopped mid-call: whether the provider acted is not known - left for reconcile,
    # marked so, not made to disappear (nobody will take this task over to find out).
    assert op["state"] == "unknown"
    assert (await tasks.get(pool, tenants.a, task.id)).state == "cancelled"


async def test_G20_an_outcome_learned_after_the_cancel_is_still_recorded(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The handler's provider call returns after the cancel: its result is written (without
    the lease, which went with the cancel) and the handler is told it was cancelled."""
    reserved = asyncio.Event()
    go_on = asyncio.Event()
    told: list[BaseException] = []

    async def handler(job: Job) -> None:
        res = await job.reserve("w-2", "charge", {"n": 2})
        reserved.set()
        await go_on.wait()  # the provider answers after the cancel
        try:
            await job.complete(res.operation, result={"charged": 2}, provider_reference="p-2")
        except Cancelled as exc:
            told.append(exc)
            raise

    task = await tasks.create(pool, tenants.a, "c-late-result", lease_ttl=timedelta(minutes=5))
    worker = Worker(pool, {"c-late-result": handler}, poll_interval=0.05)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(reserved.wait(), 20)
        await tasks.cancel(pool, tenants.a, task.id)
        go_on.set()  # the heartbeat (100 s away) cannot have noticed
        await F.until(lambda: worker.stats.cancelled == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert len(told) == 1
    [op] = await admin_conn.fetch(
        "SELECT state, provider_reference FROM agent_operations WHERE task_id = $1", task.id
    )
    assert (op["state"], op["provider_reference"]) == ("succeeded", "p-2")
    assert (await tasks.get(pool, tenants.a, task.id)).state == "cancelled"


async def test_G20_a_completion_that_locks_first_wins_over_a_cancel(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    runtime_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
) -> None:
    held, lease = await _claimed(pool, tenants.a, "c-race-1")
    async with runtime_conn.transaction():
        await tasks.transition(
            runtime_conn, tenants.a, held.id, expected_version=held.state_version,
            to_state="succeeded", lease=lease,
        )  # fmt: skip
        cancel = asyncio.create_task(tasks.cancel(other_conn, tenants.a, held.id))
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    outcome = await asyncio.wait_for(cancel, 20)
    assert outcome.state == "succeeded"
    assert [e["event_type"] for e in await _task_events(admin_conn, held.id)] == [
        "task.created", "task.claimed", "task.succeeded",
    ]  # fmt: skip


async def test_G20_a_cancel_that_locks_first_wins_over_a_completion(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    runtime_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
) -> None:
    held, lease = await _claimed(pool, tenants.a, "c-race-2")
    async with runtime_conn.transaction():
        await tasks.cancel(runtime_conn, tenants.a, held.id, reason="first")
        finish = asyncio.create_task(
            tasks.transition(
                other_conn, tenants.a, held.id, expected_version=held.state_version,
                to_state="succeeded", lease=lease,
            )
        )  # fmt: skip
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    with pytest.raises(Cancelled):
        await asyncio.wait_for(finish, 20)
    assert [e["event_type"] for e in await _task_events(admin_conn, held.id)] == [
        "task.created", "task.claimed", "task.cancelled",
    ]  # fmt: skip


async def test_G20_a_raw_reservation_waits_for_a_cancel_in_progress_and_is_refused(
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    runtime_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
) -> None:
    """The guard locks the task row: a reservation that read the task before the cancel
    committed would otherwise slip in after it."""
    task_id = await F.create_task(runtime_conn, tenants.a)
    async with runtime_conn.transaction():
        await tasks.cancel(runtime_conn, tenants.a, task_id)
        reserve = asyncio.create_task(F.create_operation(other_conn, tenants.a, task_id))
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    with pytest.raises(asyncpg.PostgresError) as refused:
        await asyncio.wait_for(reserve, 20)
    assert refused.value.sqlstate == "AG012"
    # Control: the same reservation, locked first, lands before the cancel and stays.
    open_id = await F.create_task(runtime_conn, tenants.a)
    async with runtime_conn.transaction():
        op_id = await F.create_operation(runtime_conn, tenants.a, open_id)
        cancel = asyncio.create_task(tasks.cancel(other_conn, tenants.a, open_id))
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    assert (await asyncio.wait_for(cancel, 20)).state == "cancelled"
    state = await admin_conn.fetchval("SELECT state FROM agent_operations WHERE id = $1", op_id)
    assert state == "reserved"


async def test_G20_cancel_retries_when_the_task_moves_on_in_between(
    pool: asyncpg.Pool, tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step recorded between the cancel's read and its write: the cancel reads again."""
    held, lease = await _claimed(pool, tenants.a, "c-step")
    original = tasks.get
    steps: list[int] = []

    async def get_then_step(db: object, tenant: uuid.UUID, task_id: uuid.UUID) -> Task:
        seen = await original(pool, tenant, task_id)
        if not steps:
            moved = await tasks.transition(
                pool, tenant, task_id, expected_version=seen.state_version,
                to_state="running", step="half-way", lease=lease,
            )  # fmt: skip
            steps.append(moved.state_version)
        return seen

    monkeypatch.setattr(tasks, "get", get_then_step)
    done = await tasks.cancel(pool, tenants.a, held.id)
    assert steps == [held.state_version + 1]
    assert (done.state, done.state_version) == ("cancelled", held.state_version + 2)


async def test_G20_a_holder_taken_over_before_the_cancel_only_lost_its_lease(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Only the holder the cancel took the task from is told Cancelled (and may record what
    it learned); one whose lease another worker had taken over first writes nothing (G12)."""
    held, stale = await _claimed(pool, tenants.a, "c-takeover")
    res = await operations.reserve(pool, tenants.a, held.id, "t-1", "charge", {"n": 1}, lease=stale)
    await F.expire_lease(admin_conn, held.id)
    [again] = await leases.claim(pool, "rescuer", task_types=["c-takeover"])
    assert again.lease is not None
    assert again.lease.token == stale.token + 1
    await tasks.cancel(pool, tenants.a, held.id)
    with pytest.raises(LeaseLost) as refused:
        await operations.complete(pool, res.operation, result={"late": True}, lease=stale)
    assert not isinstance(refused.value, Cancelled)
    with pytest.raises(Cancelled):  # the control: the holder the cancel took it from
        await leases.renew(pool, again.lease)
    state = await admin_conn.fetchval(
        "SELECT state FROM agent_operations WHERE id = $1", res.operation.id
    )
    assert state == "reserved"
