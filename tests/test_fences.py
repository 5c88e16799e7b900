"""Fences that only a precise attacker tests: same-owner stale holders, same-state stale
versions, rows held locked while another claims, and statements that lose a race.

Each test isolates one predicate: the other predicates of the statement would let
the write through, so only the one under test can refuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from asyncpg.transaction import Transaction

from agentdb import _explain, leases, operations, outbox, signals, tasks
from agentdb.errors import (
    DeadlineExceeded,
    LeaseLost,
    OperationInFlight,
    OutboxLeaseLost,
    SignalRuleViolation,
    StaleVersion,
)
from agentdb.models import Lease, OutboxMessage, Task
from agentdb.operations import Completion, ReserveRequest
from agentdb.worker import Job, Worker
from tests import _pg
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
    expired lease's own type filter can refuse it. Kills gen-leases-lease_claim-and-28."""
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


async def test_G7_a_refused_settle_reports_its_own_operation_s_state_not_a_sibling_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The explanation of a zero-row settle reads the operation it was asked about: a
    tenant's other operation, settled at another version, says nothing about it. Kills
    generated ``gen-_explain-explain_operation-and-1`` (the first operation of the tenant
    read instead)."""
    task = await tasks.create(pool, tenants.a, "t")
    other = (await operations.reserve(pool, tenants.a, task.id, "k0", "send", {})).operation
    await operations.complete(pool, await operations.start(pool, other), result={})
    res = await operations.reserve(pool, tenants.a, task.id, "k1", "send", {})
    started = await operations.start(pool, res.operation)
    with pytest.raises(StaleVersion) as stale:
        await operations.complete(pool, res.operation, result={})
    assert (stale.value.id, stale.value.actual, stale.value.actual_state) == (
        started.id,
        started.state_version,
        "in_flight",
    )


@contextlib.asynccontextmanager
async def _at_the_deadline(admin: asyncpg.Connection, *task_ids: uuid.UUID) -> AsyncIterator[None]:
    """A transaction, rolled back at the end, in which the tasks' deadline is its now(): a
    bare deadline write is no transition (agent_tasks_event_required would refuse it at
    commit), but every statement in between sees the instant itself."""
    tx = admin.transaction()
    await tx.start()
    try:
        await admin.execute(
            "UPDATE agent_tasks SET deadline_at = now(), state_version = state_version + 1"
            " WHERE id = ANY ($1::uuid[])",
            list(task_ids),
        )
        yield
    finally:
        await tx.rollback()


async def test_G21_a_deadline_that_falls_on_the_explaining_instant_has_passed(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A deadline passes at its instant: ``deadline_at <= now()``, as the deadline guard and
    the sweep say it. In one transaction, whose now() is the deadline itself, a write that
    matched no row is explained as the deadline, not as a stale version. Kills generated
    ``gen-_explain-explain_task-cmp-1`` (``<``: not late until after the instant)."""
    task = await tasks.create(pool, tenants.a, "t", deadline=datetime.now(UTC) + timedelta(hours=1))
    # Control: an hour before it, the same write is only stale.
    assert isinstance(
        await _explain.task_write(admin_conn, tenants.a, task.id, None, None), StaleVersion
    )
    async with _at_the_deadline(admin_conn, task.id):
        why = await _explain.task_write(admin_conn, tenants.a, task.id, None, None)
        assert isinstance(why, DeadlineExceeded), why


async def test_G22_a_signal_sent_beside_an_uncommitted_one_waits_and_takes_the_next_place(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task's signals are numbered under its row lock: a second sender waits for the
    first's commit, then counts it, and takes place 2 - it never computes place 1 again
    and fails on agent_signals_seq_key. Kills generated
    ``gen-0006.control_flow-agentdb_guard_signal-lock-1`` (the task read without
    ``FOR NO KEY UPDATE``: both count no signal, the second's insert waits on the first's
    key and then fails with a unique violation)."""
    task = await tasks.create(pool, tenants.a, "t")
    first = await db.connect(RUNTIME)
    second = await db.connect(RUNTIME)
    try:
        tx = first.transaction()
        await tx.start()
        mine = await tasks.signal(first, tenants.a, task.id, "one")
        racing = asyncio.create_task(tasks.signal(second, tenants.a, task.id, "two"))
        await F.wait_until_blocked(admin_conn, second.get_server_pid())
        await tx.commit()
        theirs = await racing
    finally:
        await first.close()
        await second.close()
    assert (mine.seq, theirs.seq) == (1, 2)
    assert [s.name for s in await signals.received(pool, tenants.a, task.id)] == ["one", "two"]


async def test_G12_G21_a_holder_whose_task_was_buried_is_told_lease_lost_not_past_deadline(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The explanation says PastDeadline only when the deadline sweep ended this very task:
    a task buried for its attempts (dead, its last holder's token kept) tells that holder
    LeaseLost - though another task of the tenant, and tenant b's task of the same id, were
    swept past their deadlines. Kills generated ``gen-_explain-explain_task-and-2`` (any
    event of the task taken for the sweep's), ``-cmp-4`` (another task's sweep) and
    ``-tenant-1`` (b's sweep of the same id)."""
    deadline = datetime.now(UTC) + timedelta(milliseconds=300)
    buried = await tasks.create(pool, tenants.a, "f-buried", max_attempts=1)
    late = await tasks.create(pool, tenants.a, "f-late", deadline=deadline)
    await tasks.create(pool, tenants.b, "f-late", deadline=deadline, task_id=buried.id)
    [held] = await leases.claim(pool, "holder", task_types=["f-buried"])
    assert held.lease is not None
    await F.expire_lease(admin_conn, buried.id, tenants.a)
    assert await leases.bury_exhausted(pool) == [(tenants.a, buried.id)]
    for _ in range(600):
        if await admin_conn.fetchval(
            "SELECT deadline_at < clock_timestamp() FROM agent_tasks WHERE id = $1", late.id
        ):
            break
        await asyncio.sleep(0.01)
    swept = await leases.expire_deadlines(pool)
    assert sorted(swept) == sorted([(tenants.a, late.id), (tenants.b, buried.id)])
    with pytest.raises(LeaseLost) as lost:
        await leases.renew(pool, held.lease)
    assert type(lost.value) is LeaseLost


async def _twins(
    pool: asyncpg.Pool, tenants: Tenants, b_state: str, a_state: str = "pending"
) -> uuid.UUID:
    """Tenant b's task, then tenant a's of the same id (ids are the caller's: create's
    ``task_id``), b's written first so that a read by id alone meets b's row first."""
    shared = uuid.uuid4()
    await tasks.create(pool, tenants.b, "twin-b", task_id=shared)
    if b_state != "pending":
        await tasks.transition(pool, tenants.b, shared, expected_version=0, to_state=b_state)
    await tasks.create(pool, tenants.a, "twin-a", task_id=shared)
    if a_state != "pending":
        await tasks.transition(pool, tenants.a, shared, expected_version=0, to_state=a_state)
    return shared


async def test_G2_G20_an_open_task_takes_effects_and_messages_though_its_twin_is_over(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The open-task guards of operations and outbox messages read the task of the row's
    own tenant: a's pending task takes an operation and a message though b's task of the
    same id is cancelled - and a's cancelled one takes neither though b's is pending. Kills
    generated ``gen-0006.control_flow-agentdb_guard_open_task-tenant-1`` and
    ``agentdb_guard_outbox_task-tenant-1`` (the task read by id alone)."""
    from agentdb.errors import TaskFinished

    open_a = await _twins(pool, tenants, b_state="cancelled")
    assert (await operations.reserve(pool, tenants.a, open_a, "k", "send", {})).fresh
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t.done", {}, task_id=open_a)
    over_a = await _twins(pool, tenants, b_state="pending", a_state="cancelled")
    with pytest.raises(TaskFinished):
        await operations.reserve(pool, tenants.a, over_a, "k-over", "send", {})
    async with pool.acquire() as conn:
        with pytest.raises(TaskFinished):
            await outbox.enqueue(conn, tenants.a, "t.done", {}, task_id=over_a)


async def test_G2_G25_a_step_takes_only_a_signal_its_own_task_was_sent(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A signal step names the signal it took by its place (``signal_seq``) in its own
    task's signals: tenant b's task of the same id has a signal 1, a's has none, and a raw
    step of a's claiming it is refused. Kills generated
    ``gen-0008.steps-agentdb_guard_step-tenant-2`` (the signal looked for by task id alone)."""
    shared = await _twins(pool, tenants, b_state="pending")
    await tasks.signal(pool, tenants.b, shared, "approval")
    [held] = await leases.claim(pool, "w", task_types=["twin-a"])
    assert held.lease is not None
    insert = (
        "INSERT INTO agent_steps (tenant_id, task_id, name, kind, state, input_hash, result,"
        " signal_seq, lease_token) VALUES ($1, $2, $3, 'signal', 'done', $4, '{}', $5, $6)"
    )
    args = (tenants.a, shared, "took", F.HASH)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await pool.execute(insert, *args, 1, held.lease.token)
    assert (refused.value.sqlstate, refused.value.constraint_name) == (
        "AG018",
        _pg.guard("agent_steps_guard"),
    )
    # Control: the same step, claiming no signal, is taken.
    await pool.execute(insert, *args, None, held.lease.token)


async def test_G21_G25_a_step_is_refused_at_its_task_s_deadline_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A deadline has passed at its instant: a step recorded in a transaction whose now()
    is the task's deadline is refused, as the task's own writes are. Kills generated
    ``gen-0008.steps-agentdb_guard_step-cmp-12`` (``<``: a step taken at the instant)."""
    task = await tasks.create(pool, tenants.a, "t", deadline=datetime.now(UTC) + timedelta(hours=1))
    [held] = await leases.claim(pool, "w", task_types=["t"])
    assert held.lease is not None
    async with _at_the_deadline(admin_conn, task.id):
        with pytest.raises(asyncpg.PostgresError) as refused:
            await admin_conn.execute(
                "INSERT INTO agent_steps (tenant_id, task_id, name, kind, input_hash, result,"
                " lease_token) VALUES ($1, $2, 'plan', 'step', $3, '{}', $4)",
                tenants.a, task.id, F.HASH, held.lease.token,
            )  # fmt: skip
        assert (refused.value.sqlstate, refused.value.constraint_name) == (
            "AG013",
            _pg.guard("agent_steps_guard"),
        )


async def test_G20_G22_a_succeeded_task_takes_no_more_signals(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Every finished state refuses a signal, succeeded included. Kills generated
    ``gen-0006.control_flow-agentdb_guard_signal-list-1`` ('succeeded' left out)."""
    from agentdb.errors import TaskFinished

    task = await tasks.create(pool, tenants.a, "t-done")
    [held] = await leases.claim(pool, "w", task_types=["t-done"])
    await tasks.transition(pool, tenants.a, task.id, expected_version=held.state_version,
                           to_state="succeeded", lease=held.lease)  # fmt: skip
    with pytest.raises(TaskFinished):
        await tasks.signal(pool, tenants.a, task.id, "approval")


async def test_G22_a_wait_is_cut_short_only_by_an_unread_signal_of_its_name_and_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A task that goes to sleep on "approval" is due at once only when an unread signal of
    that name is its own: an unread "note" of its own, and tenant b's "approval" to b's
    task of the same id, leave it asleep. Kills generated
    ``gen-0006.control_flow-agentdb_guard_signal_cursor-and-10`` (any unread signal) and
    ``-tenant-2`` (the twin's signal)."""
    shared = await _twins(pool, tenants, b_state="pending")
    await tasks.signal(pool, tenants.b, shared, "approval")
    await tasks.signal(pool, tenants.a, shared, "note")
    [held] = await leases.claim(pool, "w", task_types=["twin-a"])
    assert held.lease is not None
    asleep = await tasks.wait_for_signal(pool, held, "approval", lease=held.lease)
    assert asleep.state == "waiting"
    assert await leases.claim(pool, "w2", task_types=["twin-a"]) == []  # not due
    # Control: its own "approval", unread, makes the next wait due at once.
    await tasks.signal(pool, tenants.a, shared, "approval")
    assert await leases.claim(pool, "w2", task_types=["twin-a"])


async def test_G9_a_document_that_is_itself_a_secret_string_is_one(
    admin_conn: asyncpg.Connection,
) -> None:
    """A JSON document may be a bare string - a step's result can be - and that string may
    be a secret: no object or array around it says so. Kills generated
    ``gen-0001.foundation-agentdb_jsonb_has_secrets-cmp-3`` (only nodes that are not
    strings read as values: a secret in an object is still seen in the object's text, a
    bare one is not)."""
    check = "SELECT agentdb_jsonb_has_secrets($1::jsonb)"
    secret = '"sk-live-abcdefghijklmnopqrstuvwx"'
    assert await admin_conn.fetchval(check, secret) is True
    assert await admin_conn.fetchval(check, f'{{"reply": {secret}}}') is True
    assert await admin_conn.fetchval(check, '"sk-"') is False  # control: no key after it


async def test_G8_G12_a_heartbeat_needs_no_event_after_the_task_s_trail_was_purged(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A write that does not move the version (a lease renewal) owes no event: a task
    running for longer than its events are retained still renews its lease once they are
    purged. Kills generated ``gen-0004.events-agentdb_require_event-cmp-1`` (the early
    return never taken on an UPDATE: every write then looks for its version's event)."""
    task = await tasks.create(pool, tenants.a, "t-long")
    [held] = await leases.claim(pool, "w", task_types=["t-long"])
    assert held.lease is not None
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the append-only guard is off
        await admin_conn.execute(
            "UPDATE agent_events SET retain_until = now() - interval '1 day',"
            " payload_expires_at = now() - interval '1 day' WHERE task_id = $1",
            task.id,
        )
    assert await F.purge_every(admin_conn, "events", 1000, timedelta(0)) > 0
    renewed = await leases.renew(pool, held.lease)
    assert renewed.token == held.lease.token


async def test_G21_a_task_at_its_deadline_instant_is_neither_claimed_nor_walked_past(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """At the instant of its deadline a task has passed it: the claim neither takes it over
    from an expired lease nor lets it take the first tenant's turn in the walk - a claim of
    one, in the transaction whose now() is both deadlines, gives the next tenant's due task.
    Kills generated ``gen-leases-lease_claim-cmp-48`` (``>=``: the expired lease taken over,
    which the deadline guard then refuses) and ``-cmp-2`` (the late task counted: the batch
    spent on a tenant with nothing to give)."""
    first, second = sorted((tenants.a, tenants.b))
    later = datetime.now(UTC) + timedelta(hours=1)
    late = await tasks.create(pool, first, "t-late", deadline=later)
    due = await tasks.create(pool, second, "t-due")
    stuck = await tasks.create(pool, second, "t-stuck", deadline=later)
    await leases.claim(pool, "w-old", task_types=["t-stuck"])
    await F.expire_lease(admin_conn, stuck.id, second)
    async with _at_the_deadline(admin_conn, late.id, stuck.id):
        got = await leases.claim(admin_conn, "w", batch=1)
        assert [(t.tenant_id, t.id) for t in got] == [(second, due.id)]


async def test_G18_a_task_that_used_its_attempts_takes_no_tenant_s_turn(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A task its holder put back to pending on its last attempt is left to the bury: the
    walk does not count its tenant, and a claim of one gives the next tenant's due task.
    Kills generated ``gen-leases-lease_claim-cmp-4`` (``attempts <= max_attempts`` where
    the walk wraps around: the first tenant counted, nothing claimed)."""
    first, second = sorted((tenants.a, tenants.b))
    await tasks.create(pool, first, "t-spent", max_attempts=1)
    [held] = await leases.claim(pool, "w", task_types=["t-spent"])
    back = await tasks.transition(pool, first, held.id, expected_version=held.state_version,
                                  to_state="pending", lease=held.lease)  # fmt: skip
    assert (back.state, back.attempts, back.max_attempts) == ("pending", 1, 1)
    due = [await tasks.create(pool, second, "t-due") for _ in range(2)]
    # From the start, and wrapping around from the last tenant: both walks pass it by.
    for after, task in ((None, due[0]), (second, due[1])):
        got = await leases.claim(pool, "w", batch=1, after_tenant=after)
        assert [(t.tenant_id, t.id) for t in got] == [(second, task.id)]


async def test_G18_a_tenant_whose_cap_another_claimer_holds_waits_beside_one_with_the_same_cap(
    pool: asyncpg.Pool, tenants: Tenants, locker: asyncpg.Connection,
    impatient: asyncpg.Connection,
) -> None:  # fmt: skip
    """Tenants a and b cap the same task type; another transaction holds a's cap (an
    operator changing it). A claim of two skips a - it never waits for the lock, nor fills
    a's slots unseen - and takes b's task. Kills generated ``gen-leases-lease_claim-lock-2``
    (the caps locked without SKIP LOCKED: the claim waits) and ``-tenant-5`` (a's cap taken
    for claimed because b's of the same type was: a's task claimed past its cap's lock)."""
    from agentdb import tenancy

    for tenant in (tenants.a, tenants.b):
        await tenancy.set_concurrency_limit(pool, tenant, 1, task_type="capped")
        await tasks.create(pool, tenant, "capped")
    tx = locker.transaction()
    await tx.start()
    try:
        await locker.execute(
            "SELECT 1 FROM agent_concurrency_limits WHERE tenant_id = $1 FOR UPDATE", tenants.a
        )
        got = await leases.claim(impatient, "w", batch=2)
        assert [t.tenant_id for t in got] == [tenants.b]
    finally:
        await tx.rollback()


async def test_G2_G22_a_task_s_cursor_moves_only_past_its_own_signals(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A wait that says it read up to place 1 moves the task's cursor there only if the
    task has a signal 1: tenant b's task of the same id has one, a's has none, and a's wait
    is refused. Kills generated ``gen-0006.control_flow-agentdb_guard_signal_cursor-tenant-1``
    (the place looked for among the twin's signals too)."""
    shared = await _twins(pool, tenants, b_state="pending")
    await tasks.signal(pool, tenants.b, shared, "approval")
    [held] = await leases.claim(pool, "w", task_types=["twin-a"])
    assert held.lease is not None
    with pytest.raises(SignalRuleViolation):
        await tasks.wait_for_signal(pool, held, "approval", signals_read=1, lease=held.lease)
    # Control: its own signal 1 read, the same wait is taken.
    await tasks.signal(pool, tenants.a, shared, "note")
    assert (
        await tasks.wait_for_signal(pool, held, "approval", signals_read=1, lease=held.lease)
    ).state == "waiting"


async def test_G7_a_refused_task_write_reports_its_own_task_s_state_not_a_sibling_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The explanation of a zero-row task write reads the task it was asked about: the
    tenant's older task, cancelled at another version, says nothing about it. Kills
    generated ``gen-_explain-explain_task-and-3`` (the tenant's first task read instead)."""
    older = await tasks.create(pool, tenants.a, "t-older")
    await tasks.transition(pool, tenants.a, older.id, expected_version=0, to_state="cancelled")
    task = await tasks.create(pool, tenants.a, "t")
    with pytest.raises(StaleVersion) as stale:
        await tasks.transition(pool, tenants.a, task.id, expected_version=7, to_state="cancelled")
    assert (stale.value.id, stale.value.actual, stale.value.actual_state) == (task.id, 0, "pending")


async def test_G20_G25_a_failed_task_records_no_more_steps(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Every finished state refuses a step with its own error (AG012), failed included -
    before the lease check would refuse it as not running. Kills generated
    ``gen-0008.steps-agentdb_guard_step-list-2`` ('failed' left out)."""
    task = await tasks.create(pool, tenants.a, "t-fails")
    [held] = await leases.claim(pool, "w", task_types=["t-fails"])
    assert held.lease is not None
    await tasks.transition(pool, tenants.a, task.id, expected_version=held.state_version,
                           to_state="failed", lease=held.lease)  # fmt: skip
    with pytest.raises(asyncpg.PostgresError) as refused:
        await pool.execute(
            "INSERT INTO agent_steps (tenant_id, task_id, name, kind, input_hash, result,"
            " lease_token) VALUES ($1, $2, 'late', 'step', $3, '{}', $4)",
            tenants.a, task.id, F.HASH, held.lease.token,
        )  # fmt: skip
    assert (refused.value.sqlstate, refused.value.constraint_name) == (
        "AG012",
        _pg.guard("agent_steps_guard"),
    )


async def test_G21_an_effect_is_refused_at_its_task_s_deadline_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A deadline has passed at its instant: an operation reserved in the transaction whose
    now() is the task's deadline is refused. Kills generated
    ``gen-0006.control_flow-agentdb_guard_open_task-cmp-3`` (``<``: the effect let in)."""
    task = await tasks.create(pool, tenants.a, "t", deadline=datetime.now(UTC) + timedelta(hours=1))
    async with _at_the_deadline(admin_conn, task.id):
        with pytest.raises(asyncpg.PostgresError) as refused:
            await admin_conn.execute(
                "INSERT INTO agent_operations (tenant_id, task_id, idempotency_key, action,"
                " input_hash) VALUES ($1, $2, 'k', 'send', $3)",
                tenants.a, task.id, F.HASH,
            )  # fmt: skip
        assert refused.value.sqlstate == "AG013"


async def test_G18_the_walk_finishes_the_last_tenant_s_task_types(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A claim of two walks to tenant a, then b - enough tenants - and goes on through b's
    other task types before it stops: b offers its oldest due task, whatever its type.
    Kills generated ``gen-leases-lease_claim-cmp-29`` (the walk stopping at b's next type
    instead: b's newer task of its first type claimed)."""
    first, second = sorted((tenants.a, tenants.b))
    await tasks.create(pool, first, "t1")
    oldest = await tasks.create(pool, second, "t2")
    await tasks.create(pool, second, "t1")
    got = await leases.claim(pool, "w", batch=2)
    assert sorted((t.tenant_id == second, t.task_type) for t in got) == [
        (False, "t1"),
        (True, "t2"),
    ]
    assert oldest.id in {t.id for t in got}


async def test_G22_the_signal_wake_touches_only_a_waiting_task(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A pending task scheduled for later that somehow carries a wait_signal (no runtime
    write leaves one outside a wait; a raw one can) and reads past a signal while a
    matching one is unread is not woken: the signal wake is a waiting task's. Kills
    generated ``gen-0006.control_flow-agentdb_guard_signal_cursor-and-5`` (the wake
    applied whatever the state: the scheduled task made due at once)."""
    later = datetime.now(UTC) + timedelta(hours=1)
    task = await tasks.create(pool, tenants.a, "t-later", wake_at=later)
    for name in ("note", "go"):
        await F.signal(admin_conn, tenants.a, task.id, name=name)
    version = (await tasks.get(pool, tenants.a, task.id)).state_version
    await F.update_task(admin_conn, tenants.a, task.id, wait_signal="go", signal_cursor=1,
                        state_version=version + 1)  # fmt: skip
    row = await admin_conn.fetchrow(
        "SELECT state, wake_at FROM agent_tasks WHERE tenant_id = $1 AND id = $2",
        tenants.a,
        task.id,
    )
    assert row is not None
    assert (row["state"], row["wake_at"]) == ("pending", later)


async def test_G20_a_reserved_operation_of_a_finished_task_may_still_be_written_as_reserved(
    tenants: Tenants, runtime_conn: asyncpg.Connection
) -> None:
    """The retry guard judges a re-arm only - a failed operation moved back to reserved: an
    operation still reserved when its task was cancelled may be written with its state
    named and unchanged (its provider reference recorded, at a version with its event),
    while the task's failed operation re-armed is refused. Kills generated
    ``gen-0006.control_flow-agent_operations_for_open_task_retry-and-1`` (the WHEN without
    ``OLD.state = 'failed'``: any write naming reserved judged a re-arm, AG012)."""
    task_id = await F.create_task(runtime_conn, tenants.a)
    reserved = await F.create_operation(runtime_conn, tenants.a, task_id)
    failed = await F.create_operation(runtime_conn, tenants.a, task_id)
    await F.update_operation(runtime_conn, tenants.a, failed, state="failed", state_version=1)
    await F.update_task(runtime_conn, tenants.a, task_id, state="cancelled", state_version=1)
    version = await F.update_operation(runtime_conn, tenants.a, reserved, state="reserved",
                                       provider_reference="p-1", state_version=1)  # fmt: skip
    assert version == 1
    with pytest.raises(asyncpg.PostgresError) as refused:
        await F.update_operation(runtime_conn, tenants.a, failed, state="reserved", attempts=2,
                                 state_version=2)  # fmt: skip
    assert refused.value.sqlstate == "AG012"


async def test_G2_G22_a_signal_wakes_its_own_tenant_s_task_not_a_twin_waiting_for_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant a's task and tenant b's task of the same id both wait for "approval": a's
    signal wakes a's task and leaves b's asleep, until b's own signal wakes it. Kills
    generated ``gen-0006.control_flow-agentdb_deliver_signal-tenant-2`` (the wake-up by task
    id alone: both twins woken, the signal refused)."""
    shared = await _twins(pool, tenants, b_state="pending")
    for kind in ("twin-b", "twin-a"):
        [held] = await leases.claim(pool, "w", task_types=[kind])
        asleep = await tasks.wait_for_signal(pool, held, "approval", lease=_lease(held))
        assert asleep.state == "waiting"
    states = "SELECT tenant_id, state FROM agent_tasks WHERE id = $1"
    await tasks.signal(pool, tenants.a, shared, "approval")
    woken = {r["tenant_id"]: r["state"] for r in await admin_conn.fetch(states, shared)}
    assert woken == {tenants.a: "pending", tenants.b: "waiting"}
    await tasks.signal(pool, tenants.b, shared, "approval")
    woken = {r["tenant_id"]: r["state"] for r in await admin_conn.fetch(states, shared)}
    assert woken == {tenants.a: "pending", tenants.b: "pending"}


async def test_G20_a_re_arm_racing_a_cancel_waits_for_it_and_is_refused(
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    runtime_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
) -> None:
    """Two connections: one cancels the task and holds its transaction open; the other
    re-arms the task's failed operation meanwhile. The open-task guard reads the task
    under a row lock, so the re-arm waits for the cancel and, once it commits, is refused
    (a re-arm that read the task before the cancel committed would otherwise slip in after
    it). Kills generated ``gen-0006.control_flow-agentdb_guard_open_task-lock-1`` (the
    task read without FOR SHARE: the re-arm lands)."""
    task_id = await F.create_task(runtime_conn, tenants.a)
    op = await F.create_operation(runtime_conn, tenants.a, task_id)
    await F.update_operation(runtime_conn, tenants.a, op, state="failed", state_version=1)
    async with runtime_conn.transaction():
        await tasks.cancel(runtime_conn, tenants.a, task_id)
        rearm = asyncio.create_task(
            F.update_operation(
                other_conn, tenants.a, op, state="reserved", attempts=2, state_version=2
            )
        )
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    with pytest.raises(asyncpg.PostgresError) as refused:
        await asyncio.wait_for(rearm, 20)
    assert refused.value.sqlstate == "AG012"
    state = await admin_conn.fetchval("SELECT state FROM agent_operations WHERE id = $1", op)
    assert state == "failed"
