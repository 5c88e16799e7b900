"""The article's crash scenarios with real processes killed by SIGKILL at an exact step.

Each test arms one fault point (``AGENTDB_FAULTS``) in a worker or relay
process running the demo's handlers, lets it kill itself there, then
restarts it without faults and checks the outcome in the database: the
provider executed every effect once, it never had to answer a repeat request
from its key that agentdb's ledger does not justify (see
:mod:`agentdb.tools.demo.workload`: effects alone would not show a worker
that called the provider again blindly, the key would hide it), and the
consumer applied every message once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from agentdb import tasks
from agentdb.tools.demo.fleet import PUBLISHER_TARGET, WORKER_TARGET
from agentdb.tools.demo.provider import SCHEMA, TASK_TYPE
from agentdb.tools.demo.workload import count
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def demo_tables(admin_conn: asyncpg.Connection) -> None:
    for statement in SCHEMA:
        await admin_conn.execute(statement)


def _start(
    db: Database, kind: str, faults: str = "", fault_log: Path | None = None
) -> subprocess.Popen[str]:
    env = dict(os.environ, DATABASE_URL=db.admin_dsn, AGENTDB_FAULTS=faults, AGENTDB_DEMO_CALM="1")
    if fault_log is not None:
        env["AGENTDB_FAULTS_LOG"] = str(fault_log)
    target = WORKER_TARGET if kind == "worker" else PUBLISHER_TARGET
    extra = [] if kind == "worker" else ["--visibility", "1"]
    return subprocess.Popen(
        [sys.executable, "-m", "agentdb", kind, target, "--dsn", db.admin_dsn,
         "--poll-interval", "0.1", "--retry-base", "0.05", "--log-level", "warning", *extra],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _killed_at(
    proc: subprocess.Popen[str], fault_log: Path, point: str, within: float = 60
) -> None:
    """Wait for the process to SIGKILL itself at ``point``."""
    try:
        proc.wait(timeout=within)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert fault_log.read_text().split() == [point]


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return err


async def _wait(admin: asyncpg.Connection, sql: str, expected: object, within: float = 60) -> None:
    import asyncio

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await admin.fetchval(sql) == expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{sql} never returned {expected!r}")


async def _requests(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[tuple[str, str]]:
    """What the provider saw for the task, in arrival order: (action, outcome)."""
    rows = await admin.fetch(
        "SELECT action, outcome FROM agentdb_demo.provider_requests WHERE task_id = $1"
        " ORDER BY at, id",
        task_id,
    )
    return [(r["action"], r["outcome"]) for r in rows]


async def _assert_no_replay(admin: asyncpg.Connection, tenant: uuid.UUID) -> None:
    """No request was answered from its key (so none unjustified), and no duplicate effect."""
    counts = await count(admin, [tenant])
    assert counts["unjustified_replays"] == 0, counts
    assert counts["replayed"] == 0, counts
    assert counts["duplicates"] == 0, counts


async def _one_task(pool: asyncpg.Pool, tenant: uuid.UUID) -> uuid.UUID:
    task = await tasks.create(
        pool, tenant, TASK_TYPE, params={"invoice": 1, "amount": 5}, lease_ttl=timedelta(seconds=1)
    )
    return task.id


async def test_G10_crash_after_the_business_commit_before_the_queue_ack(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection,
    demo_tables: None, tmp_path: Path,
) -> None:  # fmt: skip
    """The worker commits the task's success and its outbox row, then dies before publishing."""
    task_id = await _one_task(pool, tenants.a)
    fault_log = tmp_path / "faults"
    _killed_at(_start(db, "worker", "after_transition=1", fault_log), fault_log, "after_transition")
    assert (
        await admin_conn.fetchval("SELECT state FROM agent_tasks WHERE id = $1", task_id)
        == "succeeded"
    )
    assert (
        await admin_conn.fetchval("SELECT state FROM agent_outbox WHERE task_id = $1", task_id)
        == "pending"
    )
    relay = _start(db, "relay")
    try:
        await _wait(admin_conn, "SELECT count(*) FROM agentdb_demo.consumer_ledger", 1)
        await _wait(admin_conn, "SELECT count(*) FROM agent_outbox WHERE state = 'delivered'", 1)
    finally:
        _stop(relay)
    assert await _requests(admin_conn, task_id) == [("charge", "executed"), ("email", "executed")]
    await _assert_no_replay(admin_conn, tenants.a)


async def test_G11_crash_after_publish_before_mark_delivered_is_absorbed_by_the_inbox(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection,
    demo_tables: None, tmp_path: Path,
) -> None:  # fmt: skip
    await admin_conn.execute(
        "INSERT INTO agent_outbox (tenant_id, topic, payload)"
        " VALUES ($1, 'invoice.paid', '{\"invoice\": 9}')",
        tenants.a,
    )
    fault_log = tmp_path / "faults"
    _killed_at(_start(db, "relay", "after_publish=1", fault_log), fault_log, "after_publish")
    # Published (the consumer applied it) but never marked: it is still pending.
    assert await admin_conn.fetchval("SELECT count(*) FROM agentdb_demo.consumer_ledger") == 1
    assert await admin_conn.fetchval("SELECT state FROM agent_outbox") == "pending"
    relay = _start(db, "relay")
    try:
        await _wait(admin_conn, "SELECT state FROM agent_outbox", "delivered", within=30)
    finally:
        _stop(relay)
    assert await admin_conn.fetchval("SELECT count(*) FROM agentdb_demo.consumer_ledger") == 1
    assert await admin_conn.fetchval("SELECT count(*) FROM agentdb_demo.consumer_redeliveries") == 1
    assert await admin_conn.fetchval("SELECT count(*) FROM agentdb_demo.provider_requests") == 0


# Per crash point: what the provider sees, and what becomes of the charge in
# agentdb's ledger. A crash before the charge reached the provider leaves no
# effect: the next attempt's reconcile hook finds none, the operation is
# recorded failed and re-armed, and the one call it is granted executes. A
# crash after the effect is reconciled from the provider, never called again.
_G13 = {
    # Killed before the reservation was written: nothing reserved, nothing called.
    "before_reserve_commit": (
        [("charge", "executed"), ("email", "executed")],
        ["operation.reserved", "operation.succeeded"],
    ),
    "after_reserve": (
        [("charge", "executed"), ("email", "executed")],
        ["operation.reserved", "operation.failed", "operation.retried", "operation.succeeded"],
    ),
    "during_call": (
        [("charge", "received"), ("charge", "executed"), ("email", "executed")],
        ["operation.reserved", "operation.failed", "operation.retried", "operation.succeeded"],
    ),
    "after_call": (
        [("charge", "executed"), ("email", "executed")],
        ["operation.reserved", "operation.reconciled"],
    ),
    "after_complete": (
        [("charge", "executed"), ("email", "executed")],
        ["operation.reserved", "operation.succeeded"],
    ),
    "before_group_commit": (
        [("charge", "executed"), ("email", "executed")],
        ["operation.reserved", "operation.succeeded"],
    ),
}


@pytest.mark.parametrize("point", list(_G13))
async def test_G13_crash_around_the_provider_call_never_duplicates_the_effect(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection,
    demo_tables: None, tmp_path: Path, point: str,
) -> None:  # fmt: skip
    task_id = await _one_task(pool, tenants.a)
    fault_log = tmp_path / "faults"
    _killed_at(_start(db, "worker", f"{point}=1", fault_log), fault_log, point)
    worker = _start(db, "worker")
    try:
        await _wait(admin_conn, "SELECT count(*) FROM agent_tasks WHERE state = 'succeeded'", 1)
    finally:
        _stop(worker)
    effects = await admin_conn.fetch(
        "SELECT action, count(*) AS n FROM agentdb_demo.provider_effects WHERE task_id = $1"
        " GROUP BY action ORDER BY action",
        task_id,
    )
    assert [(r["action"], r["n"]) for r in effects] == [("charge", 1), ("email", 1)]
    states = await admin_conn.fetch(
        "SELECT state FROM agent_operations WHERE task_id = $1", task_id
    )
    assert sorted(r["state"] for r in states) == ["succeeded", "succeeded"]
    # Effects alone would pass a worker that called the provider again blindly:
    # the key would answer it. The requests and the replay rule do not.
    await _assert_no_replay(admin_conn, tenants.a)
    requests, charge_events = _G13[point]
    assert await _requests(admin_conn, task_id) == requests
    events = await admin_conn.fetch(
        "SELECT e.event_type FROM agent_events e JOIN agent_operations o"
        " ON o.tenant_id = e.tenant_id AND o.id = e.operation_id"
        " WHERE o.task_id = $1 AND o.action = 'charge' ORDER BY e.id",
        task_id,
    )
    assert [r["event_type"] for r in events] == charge_events


async def test_G13_G7_a_crash_between_group_commits_loses_no_success_and_repeats_no_effect(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection,
    demo_tables: None, tmp_path: Path,
) -> None:  # fmt: skip
    """Four tasks run together in one worker, which SIGKILLs itself as its first flush of
    successes begins: their effects are done and recorded, no success is written. A
    fresh worker takes them over when the leases expire: each succeeds once, no effect
    is performed again (a task killed inside a provider call is the kill's, not the
    flush's: its request was received and not executed, and is sent again)."""
    ids = [
        (await tasks.create(pool, tenants.a, TASK_TYPE, params={"invoice": i, "amount": 5},
                            lease_ttl=timedelta(seconds=1))).id
        for i in range(4)
    ]  # fmt: skip
    fault_log = tmp_path / "faults"
    proc = _start(db, "worker", "before_group_commit=1", fault_log)
    _killed_at(proc, fault_log, "before_group_commit")
    succeeded = "SELECT count(*) FROM agent_tasks WHERE state = 'succeeded'"
    assert await admin_conn.fetchval(succeeded) == 0
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_outbox") == 0
    done_before = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_operations WHERE state = 'succeeded'"
    )
    assert done_before >= 2  # the first task's charge and email, at least, were done
    worker = _start(db, "worker")
    try:
        await _wait(admin_conn, succeeded, 4)
    finally:
        _stop(worker)
    for task_id in ids:
        effects = await admin_conn.fetch(
            "SELECT action, count(*) AS n FROM agentdb_demo.provider_effects WHERE task_id = $1"
            " GROUP BY action ORDER BY action",
            task_id,
        )
        assert [(r["action"], r["n"]) for r in effects] == [("charge", 1), ("email", 1)]
        events = await admin_conn.fetchval(
            "SELECT count(*) FROM agent_events WHERE task_id = $1"
            " AND event_type = 'task.succeeded'",
            task_id,
        )
        assert events == 1
        outbox = "SELECT count(*) FROM agent_outbox WHERE task_id = $1"
        assert await admin_conn.fetchval(outbox, task_id) == 1  # invoice.paid, once
    await _assert_no_replay(admin_conn, tenants.a)
