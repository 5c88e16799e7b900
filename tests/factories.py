"""Row factories for raw-SQL tests.

Each helper writes exactly what the schema demands and nothing more: a task
or operation row together with the event its state_version needs (G8), in one
transaction. Column names come from test code, never from data; values are
always bound parameters.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from agentdb.testing._postgres import ON_CITUS

HASH = hashlib.sha256(b"input").hexdigest()
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def _insert_sql(table: str, row: dict[str, Any], returning: str) -> str:
    cols = ", ".join(row)
    params = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    return f"INSERT INTO {table} ({cols}) VALUES ({params}) RETURNING {returning}"  # noqa: S608


def _update_sql(table: str, changes: dict[str, Any], returning: str) -> str:
    sets = ", ".join(f"{col} = ${i}" for i, col in enumerate(changes, start=3))
    return (
        f"UPDATE {table} SET {sets} WHERE tenant_id = $1 AND id = $2 "  # noqa: S608
        f"RETURNING {returning}"
    )


# The column that identifies a row of each table (most have ``id``).
_KEY = {
    "agent_inbox": "message_id",
    "agent_principals": "role_name",
    "agent_transitions": "entity",
    "agent_semconv_pins": "since",
    "agent_budget_holds": "budget_id",
    "agent_rate_limits": "action",
    "agent_global_rate_limits": "action",
    "agent_steps": "name",
}


async def insert(conn: asyncpg.Connection, table: str, row: dict[str, Any]) -> Any:
    """INSERT ``row`` and return its identifying column."""
    sql = _insert_sql(table, row, _KEY.get(table, "id"))
    return await conn.fetchval(sql, *row.values())


def task_row(tenant: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": tenant,
        "task_type": "summarise",
        "workflow_version": "v1",
    }
    row.update(overrides)
    return row


async def event(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    task_id: uuid.UUID,
    **overrides: Any,
) -> int:
    row: dict[str, Any] = {
        "tenant_id": tenant,
        "task_id": task_id,
        "event_type": "test",
        "actor_id": "tests",
        "policy_version": "p1",
    }
    row.update(overrides)
    return int(await insert(conn, "agent_events", row))


async def create_task(conn: asyncpg.Connection, tenant: uuid.UUID, **overrides: Any) -> uuid.UUID:
    """Insert a task and its creation event (task_state_version 0)."""
    row = task_row(tenant, **overrides)
    async with conn.transaction():
        task_id: uuid.UUID = await insert(conn, "agent_tasks", row)
        await event(
            conn, tenant, task_id, task_state_version=0, to_state=row.get("state", "pending")
        )
    return task_id


async def update_task(
    conn: asyncpg.Connection, tenant: uuid.UUID, task_id: uuid.UUID, **changes: Any
) -> int:
    """UPDATE a task with ``changes`` and write the event for the version it reaches."""
    async with conn.transaction():
        row = await conn.fetchrow(
            _update_sql("agent_tasks", changes, "state, state_version"),
            tenant,
            task_id,
            *changes.values(),
        )
        assert row is not None, "no such task"
        await event(
            conn, tenant, task_id, task_state_version=row["state_version"], to_state=row["state"]
        )
    return int(row["state_version"])


async def claim_task(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    task_id: uuid.UUID,
    *,
    owner: str = "worker-1",
    token: int = 1,
    version: int = 1,
    **extra: Any,
) -> int:
    """Move a due task to running under a new lease; return the version reached."""
    now = datetime.now(UTC)
    changes: dict[str, Any] = {
        "state": "running",
        "state_version": version,
        "lease_owner": owner,
        "lease_token": token,
        "lease_acquired_at": now,
        "lease_expires_at": now + timedelta(minutes=5),
    }
    changes.update(extra)
    return await update_task(conn, tenant, task_id, **changes)


def operation_row(tenant: uuid.UUID, task_id: uuid.UUID, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": tenant,
        "task_id": task_id,
        "idempotency_key": f"op-{uuid.uuid4().hex[:8]}",
        "action": "send_email",
        "input_hash": HASH,
    }
    row.update(overrides)
    return row


async def create_operation(
    conn: asyncpg.Connection, tenant: uuid.UUID, task_id: uuid.UUID, **overrides: Any
) -> uuid.UUID:
    """Insert a reserved operation and its event (operation_state_version 0)."""
    row = operation_row(tenant, task_id, **overrides)
    async with conn.transaction():
        op_id: uuid.UUID = await insert(conn, "agent_operations", row)
        await event(conn, tenant, task_id, operation_id=op_id, operation_state_version=0)
    return op_id


async def signal(
    conn: asyncpg.Connection, tenant: uuid.UUID, task_id: uuid.UUID, **overrides: Any
) -> uuid.UUID:
    """Insert a signal (its triggers give it its seq, write its event, wake a waiter)."""
    row: dict[str, Any] = {"tenant_id": tenant, "task_id": task_id, "name": "go", "sender": "tests"}
    row.update(overrides)
    result: uuid.UUID = await insert(conn, "agent_signals", row)
    return result


async def update_operation(
    conn: asyncpg.Connection, tenant: uuid.UUID, op_id: uuid.UUID, **changes: Any
) -> int:
    async with conn.transaction():
        row = await conn.fetchrow(
            _update_sql("agent_operations", changes, "task_id, state_version"),
            tenant,
            op_id,
            *changes.values(),
        )
        assert row is not None, "no such operation"
        await event(
            conn,
            tenant,
            row["task_id"],
            operation_id=op_id,
            operation_state_version=row["state_version"],
        )
    return int(row["state_version"])


async def update_row(
    conn: asyncpg.Connection, table: str, tenant: uuid.UUID, row_id: uuid.UUID, **changes: Any
) -> Any:
    return await conn.fetchval(_update_sql(table, changes, "id"), tenant, row_id, *changes.values())


async def expire_lease(
    admin: asyncpg.Connection, task_id: uuid.UUID, tenant_id: uuid.UUID | None = None
) -> None:
    """Make a task's lease run out now (a heartbeat-shaped write: no version bump, no event).
    ``tenant_id``: which tenant's task, where another tenant has a task of the same id."""
    # The instant is computed first: Citus refuses a STABLE operator on a column in a SET.
    acquired = await admin.fetchval(
        "SELECT lease_acquired_at FROM agent_tasks"
        " WHERE id = $1 AND ($2::uuid IS NULL OR tenant_id = $2)",
        task_id,
        tenant_id,
    )
    await admin.execute(
        "UPDATE agent_tasks SET lease_expires_at = $2"
        " WHERE id = $1 AND ($3::uuid IS NULL OR tenant_id = $3)",
        task_id,
        acquired + timedelta(milliseconds=1),
        tenant_id,
    )


async def purge_every(
    admin: asyncpg.Connection, kind: str, batch: int, older_than: timedelta
) -> int:
    """The ``kind`` purge of every tenant, up to ``batch`` rows: ``agentdb_purge``, one
    call, as retention.purge makes it on plain Postgres. On Citus that call is refused
    (FOR UPDATE over every shard): ``agentdb_purge_tenant`` tenant by tenant instead, as
    retention.purge makes it there."""
    if not ON_CITUS:
        every = "SELECT agentdb_purge($1, $2, $3)"
        return int(await admin.fetchval(every, kind, batch, older_than))
    done = 0
    for row in await admin.fetch("SELECT id FROM agent_tenants ORDER BY id"):
        if done >= batch:
            break
        one = "SELECT agentdb_purge_tenant($1, $2, $3, $4)"
        done += int(await admin.fetchval(one, row["id"], kind, batch - done, older_than))
    return done


async def replica_mode(admin: asyncpg.Connection) -> None:
    """Switch off triggers for the rest of ``admin``'s transaction (a superuser's way to
    fake time passing). On Citus the triggers fire on the workers: the setting is
    propagated there."""
    if ON_CITUS:
        await admin.execute("SET LOCAL citus.propagate_set_commands = 'local'")
    await admin.execute("SET LOCAL session_replication_role = replica")


async def wait_until_blocked(admin: asyncpg.Connection, pid: int) -> None:
    """Until backend ``pid`` waits on a lock - observed in pg_stat_activity, not slept for.

    On Citus the lock is waited for on a worker, on the backend's behalf:
    citus_lock_waits names the coordinator backend (its global pid ends in
    its pid).
    """
    query = (
        "SELECT count(*) > 0 FROM citus_lock_waits WHERE waiting_gpid % 10000000000 = $1"
        if ON_CITUS
        else "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
    )
    for _ in range(1000):
        waiting = await admin.fetchval(query, pid)
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked on a lock")


async def wait_until_n_blocked(admin: asyncpg.Connection, pids: list[int], n: int) -> None:
    """Until ``n`` of the backends ``pids`` wait on a lock (on Citus: on a worker, on their
    behalf), observed in the server - not slept for."""
    query = (
        "SELECT count(DISTINCT waiting_gpid % 10000000000) FROM citus_lock_waits"
        " WHERE waiting_gpid % 10000000000 = ANY ($1::int8[])"
        if ON_CITUS
        else "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1::int[])"
        " AND wait_event_type = 'Lock'"
    )
    for _ in range(2000):
        if await admin.fetchval(query, pids) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} of backends {pids} never blocked on a lock")


async def until(predicate: Callable[[], bool], within: float = 20.0) -> None:
    """Until ``predicate()`` holds (polled every 50 ms), else fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")
