"""G2: the same id or key in two tenants never makes one tenant's call touch the other's row.

Ids are caller-supplied (task ids, message ids) and keys are the caller's own, so
coincidences across tenants are normal. Every statement must scope by tenant
even where an id alone looks unique; each test here puts the same id or key in
two tenants and checks the other tenant's row is left exactly as it was.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentdb import leases, operations, outbox, tasks
from agentdb.errors import NotFound
from agentdb.models import Task
from agentdb.operations import ReserveRequest
from tests import factories as F
from tests.conftest import Tenants

SHARED = uuid.UUID("00000000-0000-4000-8000-00000000abcd")


async def _row(admin: asyncpg.Connection, table: str, tenant: uuid.UUID) -> asyncpg.Record:
    row = await admin.fetchrow(
        f"SELECT * FROM {table} WHERE tenant_id = $1 AND id = $2",  # noqa: S608
        tenant,
        SHARED,
    )
    assert row is not None
    return row


async def _twin_tasks(pool: asyncpg.Pool, tenants: Tenants) -> tuple[Task, Task]:
    a = await tasks.create(pool, tenants.a, "t", task_id=SHARED)
    b = await tasks.create(pool, tenants.b, "t", task_id=SHARED)
    return a, b


async def test_G2_reading_a_task_id_answers_from_the_callers_tenant_only(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await _twin_tasks(pool, tenants)
    assert (await tasks.get(pool, tenants.a, SHARED)).tenant_id == tenants.a
    assert (await tasks.get(pool, tenants.b, SHARED)).tenant_id == tenants.b
    with pytest.raises(NotFound):
        await tasks.get(pool, uuid.uuid4(), SHARED)


async def test_G2_transitioning_a_task_id_leaves_the_other_tenants_twin_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    await _twin_tasks(pool, tenants)
    before = await _row(admin_conn, "agent_tasks", tenants.b)
    moved = await tasks.transition(pool, tenants.a, SHARED, expected_version=0, to_state="waiting")
    assert (moved.tenant_id, moved.state, moved.state_version) == (tenants.a, "waiting", 1)
    assert await _row(admin_conn, "agent_tasks", tenants.b) == before


async def test_G2_finishing_a_batch_leaves_the_other_tenants_twin_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    await _twin_tasks(pool, tenants)
    claimed = await leases.claim(pool, "w", batch=2)  # same owner, token 1 and version 1 each
    mine = next(t for t in claimed if t.tenant_id == tenants.a)
    before = await _row(admin_conn, "agent_tasks", tenants.b)
    [done] = await tasks.finish_many(pool, [mine])
    assert isinstance(done, Task)
    assert (done.tenant_id, done.state) == (tenants.a, "succeeded")
    assert await _row(admin_conn, "agent_tasks", tenants.b) == before


async def test_G2_G3_a_retried_create_answers_with_the_callers_tenants_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    a = await tasks.create(pool, tenants.a, "t", params={"n": 1}, dedupe_key="invoice-1")
    b = await tasks.create(pool, tenants.b, "t", params={"n": 1}, dedupe_key="invoice-1")
    assert a.id != b.id
    assert (a.created, b.created) == (True, True)
    again = await tasks.create(pool, tenants.a, "t", params={"n": 1}, dedupe_key="invoice-1")
    assert (again.created, again.id, again.tenant_id) == (False, a.id, tenants.a)


async def test_G2_G3_a_retried_reserve_answers_with_the_callers_tenants_operation(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    ta, tb = await _twin_tasks(pool, tenants)
    mine = await operations.reserve(pool, tenants.a, ta.id, "charge-1", "charge", {"n": 1})
    theirs = await operations.reserve(pool, tenants.b, tb.id, "charge-1", "charge", {"n": 1})
    await operations.complete(pool, mine.operation, result={"who": "a"})
    await operations.complete(pool, theirs.operation, result={"who": "b"})
    again = await operations.reserve(pool, tenants.a, ta.id, "charge-1", "charge", {"n": 1})
    assert (again.fresh, again.operation.id, again.operation.result) == (
        False,
        mine.operation.id,
        {"who": "a"},
    )


async def test_G2_G3_reserve_many_answers_with_the_callers_tenants_operation(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    ta, tb = await _twin_tasks(pool, tenants)
    theirs = await operations.reserve(pool, tenants.b, tb.id, "charge-1", "charge", {"n": 1})
    await operations.complete(pool, theirs.operation, result={"who": "b"})
    claimed = await leases.claim(pool, "w", batch=2)
    lease_a = next(t.lease for t in claimed if t.tenant_id == tenants.a)
    assert lease_a is not None
    first = await operations.reserve(
        pool, tenants.a, ta.id, "charge-1", "charge", {"n": 1}, lease=lease_a
    )
    await operations.complete(pool, first.operation, result={"who": "a"}, lease=lease_a)
    [answer] = await operations.reserve_many(
        pool, [ReserveRequest(lease_a, "charge-1", "charge", {"n": 1})]
    )
    assert not isinstance(answer, Exception)
    assert (answer.fresh, answer.operation.tenant_id, answer.operation.result) == (
        False,
        tenants.a,
        {"who": "a"},
    )


async def test_G2_settling_an_operation_id_leaves_the_other_tenants_twin_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    ta, tb = await _twin_tasks(pool, tenants)
    for tenant, task_id in ((tenants.a, ta.id), (tenants.b, tb.id)):
        await F.create_operation(admin_conn, tenant, task_id, id=SHARED)
    before = await _row(admin_conn, "agent_operations", tenants.b)
    op = await operations.get(pool, tenants.a, SHARED)
    done = await operations.complete(pool, op, result={"ok": True})
    assert (done.tenant_id, done.state) == (tenants.a, "succeeded")
    assert await _row(admin_conn, "agent_operations", tenants.b) == before


async def test_G2_a_message_id_in_two_tenants_is_read_and_marked_per_tenant(
    pool: asyncpg.Pool, tenants: Tenants, runtime_conn: asyncpg.Connection,
    admin_conn: asyncpg.Connection,
) -> None:  # fmt: skip
    for tenant in (tenants.a, tenants.b):
        await outbox.enqueue(runtime_conn, tenant, "t", {"n": 1}, message_id=SHARED)
    claimed = await outbox.claim(pool, "relay", batch=2)  # token 1 each
    assert sorted(m.lease_token for m in claimed) == [1, 1]
    mine = next(m for m in claimed if m.tenant_id == tenants.a)
    before = await _row(admin_conn, "agent_outbox", tenants.b)
    assert await outbox.mark_delivered(pool, [mine]) == {SHARED}
    assert await _row(admin_conn, "agent_outbox", tenants.b) == before
    assert (await outbox.get(pool, tenants.a, SHARED)).state == "delivered"
    assert (await outbox.get(pool, tenants.b, SHARED)).state == "pending"


async def test_G2_a_message_id_in_two_tenants_is_marked_and_claimed_per_tenant(
    pool: asyncpg.Pool, tenants: Tenants, runtime_conn: asyncpg.Connection,
    admin_conn: asyncpg.Connection,
) -> None:  # fmt: skip
    """deliver_and_claim marks tenant a's message alone, though tenant b's of the same id
    holds the same token; and its claim leaves out only the marked tenant's message:
    b's of the same id, due, is claimed in the same statement."""
    for tenant in (tenants.a, tenants.b):
        await outbox.enqueue(runtime_conn, tenant, "t", {"n": 1}, message_id=SHARED)
    claimed = await outbox.claim(pool, "relay", batch=2)  # token 1 each
    mine = next(m for m in claimed if m.tenant_id == tenants.a)
    before = await _row(admin_conn, "agent_outbox", tenants.b)
    assert await outbox.deliver_and_claim(pool, "relay", [mine], batch=5) == ({SHARED}, [])
    assert await _row(admin_conn, "agent_outbox", tenants.b) == before
    assert (await outbox.get(pool, tenants.a, SHARED)).state == "delivered"
    # Another id in both tenants: a's claimed (to be marked), b's due.
    other = uuid.uuid4()
    await outbox.enqueue(runtime_conn, tenants.a, "t", {"n": 2}, message_id=other)
    [again] = await outbox.claim(pool, "relay", batch=1)
    assert again.id == other
    await outbox.enqueue(runtime_conn, tenants.b, "t", {"n": 2}, message_id=other)
    marked, taken = await outbox.deliver_and_claim(pool, "relay", [again], batch=5)
    assert marked == {other}
    assert [(m.tenant_id, m.id) for m in taken] == [(tenants.b, other)]
