"""Through a real PgBouncer 1.18 in transaction pooling mode: the one switch makes every helper
work, forgetting it gives one line naming the switch, and no session state reaches the proxy's
shared server connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest

import agentdb
from agentdb import inbox, leases, operations, outbox, tasks, tenancy
from agentdb.errors import PoolerMismatch
from agentdb.models import Message, OutboxMessage
from agentdb.relay import Relay
from agentdb.tools.pgbouncer import Bouncer, pgbouncer
from tests import _pg, _procs
from tests.conftest import AGENT_UNPINNED, RUNTIME, Database, Tenants

pytestmark = pytest.mark.usefixtures("bouncer")


@pytest.fixture
async def pooled(db: Database, bouncer: Bouncer) -> AsyncIterator[asyncpg.Pool]:
    """The runtime login's pool through PgBouncer, with the switch."""
    pool = await agentdb.create_pool(
        db.through(bouncer, RUNTIME), min_size=2, max_size=8, pooler="transaction"
    )
    yield pool
    await pool.close()


async def _server_state(db: Database, bouncer: Bouncer, user: str) -> list[tuple[int, str, str]]:
    """(backend pid, search_path, agentdb.tenant_id) of every server connection PgBouncer has for
    ``user``: as many concurrent transactions as its pool has connections, each pinned to one."""
    conns = [
        await asyncpg.connect(db.through(bouncer, user), statement_cache_size=0) for _ in range(3)
    ]
    txs = [c.transaction() for c in conns]
    try:
        for tx in txs:
            await tx.start()
        rows = [
            await c.fetchrow(
                "SELECT pg_backend_pid() AS pid, current_setting('search_path') AS path,"
                " coalesce(current_setting('agentdb.tenant_id', true), '') AS tenant"
            )
            for c in conns
        ]
    finally:
        for tx in txs:
            await tx.rollback()
        for c in conns:
            await c.close()
    return sorted((r["pid"], r["path"], r["tenant"]) for r in rows if r is not None)


async def test_without_the_switch_a_lost_prepared_statement_names_the_switch(
    db: Database, bouncer: Bouncer, tenants: Tenants
) -> None:
    pool = await agentdb.create_pool(db.through(bouncer, RUNTIME), min_size=4, max_size=8)
    try:
        results = await asyncio.gather(
            *(tasks.get(pool, tenants.a, uuid.uuid4()) for _ in range(200)),
            return_exceptions=True,
        )
    finally:
        await pool.close()
    mismatches = [r for r in results if isinstance(r, PoolerMismatch)]
    others = [r for r in results if not isinstance(r, PoolerMismatch | agentdb.NotFound)]
    assert mismatches, "200 concurrent statements through 3 server connections never collided"
    assert others == []
    assert "AGENTDB_POOLER=transaction" in str(mismatches[0])
    assert "\n" not in str(mismatches[0])


async def test_G7_G10_G11_G12_the_whole_runtime_works_through_the_proxy_with_the_switch(
    pooled: asyncpg.Pool, tenants: Tenants, db: Database, bouncer: Bouncer
) -> None:
    made = await asyncio.gather(
        *(tasks.create(pooled, tenants.a, "t", params={"n": i}) for i in range(40))
    )
    claimed = await asyncio.gather(*(leases.claim(pooled, f"w{i}", batch=5) for i in range(8)))
    mine = [t for batch in claimed for t in batch]
    assert sorted(t.id for t in mine) == sorted(t.id for t in made)

    async def finish(task: agentdb.Task) -> None:
        assert task.lease is not None
        res = await operations.reserve(
            pooled, task.tenant_id, task.id, f"k-{task.id}", "send", task.params, lease=task.lease
        )
        await operations.complete(pooled, res.operation, result={"ok": 1}, lease=task.lease)
        await tasks.transition(
            pooled, task.tenant_id, task.id, expected_version=task.state_version,
            to_state="succeeded", lease=task.lease, outbox=[Message("done", {"id": str(task.id)})],
        )  # fmt: skip

    await asyncio.gather(*(finish(t) for t in mine))
    got: list[uuid.UUID] = []

    async def publish(message: OutboxMessage) -> None:
        async def apply(conn: object) -> None:
            got.append(message.id)

        await inbox.process_once(pooled, message.tenant_id, "c", message.id, apply)

    relays = [Relay(pooled, publish, batch=7, pooler="transaction") for _ in range(2)]
    await asyncio.gather(*(r.drain() for r in relays))
    assert len(got) == len(set(got)) == 40
    assert await pooled.fetchval("SELECT count(*) FROM agent_tasks WHERE state = 'running'") == 0
    assert await outbox.claim(pooled, "late") == []


async def test_G15_tenant_scope_and_migrations_leave_nothing_on_the_shared_connections(
    db: Database, bouncer: Bouncer, tenants: Tenants, pooled: asyncpg.Pool
) -> None:
    await tasks.create(pooled, tenants.a, "t")
    agents = await agentdb.create_pool(
        db.through(bouncer, AGENT_UNPINNED), min_size=1, max_size=3, pooler="transaction"
    )
    try:
        for _ in range(20):
            async with tenancy.tenant_scope(agents, tenants.a) as conn:
                assert await conn.fetchval("SELECT count(*) FROM agent_tasks") == 1
    finally:
        await agents.close()
    state = await _server_state(db, bouncer, AGENT_UNPINNED)
    assert len({pid for pid, _, _ in state}) == 3  # every server connection was looked at
    assert {(path, tenant) for _, path, tenant in state} == {('"$user", public', "")}


ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_quickstart_runs_through_the_proxy_with_the_switch(
    db: Database, bouncer: Bouncer
) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        cwd=ROOT,
        env=dict(os.environ, DATABASE_URL=db.through(bouncer), AGENTDB_POOLER="transaction"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "retry fresh=False" in out.stdout


def test_purge_and_tenant_delete_run_through_the_proxy_with_the_switch(
    db: Database, bouncer: Bouncer, tenants: Tenants
) -> None:
    url = db.through(bouncer)
    purged = _cli("purge", "--dsn", url, "--pooler", "transaction", "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout)["statements"] >= 6
    dry = _cli(
        "tenant", "delete", str(tenants.b), "--dsn", url, "--pooler", "transaction", "--dry-run"
    )
    assert dry.returncode == 0, dry.stderr
    done = _cli(
        "tenant",
        "delete",
        str(tenants.b),
        "--dsn",
        url,
        "--yes",
        env={"AGENTDB_POOLER": "transaction"},
    )
    assert done.returncode == 0, done.stderr
    assert "the tenant is gone" in done.stdout


def test_an_unknown_pooler_value_is_one_line(db: Database) -> None:
    bad = _cli("purge", "--dsn", db.admin_dsn, env={"AGENTDB_POOLER": "statement"})
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "unknown pooler 'statement'" in bad.stderr


def test_relays_without_the_switch_stop_with_one_line_naming_it_and_lose_nothing(
    db: Database, bouncer: Bouncer, tenants: Tenants
) -> None:
    with _pg.admin(db.admin_dsn) as conn:
        conn.execute(
            "INSERT INTO agent_outbox (tenant_id, topic)"
            " SELECT %s, 't' FROM generate_series(1, 600)",
            (tenants.a,),
        )
    url = db.through(bouncer, RUNTIME)
    # Open every server connection of the runtime's pool, so that round-robin hands
    # consecutive transactions to different ones from the first statement on.
    asyncio.run(_server_state(db, bouncer, RUNTIME))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentdb",
                "relay",
                "tests.fixture_handlers:quiet_publisher",
                "--dsn",
                url,
                "--no-listen",
                "--poll-interval",
                "0.05",
                "--batch",
                "20",
            ],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    for p, err in zip(procs, errs, strict=True):
        assert p.returncode == 2, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("agentdb: a transaction-pooling proxy is in the way"), err
        assert "AGENTDB_POOLER=transaction" in last
        assert "Traceback" not in err
    with _pg.admin(db.admin_dsn) as conn:
        states = dict(
            conn.execute("SELECT state, count(*) FROM agent_outbox GROUP BY state").fetchall()
        )
    assert sum(states.values()) == 600  # each message delivered or still pending: none lost
    assert set(states) <= {"pending", "delivered"}


def test_G10_G12_workers_and_two_relays_under_sigkill_through_the_proxy_lose_nothing(
    db: Database, bouncer: Bouncer
) -> None:
    """The demo's fleet (4 workers, 2 relays, SIGKILLs) with --dsn through PgBouncer."""
    run = _cli(
        "demo", "--dsn", db.through(bouncer), "--pooler", "transaction", "--tasks", "60",
        "--tenants", "3", "--kill-every", "0.5", "--timeout", "150", "--seed", "11",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK: every effect once" in run.stdout
    assert "tasks stuck                                             0" in run.stdout
    with _pg.admin(db.admin_dsn) as conn:
        running = conn.execute(
            "SELECT count(*) FROM agent_tasks WHERE state = 'running'"
        ).fetchone()
    assert running == (0,)


@pytest.fixture
def tiny_bouncer(db: Database) -> Iterator[Bouncer]:
    """A PgBouncer of its own with one server connection per database and login: a client
    that holds it in an open transaction makes every other one queue."""
    parts = urlsplit(db.admin_dsn)
    logins = {parts.username or "postgres": parts.password or ""}
    with pgbouncer(db.admin_dsn, logins, pool_size=1, binary=_pg.ensure_pgbouncer()) as running:
        yield running


@pytest.mark.parametrize(
    ("hold", "timeout", "stage"),
    [
        pytest.param("before-it-starts", 5, "migrating the database", id="queued-migrating"),
        pytest.param("once-the-fleet-runs", 20, "running the workload", id="queued-working"),
    ],
)
def test_a_demo_queued_in_a_tiny_pool_times_out_in_one_line_and_leaves_no_process(
    db: Database, tiny_bouncer: Bouncer, hold: str, timeout: int, stage: str, tmp_path: Path
) -> None:
    """The pool's one server connection held in a transaction: every statement of the demo
    and of its workers and relays waits in PgBouncer's queue, none ever returns, and the run
    cannot finish. It still ends by its --timeout, and takes its processes with it (its logs,
    kept for a run that failed, go to this test's own temp folder)."""
    url = db.through(tiny_bouncer)
    mark = uuid.uuid4().hex
    holder = psycopg.connect(url, autocommit=True, prepare_threshold=None)

    def hold_the_pool() -> None:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")  # PgBouncer pins its only server connection to this

    if hold == "before-it-starts":
        hold_the_pool()
    started = time.monotonic()
    demo = subprocess.Popen(
        [sys.executable, "-m", "agentdb", "demo", "--dsn", url, "--pooler", "transaction",
         "--tasks", "60", "--tenants", "3", "--timeout", str(timeout), "--seed", "11"],
        cwd=ROOT, env=_procs.marked_env(mark, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        if hold == "once-the-fleet-runs":
            assert _procs.wait_for_children(demo, mark, within=timeout), "no worker started"
            hold_the_pool()
        _, err = demo.communicate(timeout=timeout + 60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
        holder.close()
    took = time.monotonic() - started
    assert demo.returncode == 1, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"agentdb: demo timed out after {timeout}s while {stage}: "), err
    assert "the orderly stop hung" not in last  # the watchdog is a backstop, not the way out
    if stage == "running the workload":
        assert "of 60 tasks unfinished" in last
        assert "worker and relay logs:" in last
    assert took < timeout + 60  # generous: the bound is the deadline, not this machine's speed
    assert _procs.marked(mark) == []  # the demo reaped its processes before it exited


def test_the_audit_runs_through_the_proxy_again_and_again(db: Database, bouncer: Bouncer) -> None:
    """psycopg would prepare a statement it runs often; through the proxy that name would stay
    on a shared server connection and collide with the next run's."""
    direct = _cli("audit", "--dsn", db.admin_dsn, "--json")
    assert direct.returncode == 0, direct.stderr
    url = db.through(bouncer)
    for _ in range(3):
        result = _cli("audit", "--dsn", url, "--pooler", "transaction", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["findings"] == json.loads(direct.stdout)["findings"]
