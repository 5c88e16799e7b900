"""NOTIFY hints: a new task or outbox row wakes listeners (polling stays the fallback)."""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg

from agentdb import _db, outbox, tasks
from agentdb._db import wake
from tests import factories as F
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


async def _payloads(db: Database, channel: str) -> tuple[asyncpg.Connection, list[str]]:
    """A listener on ``channel`` and the payloads it hears, in order."""
    got: list[str] = []
    listener = await db.connect()
    await listener.add_listener(channel, lambda *args: got.append(args[3]))
    return listener, got


async def _settle(got: list[str], at_least: int) -> list[str]:
    for _ in range(100):
        if len(got) >= at_least:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # anything else on its way arrives too
    return list(got)


async def test_G12_a_create_that_is_its_own_transaction_wakes_listeners_after_its_commit(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    """On a pool (or a connection outside a transaction) the create's own transaction
    sends no NOTIFY - one would serialise its commit with every other notifier's
    (0017.wake_after_commit) - and the runtime's wake follows the commit: exactly one
    notification, the wake's, never the trigger's ('')."""
    listener, got = await _payloads(db, "agentdb_tasks")
    try:
        await tasks.create(pool, tenants.a, "t")
        assert await _settle(got, 1) == [wake.PAYLOAD]
        async with pool.acquire() as conn:
            await tasks.create(conn, tenants.a, "t")
        assert await _settle(got, 2) == [wake.PAYLOAD, wake.PAYLOAD]
        # A retried create (the key's first task answers) makes nothing: nothing to wake.
        await tasks.create(pool, tenants.a, "t", dedupe_key="k")
        await tasks.create(pool, tenants.a, "t", dedupe_key="k")
        assert await _settle(got, 3) == [wake.PAYLOAD] * 3
    finally:
        await listener.close()


async def test_G12_a_create_inside_the_callers_transaction_notifies_at_that_commit(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    """The runtime cannot wake after a commit it does not make: the trigger's NOTIFY
    goes with the caller's transaction, heard when it commits and not before."""
    listener, got = await _payloads(db, "agentdb_tasks")
    try:
        async with pool.acquire() as conn, conn.transaction():
            await tasks.create(conn, tenants.a, "t")
            assert await _settle(got, 1) == []
        assert await _settle(got, 1) == [""]
    finally:
        await listener.close()


async def test_G12_agentdb_wake_after_commit_quiets_the_trigger_for_its_transaction_only(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Raw SQL: a transaction that set agentdb.wake = 'after_commit' sends nothing; the
    control - the next transaction, without it - notifies."""
    listener, got = await _payloads(db, "agentdb_tasks")
    try:
        async with admin_conn.transaction():
            await admin_conn.execute("SET LOCAL agentdb.wake = 'after_commit'")
            await F.create_task(admin_conn, tenants.a)
        assert await _settle(got, 1) == []
        await F.create_task(admin_conn, tenants.a)
        assert await _settle(got, 1) == [""]
    finally:
        await listener.close()


async def test_G12_wakes_on_a_pool_share_the_notify_in_flight_and_start_after_it(
    db: Database, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """Explicit interleaving: the first wake's NOTIFY is held in flight (its statement
    waits on an advisory lock the test holds); two more callers arrive meanwhile. Both
    wait for one NOTIFY that starts after the first ends: two in all, not three - and
    none of the three returns before a NOTIFY that started after it arrived."""
    channel = "agentdb_wake_test"
    listener, got = await _payloads(db, channel)
    held = dataclasses.replace(
        _db.QUERIES["task_wake_listeners"],
        sql="SELECT pg_notify($1, $2) FROM (SELECT pg_advisory_xact_lock_shared(41041)) AS w",
    )
    await admin_conn.execute("SELECT pg_advisory_lock(41041)")
    try:
        first = asyncio.create_task(wake.wake_listeners(pool, held, channel))
        for _ in range(100):  # the first NOTIFY is in flight: waiting on the lock
            waiting = await admin_conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 41041"
                " AND NOT granted"
            )
            if waiting:
                break
            await asyncio.sleep(0.02)
        assert waiting == 1
        later = [asyncio.create_task(wake.wake_listeners(pool, held, channel)) for _ in "ab"]
        await asyncio.sleep(0.2)
        assert not first.done()
        assert not any(t.done() for t in later)
        await admin_conn.execute("SELECT pg_advisory_unlock(41041)")
        await asyncio.wait_for(asyncio.gather(first, *later), 10)
        assert await _settle(got, 2) == [wake.PAYLOAD, wake.PAYLOAD]
    finally:
        await admin_conn.execute("SELECT pg_advisory_unlock_all()")
        await listener.close()
