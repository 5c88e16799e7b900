"""Tasks via the runtime: create (G3/G4), transition (G6/G7/G8/G10), every zero-row path typed."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import leases, outbox, tasks
from agentdb.errors import (
    DeadlineExceeded,
    IdempotencyConflict,
    InvalidTransition,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    StaleVersion,
    TenantMismatch,
)
from agentdb.models import Message
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants


async def _events(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[asyncpg.Record]:
    return await admin.fetch(
        "SELECT event_type, from_state, to_state, task_state_version, actor_id, payload"
        " FROM agent_events WHERE task_id = $1 AND task_state_version IS NOT NULL ORDER BY id",
        task_id,
    )


async def test_G8_create_writes_the_task_and_its_event(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "summarise", params={"doc": 7}, actor="api")
    assert (task.state, task.state_version, task.created, task.params) == (
        "pending",
        0,
        True,
        {"doc": 7},
    )
    [ev] = await _events(admin_conn, task.id)
    assert (ev["event_type"], ev["to_state"], ev["task_state_version"], ev["actor_id"]) == (
        "task.created", "pending", 0, "api",
    )  # fmt: skip


async def test_G3_G4_create_with_the_same_dedupe_key_and_params_returns_the_first_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    first = await tasks.create(
        pool, tenants.a, "t", params={"a": 1, "b": [1.0, "x"]}, dedupe_key="req-1"
    )
    again = await tasks.create(
        pool, tenants.a, "t", params={"b": [1, "x"], "a": 1}, dedupe_key="req-1"
    )
    assert first.created
    assert not again.created
    assert again.id == first.id
    other_tenant = await tasks.create(pool, tenants.b, "t", params={"a": 1}, dedupe_key="req-1")
    assert other_tenant.created  # keys are scoped to the tenant


async def test_G4_create_with_the_same_dedupe_key_and_other_params_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await tasks.create(pool, tenants.a, "t", params={"amount": 5}, dedupe_key="req-2")
    with pytest.raises(IdempotencyConflict) as refused:
        await tasks.create(pool, tenants.a, "t", params={"amount": 500}, dedupe_key="req-2")
    assert refused.value.key == "req-2"
    assert refused.value.stored_hash != refused.value.given_hash


async def test_G4_create_with_the_same_dedupe_key_for_another_task_type_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Same key, same params, another type: another request, never the first one's task."""
    first = await tasks.create(
        pool, tenants.a, "send_email", params={"order": 42}, dedupe_key="order-42"
    )
    again = await tasks.create(
        pool, tenants.a, "send_email", params={"order": 42}, dedupe_key="order-42"
    )
    assert (again.created, again.id) == (False, first.id)  # control: a true retry
    with pytest.raises(IdempotencyConflict) as refused:
        await tasks.create(
            pool, tenants.a, "charge_card", params={"order": 42}, dedupe_key="order-42"
        )
    assert refused.value.key == "order-42"


async def test_G3_concurrent_creates_with_one_dedupe_key_make_one_task(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    conns = [await db.connect("agentdb_test_runtime") for _ in range(4)]
    try:
        made = await asyncio.gather(
            *(tasks.create(c, tenants.a, "t", params={"n": 1}, dedupe_key="burst") for c in conns)
        )
    finally:
        for c in conns:
            await c.close()
    assert len({t.id for t in made}) == 1
    assert sum(t.created for t in made) == 1
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE dedupe_key = 'burst'")
        == 1
    )


async def test_G2_create_for_an_unknown_tenant_is_not_found(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A tenant that does not exist is NotFound for that tenant (it was TenantMismatch
    carrying the raw foreign-key text); a parent in another tenant stays TenantMismatch."""
    nobody = uuid.uuid4()
    with pytest.raises(NotFound) as refused:
        await tasks.create(pool, nobody, "t")
    assert (refused.value.entity, refused.value.tenant_id, refused.value.id) == (
        "tenant", nobody, nobody,
    )  # fmt: skip
    assert str(refused.value) == f"agentdb: tenant {nobody} not found"
    with pytest.raises(NotFound, match=f"^agentdb: tenant {nobody} not found$"):
        async with pool.acquire() as conn:
            await outbox.enqueue(conn, nobody, "topic", {})
    with pytest.raises(NotFound, match=r"^agentdb: task "):  # the prefix every error has
        await tasks.get(pool, tenants.a, uuid.uuid4())
    parent = await tasks.create(pool, tenants.a, "t")
    with pytest.raises(TenantMismatch):
        await tasks.create(pool, tenants.b, "t", parent=parent.id, child_key="c")


async def test_every_tenant_fkey_is_the_foreign_key_to_agent_tenants(
    admin_conn: asyncpg.Connection,
) -> None:
    """The error mapping reads a refused <table>_tenant_fkey as "no such tenant"."""
    rows = await admin_conn.fetch(
        "SELECT conname, confrelid::regclass::text AS target FROM pg_constraint"
        " WHERE contype = 'f' AND conname LIKE '%\\_tenant\\_fkey'"
    )
    assert len(rows) >= 10
    assert {r["target"] for r in rows} == {"agent_tenants"}


async def test_get_unknown_task_raises_not_found(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    with pytest.raises(NotFound):
        await tasks.get(pool, tenants.b, task.id)  # exists, but not in this tenant
    assert (await tasks.get(pool, tenants.a, task.id)).id == task.id


async def test_G8_G10_transition_writes_event_and_outbox_in_one_statement(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w1")
    done = await tasks.transition(
        pool, tenants.a, task.id, expected_version=claimed.state_version, to_state="succeeded",
        lease=claimed.lease, payload={"summary_ref": "s3://x"},
        outbox=[Message("task.done", {"task": str(task.id)}), Message("billing.tick")],
    )  # fmt: skip
    assert (done.state, done.state_version, done.lease_owner) == ("succeeded", 2, None)
    evs = await _events(admin_conn, task.id)
    assert [(e["event_type"], e["from_state"], e["to_state"]) for e in evs] == [
        ("task.created", None, "pending"),
        ("task.claimed", "pending", "running"),
        ("task.succeeded", "running", "succeeded"),
    ]
    topics = await admin_conn.fetch(
        "SELECT topic, state FROM agent_outbox WHERE task_id = $1 ORDER BY topic", task.id
    )
    assert [(r["topic"], r["state"]) for r in topics] == [
        ("billing.tick", "pending"),
        ("task.done", "pending"),
    ]


async def test_G7_two_connections_race_one_transition_exactly_one_wins(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    c1 = await db.connect("agentdb_test_runtime")
    c2 = await db.connect("agentdb_test_runtime")
    try:
        task = await tasks.create(c1, tenants.a, "t")
        # c1 takes the row lock first and holds it; c2's identical write queues
        # behind it, then re-checks state_version against c1's committed row.
        tx = c1.transaction()
        await tx.start()
        await tasks.transition(c1, tenants.a, task.id, expected_version=0, to_state="cancelled")
        second = asyncio.ensure_future(
            tasks.transition(c2, tenants.a, task.id, expected_version=0, to_state="cancelled")
        )
        await F.wait_until_blocked(admin_conn, c2.get_server_pid())
        assert not second.done(), "c2 should be waiting for c1's row lock"
        await tx.commit()
        with pytest.raises(StaleVersion) as lost:
            await second
    finally:
        await c1.close()
        await c2.close()
    assert (lost.value.expected, lost.value.actual, lost.value.actual_state) == (0, 1, "cancelled")
    n = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_events WHERE task_id = $1 AND task_state_version = 1", task.id
    )
    assert n == 1


async def test_G7_stale_version_changes_nothing(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    await tasks.transition(
        pool, tenants.a, task.id, expected_version=0, to_state="pending", step="a"
    )
    with pytest.raises(StaleVersion):
        await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    now = await tasks.get(pool, tenants.a, task.id)
    assert (now.state, now.state_version, now.current_step) == ("pending", 1, "a")


async def test_transition_of_unknown_task_raises_not_found(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    with pytest.raises(NotFound):
        await tasks.transition(
            pool, tenants.a, uuid.uuid4(), expected_version=0, to_state="cancelled"
        )


async def test_G6_illegal_transition_is_typed(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    with pytest.raises(InvalidTransition) as refused:
        await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="succeeded")
    assert refused.value.constraint == _pg.guard("agent_tasks_transition_guard")


async def test_G12_transition_with_a_taken_over_lease_is_lease_lost(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    [mine] = await leases.claim(pool, "w1")
    await F.expire_lease(admin_conn, task.id)
    [theirs] = await leases.claim(pool, "w2")
    with pytest.raises(LeaseLost) as lost:
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=theirs.state_version, to_state="succeeded",
            lease=mine.lease,
        )  # fmt: skip
    assert (lost.value.token, lost.value.current_token, lost.value.current_owner) == (1, 2, "w2")
    assert (await tasks.get(pool, tenants.a, task.id)).state == "running"


async def test_G9_event_payloads_are_redacted_and_capped(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    with pytest.raises(PayloadTooLarge):
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=0, to_state="cancelled",
            payload={f"k{i}": "v" * 100 for i in range(100)},
        )  # fmt: skip
    assert (await tasks.get(pool, tenants.a, task.id)).state_version == 0
    await tasks.transition(
        pool, tenants.a, task.id, expected_version=0, to_state="cancelled",
        payload={"headers": {"Authorization": "Bearer abcdefghijklmnop"}, "note": "sk-" + "x" * 20},
    )  # fmt: skip
    stored = await admin_conn.fetchval(
        "SELECT payload FROM agent_events WHERE task_id = $1 AND task_state_version = 1", task.id
    )
    assert json.loads(stored) == {"headers": {"Authorization": "[redacted]"}, "note": "[redacted]"}


async def test_G9_raw_sql_carrying_a_secret_is_refused_by_the_check(
    tenants: Tenants, runtime_conn: asyncpg.Connection
) -> None:
    task = await F.create_task(runtime_conn, tenants.a)
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await F.event(runtime_conn, tenants.a, task, payload='{"auth": {"password": "hunter2"}}')
    assert _pg.constraint_of(refused.value) == "agent_events_payload_no_secrets"


async def test_wait_until_and_wake(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    later = datetime.now(UTC) + timedelta(hours=1)
    asleep = await tasks.wait_until(pool, task, later)
    assert (asleep.state, asleep.wake_at) == ("waiting", later)
    assert await leases.claim(pool, "w1") == []  # not due
    awake = await tasks.wake(pool, asleep)
    assert awake.state == "pending"
    [claimed] = await leases.claim(pool, "w1")
    assert claimed.id == task.id


async def test_create_waiting_for_a_signal(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await tasks.create(pool, tenants.a, "t", waiting=True)
    assert task.state == "waiting"
    assert task.wake_at is not None
    assert task.wake_at.year > 9000  # 'infinity'


async def test_G21_finish_many_ends_a_late_task_only_as_dead_or_cancelled(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Past its deadline a held task may not succeed through finish_many, but its holder
    may still end it as dead (G21). Fails on a finish_many that refuses 'dead' too (a
    generated mutant, tasks-task_finish_many-list-1, survived every test before this)."""
    task = await tasks.create(
        pool, tenants.a, "late-many", deadline=datetime.now(UTC) + timedelta(milliseconds=600)
    )
    [held] = await leases.claim(pool, "holder", task_types=["late-many"])
    for _ in range(600):
        if await admin_conn.fetchval(
            "SELECT deadline_at < clock_timestamp() FROM agent_tasks WHERE id = $1", task.id
        ):
            break
        await asyncio.sleep(0.01)
    [refused] = await tasks.finish_many(pool, [held])
    assert isinstance(refused, DeadlineExceeded), refused
    [ended] = await tasks.finish_many(pool, [held], to_state="dead", error="late")
    assert not isinstance(ended, Exception), ended
    assert (ended.id, ended.state) == (task.id, "dead")


async def test_count_unhandled_counts_the_due_tasks_no_handler_here_takes(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """What a worker with only "send_email" handlers reports as waiting in silence: the due
    tasks of the other types, pending or waiting - not one scheduled for later, nor one
    running, nor a type it handles. Kills generated ``gen-tasks-task_count_unhandled-and-2``
    (tasks not yet due counted as waiting in silence)."""
    later = datetime.now(UTC) + timedelta(hours=1)
    await tasks.create(pool, tenants.a, "send_email")
    await tasks.create(pool, tenants.a, "resize")
    await tasks.create(pool, tenants.b, "resize")
    await tasks.create(pool, tenants.a, "resize", wake_at=later)
    await tasks.create(pool, tenants.a, "report", wake_at=later)
    await tasks.create(pool, tenants.a, "ocr")
    [running] = await leases.claim(pool, "w", task_types=["ocr"])
    assert running.task_type == "ocr"
    assert await tasks.count_unhandled(pool, ["send_email"]) == [("resize", 2)]


async def test_count_unhandled_counts_a_waiting_task_whose_wake_up_came(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A task that waited until a time now past is due as a pending one is: waiting in
    silence too. Kills generated ``gen-tasks-task_count_unhandled-list-2`` (only pending
    tasks counted)."""
    task = await tasks.create(pool, tenants.a, "resize")
    [held] = await leases.claim(pool, "w", task_types=["resize"])
    past = datetime.now(UTC) - timedelta(seconds=1)
    waiting = await tasks.wait_until(pool, held, past, lease=held.lease)
    assert (waiting.id, waiting.state) == (task.id, "waiting")
    assert await tasks.count_unhandled(pool, ["send_email"]) == [("resize", 1)]


async def test_G7_a_transition_moves_its_own_task_not_a_sibling_at_the_same_version(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Two pending tasks of one tenant, both at version 0: cancelling one leaves the other
    pending at version 0. Kills generated ``gen-tasks-task_transition-and-4`` (the update
    matching tenant and version alone: every task of the tenant at that version moved)."""
    first = await tasks.create(pool, tenants.a, "t")
    second = await tasks.create(pool, tenants.a, "t")
    done = await tasks.transition(
        pool, tenants.a, first.id, expected_version=0, to_state="cancelled"
    )
    assert (done.id, done.state) == (first.id, "cancelled")
    other = await tasks.get(pool, tenants.a, second.id)
    assert (other.state, other.state_version) == ("pending", 0)


async def test_G7_an_operator_s_retry_writes_only_at_the_version_it_read(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """retry reads the task, then writes at the version it read: a task that moved on in
    between (another operator's retry, a run that failed again) is not retried on a stale
    reading - the statement matches no row, and retry reads again. Kills generated
    ``gen-tasks-task_retry-and-4`` (the write at any version)."""
    task = await tasks.create(pool, tenants.a, "t")
    dead = await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="dead")
    assert await tasks._retry(pool, tenants.a, task.id, 0, "carol", {}) is None
    row = await admin_conn.fetchrow(
        "SELECT state, state_version FROM agent_tasks WHERE id = $1", task.id
    )
    assert row is not None
    assert tuple(row) == ("dead", dead.state_version)
    # Control: at the version it has, the same write retries it.
    again = await tasks._retry(pool, tenants.a, task.id, dead.state_version, "carol", {})
    assert again is not None
    assert (again["state"], again["state_version"]) == ("pending", dead.state_version + 1)


async def test_G6_an_operator_retries_a_failed_task(pool: asyncpg.Pool, tenants: Tenants) -> None:
    """A task that failed - its handler said so, it did not die of its attempts - goes back
    to pending on an operator's retry, as a dead one does. Kills generated
    ``gen-tasks-task_retry-list-1`` ('failed' left out of the states a retry takes)."""
    task = await tasks.create(pool, tenants.a, "t-fails")
    [held] = await leases.claim(pool, "w", task_types=["t-fails"])
    await tasks.transition(pool, tenants.a, task.id, expected_version=held.state_version,
                           to_state="failed", lease=held.lease)  # fmt: skip
    again = await tasks.retry(pool, tenants.a, task.id, actor="carol", reason="fixed upstream")
    assert (again.state, again.attempts) == ("pending", 0)


async def test_G8_a_retry_s_event_tells_the_state_and_attempts_of_the_task_it_retried(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """task.retried records the state the task left and the attempts it had used - read
    from that task, not from another of its tenant's (older ones first in the table).
    Kills generated ``gen-tasks-task_retry-and-1`` (the prior reading without its id)."""
    await tasks.create(pool, tenants.a, "t-other")  # pending, no attempt used
    task = await tasks.create(pool, tenants.a, "t-dies")
    [held] = await leases.claim(pool, "w", task_types=["t-dies"])
    await tasks.transition(pool, tenants.a, task.id, expected_version=held.state_version,
                           to_state="dead", lease=held.lease)  # fmt: skip
    await tasks.create(pool, tenants.a, "t-later")
    await tasks.retry(pool, tenants.a, task.id, actor="carol")
    row = await admin_conn.fetchrow(
        "SELECT from_state, to_state, payload FROM agent_events"
        " WHERE task_id = $1 AND event_type = 'task.retried'",
        task.id,
    )
    assert row is not None
    assert (row["from_state"], row["to_state"]) == ("dead", "pending")
    assert json.loads(row["payload"])["attempts"] == 1
