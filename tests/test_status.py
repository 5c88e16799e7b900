"""`agentdb status`: per tenant and overall, from the database, as a table or JSON."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from agentdb import _db, budgets, leases, operations, outbox, tasks, tenancy
from agentdb.retention import DEFAULT_AGES
from agentdb.status import Snapshot, TenantStatus, snapshot
from agentdb.tools.status import to_json, to_table
from tests import factories as F
from tests._procs import stop_workers, worker_processes
from tests.conftest import RUNTIME, Database, Tenants


def _status(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", "status", "--dsn", db.admin_dsn, *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


async def test_status_counts_match_the_database(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    for _ in range(3):
        await tasks.create(pool, tenants.a, "t")
    await tasks.create(pool, tenants.b, "other")
    [held] = await leases.claim(pool, "w1", task_types=["t"])
    await F.expire_lease(admin_conn, held.id)  # a worker died holding it
    res = await operations.reserve(pool, tenants.a, held.id, "k", "a", {})
    await operations.mark_unknown(pool, res.operation, error="timeout")
    # Two more reserved and left so: a worker that died before its call. (Counted too: a
    # generated mutant dropping 'reserved' from the statement survived without this.)
    for key in ("r1", "r2"):
        await operations.reserve(pool, tenants.a, held.id, key, "a", {})
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "x", {})
        await outbox.enqueue(conn, tenants.b, "x", {})
    await admin_conn.execute(
        "UPDATE agent_outbox SET state = 'dead' WHERE tenant_id = $1", tenants.b
    )

    out = _status(db, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["version"] == 1
    assert doc["migrations"]["applied"] == doc["migrations"]["shipped"]
    a = next(t for t in doc["tenants"] if t["tenant_id"] == str(tenants.a))
    b = next(t for t in doc["tenants"] if t["tenant_id"] == str(tenants.b))
    assert (a["tasks"]["pending"], a["tasks"]["running"], a["expired_leases"]) == (2, 1, 1)
    assert a["operations_unsettled"]["unknown"] == 1
    assert a["operations_unsettled"]["reserved"] == 2
    assert (a["outbox"]["pending"], a["outbox"]["dead"]) == (1, 0)
    assert a["outbox"]["oldest_pending_seconds"] >= 0
    assert (b["tasks"]["pending"], b["outbox"]["pending"], b["outbox"]["dead"]) == (1, 0, 1)
    assert doc["total"]["tasks"]["pending"] == 3
    assert set(doc["purge_backlog"]) == {"event_payloads", "events", "outbox_delivered", "inbox"}

    table = _status(db)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("agentdb status at ")
    assert lines[1] == "tasks"
    assert lines[2].split()[:3] == ["tenant", "pending", "waiting"]
    assert lines[3].split()[:4] == ["ALL", "3", "0", "1"]
    delivery = lines.index("delivery")
    assert lines[delivery + 1].split()[:3] == ["tenant", "unknown", "ops"]
    assert lines[delivery + 2].split()[:3] == ["ALL", "1", "1"]  # 1 unknown op, 1 pending
    assert lines[-1].startswith("purge backlog: ")
    assert max(len(line) for line in lines) <= 100


def test_status_watch_json_is_json_lines(db: Database, tenants: Tenants) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "status", "--dsn", db.admin_dsn, "--json",
         "--watch", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert [d["version"] for d in docs] == [1, 1, 1]
    assert all("tenants" in d for d in docs)


def test_status_migrations_and_bad_watch(db: Database) -> None:
    listing = _status(db, "--migrations")
    assert listing.stdout.split()[:2] == ["0001.foundation", "applied"]
    bad = _status(db, "--watch", "0")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1


async def test_status_shows_claiming_g18(
    db: Database, tenants: Tenants, pool: asyncpg.Pool
) -> None:
    """Due work, its age and running vs cap per tenant: what a fairness question needs."""
    past = datetime.now(UTC) - timedelta(seconds=90)  # a's work has waited a while
    for _ in range(4):
        await tasks.create(pool, tenants.a, "t", wake_at=past)
    await tasks.create(pool, tenants.b, "t")
    await tasks.create(pool, tenants.b, "later", wake_at=datetime.now(UTC) + timedelta(hours=1))
    await tenancy.set_concurrency_limit(pool, tenants.a, 2)
    await tenancy.set_concurrency_limit(pool, tenants.a, 1, task_type="t")
    [held] = await leases.claim(pool, "w1", task_types=["t"], batch=1)
    assert held.tenant_id in (tenants.a, tenants.b)

    doc = json.loads(_status(db, "--json").stdout)
    a = next(t for t in doc["tenants"] if t["tenant_id"] == str(tenants.a))
    b = next(t for t in doc["tenants"] if t["tenant_id"] == str(tenants.b))
    a_running = 1 if held.tenant_id == tenants.a else 0
    assert a["due"] == 4 - a_running
    assert a["oldest_due_seconds"] >= 90
    assert a["limits"] == {
        "*": {"running": a_running, "max_running": 2},
        "t": {"running": a_running, "max_running": 1},
    }
    assert b["due"] == a_running  # b's one due task, unless it is the one claimed; not the sleeper
    assert b["limits"] == {}
    assert doc["total"]["due"] == a["due"] + b["due"]

    lines = _status(db).stdout.splitlines()
    at = lines.index("claiming (G18)")
    assert lines[at + 1].split()[:3] == ["tenant", "due", "now"]
    row_a = next(line for line in lines[at:] if f"({str(tenants.a)[:8]})" in line)
    assert f"{a_running}/2" in row_a
    assert f"t {a_running}/1" in row_a
    assert max(len(line) for line in lines) <= 100


async def test_G19_status_shows_budgets_used_held_limit_and_rate_limits(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = (await tasks.create(pool, tenants.a, "llm", params={})).id
    await budgets.set_budget(pool, tenants.a, "tokens", 10_000)
    await budgets.set_rate_limit(pool, tenants.a, "chat", 7, timedelta(minutes=1))
    done = await operations.reserve(pool, tenants.a, task, "a", "chat", {}, cost={"tokens": 3_000})
    await operations.complete(pool, done.operation, cost={"tokens": 1_200})
    await operations.reserve(pool, tenants.a, task, "b", "chat", {}, cost={"tokens": 2_000})
    snap = await snapshot(pool)
    [mine] = [t for t in snap.tenants if t.tenant_id == tenants.a]
    doc = to_json(snap)
    [tj] = [t for t in doc["tenants"] if t["tenant_id"] == str(tenants.a)]
    assert tj["budgets"] == [
        {"unit": "tokens", "task_id": None, "period": "total", "spent": 1_200, "held": 2_000,
         "limit": 10_000, "remaining": 6_800}
    ]  # fmt: skip
    assert tj["rate_limits"] == [{"action": "chat", "used": 2, "max_calls": 7, "per_seconds": 60.0}]
    assert mine.budgets[0].remaining == 6_800
    text = to_table(snap)
    assert "budgets (G19)" in text
    assert "rate limits (G19)" in text
    assert all(len(line) <= 100 for line in text.splitlines())


async def test_status_names_the_oldest_open_transaction_that_holds_back_cleanup(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    """A forgotten REPEATABLE READ transaction is named (pid, login, application, state, age);
    an open READ COMMITTED one between statements holds nothing back and is not. Read as the
    admin: other logins' transactions show only to pg_read_all_stats."""
    assert (await snapshot(admin_conn)).oldest_transaction is None
    holder = await db.connect()
    try:
        await holder.execute("SET application_name = 'forgotten report'")
        # READ COMMITTED, between statements: no snapshot, no transaction id (a simple
        # query: one that read the catalogs would keep their snapshot until the next).
        await holder.execute("BEGIN; SELECT 1")
        assert (await snapshot(admin_conn)).oldest_transaction is None
        await holder.execute("ROLLBACK")
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM agent_tasks")  # the snapshot is taken
        s = await snapshot(admin_conn)
        old = s.oldest_transaction
        assert old is not None
        assert old.pid == await holder.fetchval("SELECT pg_backend_pid()")
        assert (old.application_name, old.state) == ("forgotten report", "idle in transaction")
        assert old.login == await holder.fetchval("SELECT current_user")
        assert old.seconds >= 0
        assert to_json(s)["oldest_transaction"]["pid"] == old.pid
        assert to_table(s).splitlines()[-1].startswith("oldest open transaction: ")
        await holder.execute("ROLLBACK")
        assert (await snapshot(admin_conn)).oldest_transaction is None
    finally:
        await holder.close()


async def test_status_as_the_runtime_role_passes_over_another_login_s_hidden_transaction(
    db: Database, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """The runtime role has no pg_read_all_stats: a superuser's REPEATABLE READ transaction
    shows to it with its snapshot (backend_xmin) but not its start (xact_start NULL). Its
    status names no oldest transaction - it cannot say how old - and does not fail on the
    age it cannot read; the admin's names it (the positive control). Kills generated
    ``gen-status-status_oldest_transaction-and-3`` (the hidden row read, its NULL age)."""
    holder = await db.connect()
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM agent_tasks")  # the snapshot is taken
        pid = await holder.fetchval("SELECT pg_backend_pid()")
        async with pool.acquire() as runtime:
            hidden = await runtime.fetchrow(
                "SELECT xact_start, backend_xmin FROM pg_stat_activity WHERE pid = $1", pid
            )
            assert hidden is not None
            assert hidden["xact_start"] is None
            assert hidden["backend_xmin"] is not None
            assert (await snapshot(runtime)).oldest_transaction is None
        old = (await snapshot(admin_conn)).oldest_transaction
        assert old is not None
        assert old.pid == pid
        await holder.execute("ROLLBACK")
    finally:
        await holder.close()


def test_the_docs_show_the_tables_status_prints() -> None:
    """The docs' `agentdb status` example (Operating) has each table's title and head line
    as to_table prints them (it once showed one wide table where three are printed)."""
    page = Path(__file__).resolve().parent.parent / "docs" / "deploy" / "operating.md"
    readme = page.read_text()
    example = readme.split('$ agentdb status --dsn "$DATABASE_URL"\n', 1)[1].split("```", 1)[0]
    total = TenantStatus(None, "ALL")
    backlog = dict.fromkeys(("event_payloads", "events", "outbox_delivered", "inbox"), 0)
    printed = to_table(Snapshot(datetime.now(UTC), [], total, backlog))
    titles = [line for line in printed.splitlines() if line and line[0] != " " and "  " not in line]
    heads = [line for line in printed.splitlines() if line.startswith("tenant ")]
    assert titles[:3] == ["tasks", "delivery", "claiming (G18)"], printed
    assert len(heads) == 3, printed
    shown = [" ".join(line.split()) for line in example.splitlines()]  # widths follow the rows
    for line in [*titles[:3], *heads]:
        assert " ".join(line.split()) in shown, line


async def test_status_lists_the_workers_and_relays_connected_with_their_node(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    """A worker's and a relay's sessions are named ('agentdb worker <id>', 'agentdb relay
    <id>': the CLI names its pools so) and status lists each with the server they are on
    and how many sessions it holds; other sessions are not listed. On Citus the node is
    the one each was pointed at (tests/citus/test_citus_nodes.py)."""
    pool = await _db.create_pool(
        db.url(RUNTIME), min_size=2, max_size=2, application_name="agentdb worker w-status"
    )
    relay = await db.connect()
    other = await db.connect()
    try:
        await relay.execute("SET application_name = 'agentdb relay r-status'")
        await other.execute("SET application_name = 'agentdb-ish report'")
        s = await snapshot(admin_conn)
        port = await admin_conn.fetchval("SELECT current_setting('port')::int")
        mine = {(p.kind, p.owner, p.sessions) for p in s.processes}
        assert mine == {("worker", "w-status", 2), ("relay", "r-status", 1)}, s.processes
        assert all(p.node.endswith(f":{port}") for p in s.processes)
        assert {p["owner"] for p in to_json(s)["processes"]} == {"w-status", "r-status"}
        table = to_table(s)
        assert "workers and relays" in table
        assert "w-status" in table
    finally:
        await pool.close()
        await relay.close()
        await other.close()


async def test_status_lists_an_agentdb_worker_process_by_its_id(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    """`agentdb worker` names its pool's sessions, so a running worker process is listed
    under its own id (host:pid:random) with this server as its node."""
    procs = worker_processes(db.url(RUNTIME), "tests.fixture_handlers:RATED", 1, 1)
    try:
        found: list[Any] = []
        for _ in range(300):
            found = [p for p in (await snapshot(admin_conn)).processes if p.kind == "worker"]
            if found:
                break
            await asyncio.sleep(0.1)
        assert len(found) == 1, found
        assert f":{procs[0].pid}:" in found[0].owner
    finally:
        stop_workers(procs)


async def test_G9_an_event_whose_retention_ends_this_instant_is_in_the_purge_backlog(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The events purge takes an event at its retain_until (``<= now()``): the backlog
    counts it then too. Read in the transaction whose now() is that instant. Kills generated
    ``gen-status-status_purge_backlog-cmp-2`` (``<``: counted only after it)."""
    task = await tasks.create(pool, tenants.a, "t")
    async with admin_conn.transaction():
        before = (await snapshot(admin_conn)).purge_backlog["events"]
        await F.replica_mode(admin_conn)  # time passes: the append-only guard is off
        await admin_conn.execute(
            "UPDATE agent_events SET retain_until = now(), payload_expires_at = now()"
            " WHERE task_id = $1",
            task.id,
        )
        after = (await snapshot(admin_conn)).purge_backlog["events"]
    assert after == before + 1


async def test_G18_a_task_due_this_instant_is_counted_due(
    tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task is due at its wake-up instant (``wake_at <= now()``, as the claim takes it):
    created in the transaction that reads the status, whose now() is its wake_at, it is
    counted. Kills generated ``gen-status-status_due-cmp-1`` (``<``: not due until after)."""
    async with admin_conn.transaction():
        await tasks.create(admin_conn, tenants.a, "t")
        mine = [t for t in (await snapshot(admin_conn)).tenants if t.tenant_id == tenants.a]
        assert [t.due for t in mine] == [1]


async def test_G9_G10_G11_the_purge_backlog_counts_each_class_from_its_own_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """In one transaction, whose now() stands still, rows at each class's boundary: an event
    whose payload expires now but whose trail is kept a day, one whose trail ends now, one
    with no payload whose trail ends now; a message delivered exactly the outbox age ago,
    one delivered now, one pending; an inbox row processed exactly the inbox age ago, one
    processed now. The backlog counts what each purge takes (``<=``), class by class. Kills
    generated ``gen-status-status_purge_backlog-cmp-1`` (a payload counted only after its
    instant), ``-and-1`` (an event with no payload counted as one to strip), ``-and-2`` (an
    event whose trail is kept counted in the events), ``-cmp-4``, ``-cmp-5`` and ``-and-4``
    (the delivered messages: every other state, only after the age, or whatever their age)
    and ``-cmp-6`` (the inbox row counted only after its age)."""
    made = [await tasks.create(pool, tenants.a, "t-backlog") for _ in range(3)]
    async with admin_conn.transaction():
        before = (await snapshot(admin_conn)).purge_backlog
        await F.replica_mode(admin_conn)  # time passes: the append-only guard is off
        for task, (payload, retain) in zip(
            made,
            (('{"n": 1}', timedelta(days=1)), ('{"n": 2}', timedelta(0)), (None, timedelta(0))),
            strict=True,
        ):
            await admin_conn.execute(
                "UPDATE agent_events SET payload = $2::jsonb, payload_expires_at = now(),"
                " retain_until = now() + $3::interval WHERE tenant_id = $1 AND task_id = $4",
                tenants.a, payload, retain, task.id,
            )  # fmt: skip
        for state, ago in (("delivered", DEFAULT_AGES["outbox_delivered"]),
                           ("delivered", timedelta(0)), ("pending", None)):  # fmt: skip
            await admin_conn.execute(
                "INSERT INTO agent_outbox (tenant_id, topic, state, delivered_at)"
                " VALUES ($1, 'backlog', $2, now() - $3::interval)",
                tenants.a, state, ago,
            )  # fmt: skip
        for ago in (DEFAULT_AGES["inbox"], timedelta(0)):
            await admin_conn.execute(
                "INSERT INTO agent_inbox (tenant_id, consumer, message_id, processed_at)"
                " VALUES ($1, 'backlog', $2, now() - $3::interval)",
                tenants.a, uuid.uuid4(), ago,
            )  # fmt: skip
        after = (await snapshot(admin_conn)).purge_backlog
    grown = {k: after[k] - before[k] for k in after}
    assert grown == {"event_payloads": 2, "events": 2, "outbox_delivered": 1, "inbox": 1}
