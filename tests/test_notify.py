"""NOTIFY hints: a new task or outbox row wakes listeners (polling stays the fallback)."""

from __future__ import annotations

import asyncio

import asyncpg

from agentdb import outbox, tasks
from tests.conftest import Database, Tenants

NOTIFY_NAMES = {"agent_tasks_notify", "agent_outbox_notify", "agent_signals_notify"}


async def _heard(db: Database, channel: str, act: object) -> list[str]:
    got: list[str] = []
    listener = await db.connect()
    try:
        await listener.add_listener(channel, lambda *args: got.append(args[2]))
        await act()  # type: ignore[operator]
        for _ in range(50):
            if got:
                break
            await asyncio.sleep(0.02)
    finally:
        await listener.close()
    return got


async def test_G12_a_new_task_notifies_workers(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    async def act() -> None:
        await tasks.create(pool, tenants.a, "t")

    assert await _heard(db, "agentdb_tasks", act) == ["agentdb_tasks"]


async def test_G22_a_signal_notifies_workers(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    task = await tasks.create(pool, tenants.a, "t", waiting=True)

    async def act() -> None:
        await tasks.signal(pool, tenants.a, task.id, "go")

    assert await _heard(db, "agentdb_tasks", act) == ["agentdb_tasks"]


async def test_G10_a_new_outbox_row_notifies_relays(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    async def act() -> None:
        async with pool.acquire() as conn:
            await outbox.enqueue(conn, tenants.a, "t")

    assert await _heard(db, "agentdb_outbox", act) == ["agentdb_outbox"]
