"""The execution boundary: reruns on snapshot races, connection loss and serialization failures."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from agentdb import _db, errors, leases, tasks
from agentdb._db import errormap
from agentdb._db.sqlfile import parse
from agentdb.errors import NotFound, TransientError
from agentdb.models import Lease, Task
from tests.conftest import Database, Tenants

_TWO_ROWS = """
-- name: two_rows :one
-- A :one statement that breaks its contract.
-- guarantee: none
-- zero rows: never.
-- params: $1 n int4
SELECT g FROM generate_series(1, $1) AS g;
"""


async def test_a_one_statement_that_returns_two_rows_is_a_bug_not_a_row(
    pool: asyncpg.Pool,
) -> None:
    (q,) = parse(_TWO_ROWS, "test.sql")
    assert (await _db.fetch_one(pool, q, n=1))["g"] == 1
    assert await _db.fetch_optional(pool, q, n=0) is None
    with pytest.raises(_db.StatementBug, match="returned 2 rows"):
        await _db.fetch_optional(pool, q, n=2)
    with pytest.raises(_db.StatementBug, match="returned no row"):
        await _db.fetch_one(pool, q, n=0)


async def test_parameters_bind_by_declared_name(pool: asyncpg.Pool) -> None:
    (q,) = parse(_TWO_ROWS, "test.sql")
    with pytest.raises(TypeError, match="missing parameter"):
        await _db.fetch_one(pool, q)
    with pytest.raises(TypeError, match="unknown parameter"):
        await _db.fetch_one(pool, q, n=1, m=2)
    with pytest.raises(_db.StatementBug, match="declared :one"):
        await _db.fetch_many(pool, q, n=1)


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
        await admin_conn.execute("SELECT pg_terminate_backend($1::int)", pid)
        await asyncio.sleep(0.1)
        with pytest.raises(TransientError):
            await tasks.get(conn, tenants.a, uuid.uuid4())
    finally:
        await conn.close()


async def test_a_connection_lost_inside_a_transaction_is_transient_never_asyncpg_s(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Ending the transaction on the dead connection raised asyncpg's InterfaceError ("cannot
    call Transaction.__aexit__()"), hiding the mapped error of the statement that failed."""
    for where in ("statement", "commit"):
        conn = await db.connect("agentdb_test_runtime")
        try:
            task = await tasks.create(conn, tenants.a, "t")

            async def lose_the_connection(
                conn: asyncpg.Connection = conn, task: Task = task, where: str = where
            ) -> None:
                async with _db.transaction(conn) as tx:
                    await tasks.get(tx, tenants.a, task.id)  # control: it ran
                    pid = conn.get_server_pid()
                    await admin_conn.execute("SELECT pg_terminate_backend($1::int, 10000)", pid)
                    if where == "statement":
                        await tasks.get(tx, tenants.a, task.id)

            with pytest.raises(TransientError):
                await lose_the_connection()
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


_PROBE = """
-- name: probe_read :many
-- Reads a scratch table whose column type the test changes under it.
-- guarantee: none
-- params: none
SELECT x FROM agentdb_probe;
"""


async def test_a_plan_invalidated_by_a_migration_is_transient(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    """A schema change under a cached statement: retrying the whole transaction is safe."""
    await admin_conn.execute(
        "CREATE TABLE agentdb_probe (x int); INSERT INTO agentdb_probe VALUES (1)"
    )
    (q,) = parse(_PROBE, "probe.sql")
    conn = await db.connect()
    try:
        assert [r["x"] for r in await _db.fetch_many(conn, q)] == [1]  # now cached
        await admin_conn.execute("ALTER TABLE agentdb_probe ALTER COLUMN x TYPE bigint")
        with pytest.raises(TransientError) as stale:
            async with conn.transaction():
                await _db.fetch_many(conn, q)
        assert "invalidated" in str(stale.value)
        assert [r["x"] for r in await _db.fetch_many(conn, q)] == [1]  # re-prepared
    finally:
        await conn.close()


def test_error_for_maps_agentdb_objects_and_leaves_everything_else_alone() -> None:
    """Constraint names outside the catalogue belong to the user's schema: never mapped."""
    assert errormap.error_for("23505", "users_email_key", "dup") is None
    assert errormap.error_for("23514", "users_age_check", "no") is None
    assert errormap.error_for("23505", None, "dup") is None
    assert errormap.error_for("42P01", "agent_tasks_pkey", "no such table") is None
    dup = errormap.error_for("23505", "agent_tasks_dedupe_key", "dup")
    assert isinstance(dup, errors.DuplicateKey)
    assert dup.guarantee == "G3"
    for code in ("40001", "40P01", "55P03", "57P01", "08006"):
        transient = errormap.error_for(code, None, "x")
        assert isinstance(transient, TransientError), code
        assert transient.sqlstate == code


def test_a_shard_moved_under_a_waiting_statement_is_transient_and_no_other_internal_error_is() -> (
    None
):
    """Citus's XX000 for a statement planned against a shard a move or split replaced
    (tests/citus/test_citus_rebalance.py met it): retryable. Any other XX000 is not
    agentdb's to interpret."""
    moved = errormap.error_for("XX000", None, "could not find valid entry for shard 102125")
    assert isinstance(moved, TransientError)
    assert moved.sqlstate == "XX000"
    assert errormap.error_for("XX000", None, "could not open relation with OID 1") is None
    assert errormap.error_for("XX001", None, "could not find valid entry for shard 1") is None
