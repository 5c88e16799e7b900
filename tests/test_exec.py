"""The execution boundary: reruns on snapshot races, connection loss and serialization failures."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from agentdb import _exec, leases, tasks
from agentdb.errors import AgentDBError, NotFound, TransientError
from agentdb.models import Lease
from tests.conftest import Database, Tenants


async def test_fetch_one_reruns_then_gives_up(pool: asyncpg.Pool, tenants: Tenants) -> None:
    calls = 0

    async def zero() -> AgentDBError:
        nonlocal calls
        calls += 1
        return _exec.Rerun("still settling")

    with pytest.raises(_exec.Rerun):
        await _exec.fetch_one(
            pool, _exec.QUERIES["task_get"], tenants.a, uuid.uuid4(), on_zero=zero, reruns=2
        )
    assert calls == 3


async def test_renew_of_a_missing_task_is_not_found(pool: asyncpg.Pool, tenants: Tenants) -> None:
    from datetime import UTC, datetime

    ghost = Lease(tenants.a, uuid.uuid4(), "w", 1, datetime.now(UTC))
    with pytest.raises(NotFound):
        await leases.renew(pool, ghost)


async def test_lost_connection_is_transient(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    conn = await db.connect("agentdb_test_runtime")
    try:
        pid = conn.get_server_pid()
        await admin_conn.execute("SELECT pg_terminate_backend($1)", pid)
        await asyncio.sleep(0.1)
        with pytest.raises(TransientError):
            await tasks.get(conn, tenants.a, uuid.uuid4())
    finally:
        await conn.close()


async def test_serialization_failure_is_transient(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    c1 = await db.connect("agentdb_test_runtime")
    c2 = await db.connect("agentdb_test_runtime")
    try:
        t1 = c1.transaction(isolation="repeatable_read")
        await t1.start()
        await tasks.get(c1, tenants.a, task.id)  # takes c1's snapshot
        await tasks.transition(c2, tenants.a, task.id, expected_version=0, to_state="cancelled")
        with pytest.raises(TransientError) as failed:
            await tasks.transition(c1, tenants.a, task.id, expected_version=0, to_state="waiting")
        assert failed.value.sqlstate == "40001"
        await t1.rollback()
    finally:
        await c1.close()
        await c2.close()
