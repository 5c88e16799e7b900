"""Fences that only a precise attacker tests: same-owner stale holders, same-state stale
versions, rows held locked while another claims, and statements that lose a race.

Each test isolates one predicate: the other predicates of the statement would let
the write through, so only the one under test can refuse it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from asyncpg.transaction import Transaction

from agentdb import leases, operations, outbox, signals, tasks
from agentdb.errors import (
    LeaseLost,
    OperationInFlight,
    OutboxLeaseLost,
    SignalRuleViolation,
    StaleVersion,
)
from agentdb.models import Lease, OutboxMessage, Task
from agentdb.operations import Completion, ReserveRequest
from agentdb.worker import Job, Worker
from tests import factories as F
from tests.conftest import RUNTIME, Database, Tenants
from tests.test_worker import (
    _until,
    asyncio_errors,  # noqa: F401 - autouse: guards these tests too
    running,
)

OWNER = "worker-on-host-1"  # a restarted worker reusing its id: the owner alone fences nothing


async def _row(admin: asyncpg.Connection, table: str, row_id: uuid.UUID) -> asyncpg.Record:
    row = await admin.fetchrow(f"SELECT * FROM {table} WHERE id = $1", row_id)  # noqa: S608
    assert row is not None
    return row


async def _events(admin: asyncpg.Connection, task_id: uuid.UUID) -> int:
    n: int = await admin.fetchval("SELECT count(*) FROM agent_events WHERE task_id = $1", task_id)
    return n


async def _reclaimed_by_same_owner(
    pool: asyncpg.Pool, admin: asyncpg.Connection, tenant: uuid.UUID
) -> tuple[Task, Task]:
    """(the stale claim, the current claim) of one task, both by OWNER: tokens 1 and 2."""
    await tasks.create(pool, tenant, "t")
    [stale] = await leases.claim(pool, OWNER)
    await F.expire_lease(admin, stale.id)
    [current] = await leases.claim(pool, OWNER)
    assert (current.id, current.lease_owner, stale.lease_token, current.lease_token) == (
        stale.id,
        OWNER,
        1,
        2,
    )
    return stale, current


def _lease(task: Task) -> Lease:
    assert task.lease is not None
    return task.lease


async def test_G12_a_stale_holder_with_the_same_owner_name_is_fenced_by_its_token(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    stale, current = await _reclaimed_by_same_owner(pool, admin_conn, tenants.a)
    old = _lease(stale)
    res = await operations.reserve(
        pool, tenants.a, current.id, "k1", "send", {"x": 1}, lease=_lease(current)
    )
    before = await _row(admin_conn, "agent_tasks", current.id)
    op_before = await _row(admin_conn, "agent_operations", res.operation.id)
    events = await _events(admin_conn, current.id)

    with pytest.raises(LeaseLost) as lost:
        await leases.renew(pool, old)
    assert (lost.value.token, lost.value.current_token) == (1, 2)
    with pytest.raises(LeaseLost):
        await leases.release(pool, old)
    # The stale holder even knows the current version: only its token refuses it.
    with pytest.raises(LeaseLost):
        await tasks.transition(
            pool,
            tenants.a,
            current.id,
            expected_version=current.state_version,
            to_state="succeeded",
            lease=old,
        )
    with pytest.raises(LeaseLost):
        await operations.reserve(pool, tenants.a, current.id, "k2", "send", {"x": 2}, lease=old)
    with pytest.raises(LeaseLost):
        await operations.complete(pool, res.operation, result={"ok": 1}, lease=old)
    with pytest.raises(LeaseLost):
        await operations.mark_unknown(pool, res.operation, lease=old)

    assert await _row(admin_conn, "agent_tasks", current.id) == before
    assert await _row(admin_conn, "agent_operations", res.operation.id) == op_before
    assert await _events(admin_conn, current.id) == events
    # Positive control: the current holder's writes land.
    done = await operations.complete(pool, res.operation, result={"ok": 1}, lease=_lease(current))
    assert done.state == "succeeded"


async def test_G12_a_worker_stops_the_attempt_a_same_owner_restart_took_over(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Blind class of issue 35: what the holder taken over from may no longer do. A
    worker stalled past its lease; a restart under the same worker id took the task over
    (token 2). The lease watch finds the task still under the worker's name - only the
    token says the lease is no longer this attempt's - and stops the stale handler long
    before its heartbeat (a third of a 30-minute lease) would. Kills
    reclaim-watch-by-owner-only."""
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def handler(job: Job) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    task = await tasks.create(pool, tenants.a, "t", lease_ttl=timedelta(minutes=30))
    # One slot, held by the stalled attempt: the worker cannot take the task over itself.
    stale = Worker(pool, {"t": handler}, worker_id=OWNER, poll_interval=0.05, concurrency=1)
    async with running(stale):
        await asyncio.wait_for(started.wait(), 10)
        await F.expire_lease(admin_conn, task.id)
        [current] = await leases.claim(pool, OWNER)
        assert (current.id, current.lease_token) == (task.id, 2)
        await asyncio.wait_for(stopped.wait(), 20)
        await _until(lambda: _lease_lost(stale))
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.lease_owner, now.lease_token) == ("running", OWNER, 2)
    assert (stale.stats.succeeded, stale.stats.released_unfinished) == (0, 0)
    events = await admin_conn.fetch(
        "SELECT event_type FROM agent_events WHERE task_id = $1 ORDER BY id", task.id
    )
    assert [e["event_type"] for e in events] == ["task.created", "task.claimed", "task.reclaimed"]


async def _lease_lost(worker: Worker) -> bool:
    return worker.stats.lease_lost == 1


async def test_G12_batches_fence_a_same_owner_stale_holder_by_its_token(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    stale, current = await _reclaimed_by_same_owner(pool, admin_conn, tenants.a)
    res = await operations.reserve(
        pool, tenants.a, current.id, "k1", "send", {"x": 1}, lease=_lease(current)
    )
    before = await _row(admin_conn, "agent_tasks", current.id)
    op_before = await _row(admin_conn, "agent_operations", res.operation.id)
    # The current row, as re-read by the stale holder, with the lease it was granted.
    stale_view = dataclasses.replace(current, lease_token=stale.lease_token)

    [unfinished] = await tasks.finish_many(pool, [stale_view])
    assert isinstance(unfinished, LeaseLost)
    [unreserved] = await operations.reserve_many(
        pool, [ReserveRequest(_lease(stale), "k2", "send", {"x": 2})]
    )
    assert isinstance(unreserved, LeaseLost)
    [unsettled] = await operations.complete_many(
        pool, [Completion(res.operation, result={"ok": 1}, lease=_lease(stale))]
    )
    assert isinstance(unsettled, LeaseLost)

    assert await _row(admin_conn, "agent_tasks", current.id) == before
    assert await _row(admin_conn, "agent_operations", res.operation.id) == op_before
    assert (
        await admin_conn.fetchval(
            "SELECT count(*) FROM agent_operations WHERE idempotency_key = 'k2'"
        )
        == 0
    )
    # Positive control: the same batches with the current lease land.
    [done] = await operations.complete_many(
        pool, [Completion(res.operation, result={"ok": 1}, lease=_lease(current))]
    )
    assert not isinstance(done, Exception)
    assert done.state == "succeeded"
    [finished] = await tasks.finish_many(pool, [current])
    assert isinstance(finished, Task)
    assert finished.state == "succeeded"


async def test_G22_a_holder_that_took_the_task_over_cannot_approve_it_once_its_lease_ended(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Blind class of issue 35: reclaim-then-act. The only record that the rescuer
    held the task is its take-over's event, ``task.reclaimed`` (not ``task.claimed``):
    once it waits, its lease gone, that event alone must refuse its approval. Kills
    gen-0006.control_flow-agentdb_guard_signal-list-6 (the guard reads claim events only)."""
    await tasks.create(pool, tenants.a, "t")
    [first] = await leases.claim(pool, "crashed-worker")
    await F.expire_lease(admin_conn, first.id)
    [rescued] = await leases.claim(pool, "rescuer")
    assert (rescued.id, rescued.lease_token) == (first.id, 2)
    assert (
        await admin_conn.fetchval(
            "SELECT event_type FROM agent_events WHERE task_id = $1 AND actor_id = 'rescuer'",
            rescued.id,
        )
        == "task.reclaimed"
    )
    waiting = await tasks.wait_for_signal(pool, rescued, "approval", lease=_lease(rescued))
    assert (waiting.state, waiting.lease_owner) == ("waiting", None)

    for holder in ("rescuer", "crashed-worker"):
        with pytest.raises(SignalRuleViolation) as refused:
            await signals.approve(pool, tenants.a, rescued.id, approver=holder)
        assert refused.value.sqlstate == "AG014"
    assert (await tasks.get(pool, tenants.a, rescued.id)).state == "waiting"
    # Control: a reviewer who never held it approves, and the task wakes.
    await signals.approve(pool, tenants.a, rescued.id, approver="reviewer")
    assert (await tasks.get(pool, tenants.a, rescued.id)).state == "pending"


async def test_G7_a_stale_operation_version_is_refused_while_the_state_still_fits(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """reserved (v0) -> in_flight (v1): both are states complete starts from, so only the
    version can refuse the v0 copy."""
    task = await tasks.create(pool, tenants.a, "t")
    res = await operations.reserve(pool, tenants.a, task.id, "k", "send", {"x": 1})
    started = await operations.start(pool, res.operation)
    assert (started.state, started.state_version) == ("in_flight", 1)
    before = await _row(admin_conn, "agent_operations", started.id)

    with pytest.raises(StaleVersion) as stale:
        await operations.complete(pool, res.operation, result={"late": True})
    assert (stale.value.expected, stale.value.actual) == (0, 1)
    [refused] = await operations.complete_many(pool, [Completion(res.operation, result={"x": 1})])
    assert isinstance(refused, StaleVersion)
    assert await _row(admin_conn, "agent_operations", started.id) == before

    done = await operations.complete(pool, started, result={"ok": True})
    assert done.state_version == 2
    # Settling the succeeded operation again at its current version: its state refuses it.
    with pytest.raises(StaleVersion):
        await operations.complete(pool, done, result={"overwritten": True})
    assert (await operations.get(pool, tenants.a, done.id)).result == {"ok": True}


async def test_G7_a_stale_task_version_is_refused_while_the_state_and_lease_still_fit(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w")
    stepped = await tasks.transition(
        pool,
        tenants.a,
        claimed.id,
        expected_version=claimed.state_version,
        to_state="running",
        step="fetch",
        lease=_lease(claimed),
    )
    assert (stepped.state, stepped.state_version) == ("running", claimed.state_version + 1)
    before = await _row(admin_conn, "agent_tasks", claimed.id)

    with pytest.raises(StaleVersion):
        await tasks.transition(
            pool,
            tenants.a,
            claimed.id,
            expected_version=claimed.state_version,
            to_state="succeeded",
            lease=_lease(claimed),
        )
    [refused] = await tasks.finish_many(pool, [claimed])
    assert isinstance(refused, StaleVersion)
    assert await _row(admin_conn, "agent_tasks", claimed.id) == before
    [done] = await tasks.finish_many(pool, [stepped])
    assert isinstance(done, Task)
    assert done.state == "succeeded"


@pytest.fixture
async def locker(db: Database) -> AsyncIterator[asyncpg.Connection]:
    conn = await db.connect(RUNTIME)
    yield conn
    await conn.close()


@pytest.fixture
async def impatient(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A claimer that would rather fail than wait: a blocked claim raises, never hangs."""
    conn = await db.connect(RUNTIME)
    await conn.execute("SET lock_timeout = '2s'")
    yield conn
    await conn.close()


async def _hold(
    locker: asyncpg.Connection, table: str, tenant: uuid.UUID, row_id: uuid.UUID
) -> Transaction:
    tx = locker.transaction()
    await tx.start()
    # Names the tenant: on Citus a row lock must route to one shard.
    await locker.execute(
        f"SELECT 1 FROM {table} WHERE tenant_id = $1 AND id = $2 FOR UPDATE",  # noqa: S608
        tenant,
        row_id,
    )
    return tx


async def test_G12_a_claim_skips_a_due_task_another_transaction_holds_locked(
    pool: asyncpg.Pool,
    tenants: Tenants,
    locker: asyncpg.Connection,
    impatient: asyncpg.Connection,
) -> None:
    now = datetime.now(UTC)
    first = await tasks.create(pool, tenants.a, "t", wake_at=now - timedelta(minutes=2))
    second = await tasks.create(pool, tenants.a, "t", wake_at=now - timedelta(minutes=1))
    tx = await _hold(locker, "agent_tasks", tenants.a, first.id)
    try:
        claimed = await leases.claim(impatient, "w", batch=1)
    finally:
        await tx.rollback()
    assert [t.id for t in claimed] == [second.id]
    # Control: unlocked, the older one is first in line.
    [again] = await leases.claim(impatient, "w2", batch=1)
    assert again.id == first.id


async def test_G12_a_claim_skips_an_expired_lease_another_transaction_holds_locked(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    locker: asyncpg.Connection,
    impatient: asyncpg.Connection,
) -> None:
    for _ in range(2):
        await tasks.create(pool, tenants.a, "t")
    held = await leases.claim(pool, "dead-worker", batch=2)
    for t in held:
        await F.expire_lease(admin_conn, t.id)
    order = await admin_conn.fetch(
        "SELECT id FROM agent_tasks WHERE tenant_id = $1 ORDER BY lease_expires_at", tenants.a
    )
    oldest, other = order[0]["id"], order[1]["id"]
    tx = await _hold(locker, "agent_tasks", tenants.a, oldest)
    try:
        claimed = await leases.claim(impatient, "w", batch=1)
    finally:
        await tx.rollback()
    assert [(t.id, t.lease_token) for t in claimed] == [(other, 2)]


async def _claim_past_a_locked_message(
    tenant: uuid.UUID,
    runtime_conn: asyncpg.Connection,
    locker: asyncpg.Connection,
    claim: Callable[[], Awaitable[list[OutboxMessage]]],
) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """Two due messages, the older one row-locked by ``locker``'s open transaction:
    ``claim()``'s ids (its connection would time out waiting for the lock), and the
    younger message's id."""
    first = await outbox.enqueue(runtime_conn, tenant, "t", {"n": 1})
    second = await outbox.enqueue(runtime_conn, tenant, "t", {"n": 2})
    await runtime_conn.execute(
        "UPDATE agent_outbox SET next_attempt_at = now() - interval '1 minute' WHERE id = $1",
        first,
    )
    tx = await _hold(locker, "agent_outbox", tenant, first)
    try:
        claimed = await claim()
    finally:
        await tx.rollback()
    return second, [m.id for m in claimed]


async def test_G10_a_relay_skips_a_message_another_transaction_holds_locked(
    pool: asyncpg.Pool,
    tenants: Tenants,
    runtime_conn: asyncpg.Connection,
    locker: asyncpg.Connection,
    impatient: asyncpg.Connection,
) -> None:
    async def claim() -> list[OutboxMessage]:
        return await outbox.claim(impatient, "relay-1", batch=1)

    second, claimed = await _claim_past_a_locked_message(tenants.a, runtime_conn, locker, claim)
    assert claimed == [second]


async def test_G10_a_relay_marking_and_claiming_skips_a_message_another_transaction_holds(
    pool: asyncpg.Pool,
    tenants: Tenants,
    runtime_conn: asyncpg.Connection,
    locker: asyncpg.Connection,
    impatient: asyncpg.Connection,
) -> None:
    """outbox.deliver_and_claim's claim skips a locked due message, as outbox.claim does."""

    async def claim() -> list[OutboxMessage]:
        marked, claimed = await outbox.deliver_and_claim(impatient, "relay-1", [], batch=1)
        assert marked == set()
        return claimed

    second, claimed = await _claim_past_a_locked_message(tenants.a, runtime_conn, locker, claim)
    assert claimed == [second]


async def test_G12_a_live_lease_and_a_future_wake_up_are_not_claimed(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await tasks.create(pool, tenants.a, "t", wake_at=datetime.now(UTC) + timedelta(hours=1))
    await tasks.create(pool, tenants.a, "t")
    [held] = await leases.claim(pool, "w1", lease_ttl=timedelta(minutes=5))
    assert await leases.claim(pool, "w2", batch=5) == []
    assert held.lease_token == 1


async def test_G12_a_claim_takes_over_only_expired_leases_of_the_types_it_asked_for(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Blind class of issue 35: reclaim-then-act. A take-over is a claim like any other: a
    worker that runs only type 't' must not rescue an expired 'other' it has no handler
    for (it could only give it back, an attempt spent). Nothing else is due, so only the
    expired lease's own type filter can refuse it. Kills gen-leases-lease_claim-and-27."""
    await tasks.create(pool, tenants.a, "other")
    [stalled] = await leases.claim(pool, "w-other", task_types=["other"])
    await F.expire_lease(admin_conn, stalled.id)
    assert await leases.claim(pool, "w-t", batch=5, task_types=["t"]) == []
    now = await tasks.get(pool, tenants.a, stalled.id)
    assert (now.lease_owner, now.lease_token, now.attempts) == ("w-other", 1, 1)
    # Control: a worker for 'other' takes it over.
    [rescued] = await leases.claim(pool, "w-other-2", task_types=["other"])
    assert (rescued.id, rescued.lease_token, rescued.attempts) == (stalled.id, 2, 2)


async def test_G10_a_relay_that_lost_its_claim_cannot_mark_it_failed_or_delivered_twice(
    pool: asyncpg.Pool, tenants: Tenants, runtime_conn: asyncpg.Connection
) -> None:
    mid = await outbox.enqueue(runtime_conn, tenants.a, "t", {"n": 1})
    [mine] = await outbox.claim(pool, "relay-1", visibility=timedelta(seconds=30))
    # Its visibility ran out; another relay claimed the message.
    await runtime_conn.execute("UPDATE agent_outbox SET next_attempt_at = now() WHERE id = $1", mid)
    [theirs] = await outbox.claim(pool, "relay-2")
    assert (mine.lease_token, theirs.lease_token) == (1, 2)
    before = await runtime_conn.fetchrow("SELECT * FROM agent_outbox WHERE id = $1", mid)
    with pytest.raises(OutboxLeaseLost) as lost:
        await outbox.mark_failed(pool, mine, "late", backoff=timedelta(seconds=1))
    assert (lost.value.owner, lost.value.current_owner, lost.value.current_token) == (
        "relay-1",
        "relay-2",
        2,
    )
    assert lost.value.guarantee == "G10"
    assert await outbox.mark_delivered(pool, [mine]) == set()
    assert await runtime_conn.fetchrow("SELECT * FROM agent_outbox WHERE id = $1", mid) == before
    # The holder marks it once; a second mark finds nothing pending.
    assert await outbox.mark_delivered(pool, [theirs]) == {mid}
    assert await outbox.mark_delivered(pool, [theirs]) == set()


async def test_G3_G4_a_reserve_that_loses_the_race_to_a_concurrent_commit_answers_with_it(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The second reserve's INSERT waits on the first's uncommitted key, finds it taken, and
    its snapshot - taken before that commit - cannot see the row: only a second statement can."""
    task = await tasks.create(pool, tenants.a, "t")
    first = await db.connect(RUNTIME)
    second = await db.connect(RUNTIME)
    try:
        tx = first.transaction()
        await tx.start()
        mine = await operations.reserve(first, tenants.a, task.id, "k", "send", {"x": 1})
        racing = asyncio.create_task(
            operations.reserve(second, tenants.a, task.id, "k", "send", {"x": 1})
        )
        await F.wait_until_blocked(admin_conn, second.get_server_pid())
        await tx.commit()
        # The first attempt holds the key, unsettled: a distinct answer, never a second call.
        with pytest.raises(OperationInFlight) as busy:
            await racing
    finally:
        await first.close()
        await second.close()
    assert mine.fresh
    assert busy.value.operation.id == mine.operation.id


async def test_G3_G4_a_create_that_loses_the_race_to_a_concurrent_commit_answers_with_it(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    first = await db.connect(RUNTIME)
    second = await db.connect(RUNTIME)
    try:
        tx = first.transaction()
        await tx.start()
        mine = await tasks.create(first, tenants.a, "t", params={"n": 1}, dedupe_key="d")
        racing = asyncio.create_task(
            tasks.create(second, tenants.a, "t", params={"n": 1}, dedupe_key="d")
        )
        await F.wait_until_blocked(admin_conn, second.get_server_pid())
        await tx.commit()
        theirs = await racing
    finally:
        await first.close()
        await second.close()
    assert mine.created
    assert not theirs.created
    assert theirs.id == mine.id
