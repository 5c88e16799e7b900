"""Session-wide PostgreSQL, a migrated template database, one clone per test.

Session fixtures yield plain strings and small frozen objects, never asyncpg
objects: those are bound to the event loop that made them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
import pytest
from psycopg import sql

from agentdb import migrate
from agentdb.tools.pgbouncer import Bouncer, pgbouncer
from tests import _pg

RUNTIME = "agentdb_test_runtime"
AGENT_A = "agentdb_test_agent_a"
AGENT_B = "agentdb_test_agent_b"
AGENT_UNPINNED = "agentdb_test_agent_free"
STRANGER = "agentdb_test_stranger"
# tests/citus needs a Citus cluster (make test-citus); no registry ships one.
collect_ignore = [] if os.environ.get("AGENTDB_CITUS_DSN") else ["citus"]
# Cluster-wide lock so two test sessions on one server don't race on CREATE ROLE.
_ROLE_LOCK = 0x61_67_65_6E_74_64_62


@pytest.fixture(scope="session")
def pg_server() -> Iterator[_pg.Server]:
    with contextlib.ExitStack() as stack:
        yield _pg.provision(stack)


@pytest.fixture(scope="session")
def bouncer(pg_server: _pg.Server, template_db: str) -> Iterator[Bouncer]:
    """A real PgBouncer in transaction pooling mode in front of the session's server."""
    binary = _pg.ensure_pgbouncer()
    parts = urlsplit(pg_server.admin_dsn)
    logins = {parts.username or "postgres": parts.password or ""}
    logins |= dict.fromkeys(
        (RUNTIME, AGENT_A, AGENT_B, AGENT_UNPINNED, STRANGER), _pg.TEST_PASSWORD
    )
    with pgbouncer(pg_server.admin_dsn, logins, pool_size=3, binary=binary) as running:
        yield running


@pytest.fixture(scope="session")
def template_db(pg_server: _pg.Server) -> Iterator[str]:
    """A database migrated once per session with agentdb's migrations."""
    with contextlib.ExitStack() as stack:
        name = stack.enter_context(_pg.temp_database(pg_server))
        with _pg.admin(pg_server.admin_dsn) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_ROLE_LOCK,))
            try:
                migrate.migrate(pg_server.url(name))
                _pg.ensure_role(conn, RUNTIME, member_of="agentdb_runtime")
                for role in (AGENT_A, AGENT_B, AGENT_UNPINNED):
                    _pg.ensure_role(conn, role, member_of="agentdb_agent")
                _pg.ensure_role(conn, STRANGER)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_ROLE_LOCK,))
        with _pg.admin(pg_server.url(name)) as conn:
            # A role with table privileges but no policy: RLS must show it nothing.
            conn.execute(
                sql.SQL("GRANT SELECT ON agent_tasks, agent_events TO {}").format(
                    sql.Identifier(STRANGER)
                )
            )
        yield name


@dataclass(frozen=True)
class Database:
    """One migrated database for one test."""

    server: _pg.Server
    name: str

    @property
    def admin_dsn(self) -> str:
        return self.server.url(self.name)

    def through(self, bouncer: Bouncer, user: str | None = None) -> str:
        """This database's DSN through ``bouncer`` (as the admin, or as ``user``)."""
        return bouncer.url(self.admin_dsn if user is None else self.url(user))

    def url(self, user: str) -> str:
        return self.server.url(self.name, user=user, password=_pg.TEST_PASSWORD)

    async def connect(self, user: str | None = None) -> asyncpg.Connection:
        return await asyncpg.connect(self.admin_dsn if user is None else self.url(user))


@pytest.fixture
def db(pg_server: _pg.Server, template_db: str) -> Iterator[Database]:
    with _pg.temp_database(pg_server, template=template_db) as name:
        yield Database(pg_server, name)


@dataclass(frozen=True)
class Tenants:
    a: uuid.UUID
    b: uuid.UUID


@pytest.fixture
async def tenants(db: Database) -> Tenants:
    """Two tenants; AGENT_A and AGENT_B are pinned to them."""
    t = Tenants(uuid.uuid4(), uuid.uuid4())
    conn = await db.connect()
    try:
        await conn.execute(
            "INSERT INTO agent_tenants (id, name) VALUES ($1, 'tenant a'), ($2, 'tenant b')",
            t.a,
            t.b,
        )
        await conn.execute(
            "INSERT INTO agent_principals (role_name, tenant_id) VALUES ($1, $2), ($3, $4)",
            AGENT_A,
            t.a,
            AGENT_B,
            t.b,
        )
    finally:
        await conn.close()
    return t


@pytest.fixture
async def admin_conn(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A superuser connection (bypasses RLS; used for setup and owner-level attacks)."""
    conn = await db.connect()
    yield conn
    await conn.close()


@pytest.fixture
async def runtime_conn(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A login that is a member of agentdb_runtime: what workers connect as."""
    conn = await db.connect(RUNTIME)
    yield conn
    await conn.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that skipped a test is a failed run: skips hide a broken setup."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(f"agentdb: {skipped} test(s) skipped - that is a failure here")


@pytest.fixture
async def pool(db: Database) -> AsyncIterator[asyncpg.Pool]:
    """A pool logged in as the runtime role - what workers use."""
    p = await asyncpg.create_pool(db.url(RUNTIME), min_size=1, max_size=4)
    yield p
    await p.close()
