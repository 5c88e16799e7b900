"""Tenant scope for sessions that run as the ``agentdb_agent`` role (G15).

Pinned login roles (rows in ``agent_principals``) need nothing from here:
their tenant follows the login. An unpinned session - trusted code that holds
a pooled connection and acts for one tenant at a time - opens a scope per
transaction; the setting is transaction-local, so it can never leak to the
next user of the connection.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from agentdb import _exec
from agentdb.errors import AgentDBError

__all__ = ["create_tenant", "tenant_scope"]

_Q = _exec.QUERIES


async def create_tenant(
    db: _exec.Executor, name: str, *, tenant_id: uuid.UUID | None = None
) -> uuid.UUID:
    """Register a tenant and return its id.

    Raises:
        DuplicateKey: ``tenant_id`` is taken.
        InvariantViolation: ``name`` is empty or over 200 characters.
    """

    async def never() -> AgentDBError:
        return AgentDBError("tenant_create returned no row")

    row = await _exec.fetch_one(
        db, _Q["tenant_create"], tenant_id or uuid.uuid4(), name, on_zero=never
    )
    return uuid.UUID(str(row["id"]))


@asynccontextmanager
async def tenant_scope(db: _exec.Executor, tenant_id: uuid.UUID) -> AsyncIterator[_exec.Conn]:
    """Open a transaction scoped to ``tenant_id`` and yield its connection.

    Raises:
        whatever the block raises (the transaction is rolled back).
    """
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            await _set(conn, tenant_id)
            yield conn
        return
    async with db.transaction():
        await _set(db, tenant_id)
        yield db


async def _set(conn: _exec.Conn, tenant_id: uuid.UUID) -> None:
    async def never() -> AgentDBError:
        return AgentDBError("set_config returned no row")

    await _exec.fetch_one(conn, _Q["tenant_scope_set"], str(tenant_id), on_zero=never)
