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

from agentdb import testing
from agentdb.testing._postgres import ROLE_LOCK, migrated_template
from agentdb.tools.pgbouncer import Bouncer
from tests import _pg

RUNTIME = "agentdb_test_runtime"
AGENT_A = "agentdb_test_agent_a"
AGENT_B = "agentdb_test_agent_b"
AGENT_UNPINNED = "agentdb_test_agent_free"
STRANGER = "agentdb_test_stranger"
# What an operator's console logs in as (unpinned: it scopes each transaction).
OPERATOR = "agentdb_test_operator"
# tests/citus needs a Citus cluster (make test-citus); no registry ships one.
collect_ignore = [] if os.environ.get("AGENTDB_CITUS_DSN") else ["citus"]
# Cluster-wide lock so two test sessions on one server don't race on CREATE ROLE.
_ROLE_LOCK = ROLE_LOCK


@pytest.fixture(scope="session")
def pg_server() -> Iterator[_pg.Server]:
    with contextlib.ExitStack() as stack:
        yield _pg.provision(stack)


# The testing kit's plugin (agentdb.testing.plugin) provides agentdb_db, agentdb_pool
# and agentdb_tenant; the suite feeds it its own server, template and login, and
# its db / pool / tenants fixtures are thin wrappers over the plugin's.
@pytest.fixture(scope="session")
def agentdb_server(pg_server: _pg.Server) -> _pg.Server:
    return pg_server


@pytest.fixture(scope="session")
def agentdb_template(template_db: str) -> str:
    return template_db


@pytest.fixture(scope="session")
def agentdb_login() -> tuple[str, str]:
    """The plugin's pools log in as the runtime role - what workers use."""
    return RUNTIME, _pg.TEST_PASSWORD


@pytest.fixture(scope="session")
def agentdb_bouncer_logins(pg_server: _pg.Server) -> tuple[tuple[str, str | None], ...]:
    # Runs before the plugin's agentdb_bouncer starts: install the binary if we may.
    _pg.ensure_pgbouncer()
    parts = urlsplit(pg_server.admin_dsn)
    roles = (RUNTIME, AGENT_A, AGENT_B, AGENT_UNPINNED, STRANGER, OPERATOR)
    admin = (parts.username or "postgres", parts.password or "")
    return (admin, *((role, _pg.TEST_PASSWORD) for role in roles))


@pytest.fixture(scope="session")
def bouncer(template_db: str, agentdb_bouncer: Bouncer) -> Bouncer:
    """A real PgBouncer in transaction pooling mode in front of the session's server."""
    return agentdb_bouncer


@pytest.fixture(scope="session")
def template_db(pg_server: _pg.Server) -> Iterator[str]:
    """A database migrated once per session with agentdb's migrations, plus the test roles."""
    with migrated_template(pg_server) as name:
        with _pg.admin(pg_server.admin_dsn) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_ROLE_LOCK,))
            try:
                agents = dict.fromkeys((AGENT_A, AGENT_B, AGENT_UNPINNED), "agentdb_agent")
                _pg.ensure_roles(
                    pg_server,
                    {
                        RUNTIME: "agentdb_runtime",
                        **agents,
                        STRANGER: None,
                        OPERATOR: "agentdb_operator",
                    },
                )
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
class Database(testing.Database):
    """One migrated database for one test (the plugin's, with the test roles' password)."""

    def through(self, bouncer: Bouncer, user: str | None = None) -> str:
        """This database's DSN through ``bouncer`` (as the admin, or as ``user``)."""
        return bouncer.url(self.admin_dsn if user is None else self.url(user))

    def url(self, user: str, password: str | None = _pg.TEST_PASSWORD) -> str:
        return super().url(user, password)

    async def connect(self, user: str | None = None) -> asyncpg.Connection:
        return await asyncpg.connect(self.admin_dsn if user is None else self.url(user))


@pytest.fixture
def db(agentdb_db: testing.Database) -> Database:
    return Database(agentdb_db.server, agentdb_db.name)


@dataclass(frozen=True)
class Tenants:
    a: uuid.UUID
    b: uuid.UUID


@pytest.fixture
async def tenants(db: Database, agentdb_tenant: uuid.UUID) -> Tenants:
    """Two tenants (a is the plugin's); AGENT_A and AGENT_B are pinned to them."""
    t = Tenants(agentdb_tenant, uuid.uuid4())
    conn = await db.connect()
    try:
        await conn.execute("INSERT INTO agent_tenants (id, name) VALUES ($1, 'tenant b')", t.b)
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
async def other_conn(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A second connection (the superuser's), for interleavings against another one."""
    conn = await asyncpg.connect(db.dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def runtime_conn(db: Database) -> AsyncIterator[asyncpg.Connection]:
    """A login that is a member of agentdb_runtime: what workers connect as."""
    conn = await db.connect(RUNTIME)
    yield conn
    await conn.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On Citus (make test-citus) deselect the tests marked plain_postgres - and say why.

    Deselected, not skipped: each carries the reason it cannot hold there, and
    the run lists them.
    """
    if not _pg.ON_CITUS:
        return
    plain = [item for item in items if item.get_closest_marker("plain_postgres")]
    if not plain:
        return
    config.hook.pytest_deselected(items=plain)
    items[:] = [item for item in items if item not in plain]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for item in plain:
        marker = item.get_closest_marker("plain_postgres")
        reason = marker.args[0] if marker and marker.args else "?"
        if reporter is not None:
            reporter.write_line(f"agentdb: not on Citus: {item.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that skipped a test is a failed run: skips hide a broken setup."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter is not None:
            reporter.write_line(f"agentdb: {skipped} test(s) skipped - that is a failure here")


@pytest.fixture
def pool(agentdb_pool: asyncpg.Pool) -> asyncpg.Pool:
    """The plugin's pool: logged in as the runtime role (agentdb_login) - what workers use."""
    return agentdb_pool
