"""Tenant scope per transaction (G15) and transient-error classification."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from agentdb import tasks, tenancy
from agentdb.errors import DuplicateKey, TransientError
from tests.conftest import AGENT_UNPINNED, Database, Tenants


async def test_G15_tenant_scope_sees_one_tenant_and_never_leaks_on_a_pooled_connection(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    await tasks.create(pool, tenants.a, "t")
    await tasks.create(pool, tenants.b, "t")
    agents = await asyncpg.create_pool(db.url(AGENT_UNPINNED), min_size=1, max_size=1)
    try:
        async with tenancy.tenant_scope(agents, tenants.b) as conn:
            seen = {r[0] for r in await conn.fetch("SELECT tenant_id FROM agent_tasks")}
        assert seen == {tenants.b}
        # Same single pooled connection, next user: no scope left behind.
        assert await agents.fetchval("SELECT count(*) FROM agent_tasks") == 0
        async with agents.acquire() as conn, tenancy.tenant_scope(conn, tenants.a) as scoped:
            seen = {r[0] for r in await scoped.fetch("SELECT tenant_id FROM agent_tasks")}
        assert seen == {tenants.a}
    finally:
        await agents.close()


async def test_G15_tenant_scope_ends_with_its_transaction_on_a_plain_connection(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    """No pool resets the session here (nor does a transaction-pooling proxy between
    transactions): only a transaction-local setting keeps the scope from outliving its
    transaction."""
    await tasks.create(pool, tenants.a, "t")
    conn = await db.connect(AGENT_UNPINNED)
    try:
        async with tenancy.tenant_scope(conn, tenants.a) as scoped:
            assert await scoped.fetchval("SELECT count(*) FROM agent_tasks") == 1
        assert await conn.fetchval("SELECT count(*) FROM agent_tasks") == 0
        assert await conn.fetchval("SELECT current_setting('agentdb.tenant_id', true)") in (
            None,
            "",
        )
    finally:
        await conn.close()


async def test_create_tenant(pool: asyncpg.Pool, admin_conn: asyncpg.Connection) -> None:
    tid = await tenancy.create_tenant(admin_conn, "acme")
    assert await admin_conn.fetchval("SELECT name FROM agent_tenants WHERE id = $1", tid) == "acme"
    with pytest.raises(DuplicateKey) as dup:
        await tenancy.create_tenant(admin_conn, "acme again", tenant_id=tid)
    assert dup.value.constraint == "agent_tenants_pkey"


@pytest.mark.plain_postgres(
    "on Citus the row lock is waited for on a worker, which a coordinator session's "
    "lock_timeout does not reach: the waiter blocks (set lock_timeout on the workers)"
)
async def test_lock_timeout_is_transient(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    holder = await db.connect("agentdb_test_runtime")
    waiter = await db.connect("agentdb_test_runtime")
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "SELECT 1 FROM agent_tasks WHERE tenant_id = $1 AND id = $2 FOR UPDATE",
            tenants.a,
            task.id,
        )
        await waiter.execute("SET lock_timeout = '50ms'")
        with pytest.raises(TransientError) as transient:
            await tasks.transition(
                waiter, tenants.a, task.id, expected_version=0, to_state="cancelled"
            )
        assert transient.value.sqlstate == "55P03"
        await tx.rollback()
    finally:
        await holder.close()
        await waiter.close()


@pytest.mark.plain_postgres(
    "on Citus the two sessions wait for each other on a worker, and which detector "
    "ends it, and when, is Citus's (seen both to pass and to outlast the test's limit)"
)
async def test_deadlock_is_transient(db: Database, tenants: Tenants, pool: asyncpg.Pool) -> None:
    one = await tasks.create(pool, tenants.a, "t")
    two = await tasks.create(pool, tenants.a, "t")
    c1 = await db.connect("agentdb_test_runtime")
    c2 = await db.connect("agentdb_test_runtime")
    try:
        t1, t2 = c1.transaction(), c2.transaction()
        await t1.start()
        await t2.start()
        await tasks.transition(c1, tenants.a, one.id, expected_version=0, to_state="cancelled")
        await tasks.transition(c2, tenants.a, two.id, expected_version=0, to_state="cancelled")
        results = await asyncio.gather(
            tasks.transition(
                c1, tenants.a, two.id, expected_version=0, to_state="pending", step="x"
            ),
            tasks.transition(
                c2, tenants.a, one.id, expected_version=0, to_state="pending", step="x"
            ),
            return_exceptions=True,
        )
        transient = [r for r in results if isinstance(r, TransientError)]
        assert len(transient) == 1
        assert transient[0].sqlstate == "40P01"
    finally:
        await c1.close()
        await c2.close()


async def test_G2_a_tenant_is_found_by_its_own_name_only(
    pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """Kills generated ``gen-tenancy-tenant_by_name-cmp-1`` (``name <> $1``: another
    tenant answers)."""
    alpha = await tenancy.create_tenant(admin_conn, "by-name-alpha")
    beta = await tenancy.create_tenant(admin_conn, "by-name-beta")
    for name, tenant in (("by-name-alpha", alpha), ("by-name-beta", beta)):
        found = await tenancy.tenant_by_name(pool, name)
        assert found is not None
        assert found.id == tenant
    assert await tenancy.tenant_by_name(pool, "by-name-gamma") is None


async def test_G2_G18_a_tenant_s_caps_are_its_own(pool: asyncpg.Pool, tenants: Tenants) -> None:
    """Kills generated ``gen-tenancy-tenant_limits-tenant-1`` (every tenant's caps listed)."""
    await tenancy.set_concurrency_limit(pool, tenants.a, 3, task_type="mail")
    await tenancy.set_concurrency_limit(pool, tenants.b, 1, task_type="report")
    caps = await tenancy.concurrency_limits(pool, tenants.a)
    assert [(c.task_type, c.max_running) for c in caps] == [("mail", 3)]
