"""The article's crash scenarios with real processes killed by SIGKILL at an exact step.

Each test arms one fault point (``AGENTDB_FAULTS``) in a worker or relay
process running the demo's handlers, lets it kill itself there, then
restarts it without faults and checks the outcome in the database: the
provider executed every effect once, and the consumer applied every message
once.
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
from agentdb.demo import _SCHEMA, TASK_TYPE
from tests.conftest import Database, Tenants

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def demo_tables(admin_conn: asyncpg.Connection) -> None:
    for statement in _SCHEMA:
        await admin_conn.execute(statement)


def _start(
    db: Database, kind: str, faults: str = "", fault_log: Path | None = None
) -> subprocess.Popen[str]:
    env = dict(os.environ, DATABASE_URL=db.admin_dsn, AGENTDB_FAULTS=faults, AGENTDB_DEMO_CALM="1")
    if fault_log is not None:
        env["AGENTDB_FAULTS_LOG"] = str(fault_log)
    target = "agentdb.demo:WORKER" if kind == "worker" else "agentdb.demo:PUBLISHER"
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


@pytest.mark.parametrize("point", ["after_reserve", "during_call", "after_call", "after_complete"])
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
