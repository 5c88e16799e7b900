"""The testing kit's fixtures: real Postgres for handler tests (registered by ``plugin``).

Installed with ``pip install 'agentdb-pg[testing]'``; pytest loads it by itself.

==========================  =======  =================================================
fixture                     scope    what
==========================  =======  =================================================
``agentdb_server``          session  the server: ``$AGENTDB_TEST_DSN``, else an embedded one
``agentdb_template``        session  the name of a database migrated once, to clone
``agentdb_clones``          session  copies of the template, four made ahead (in threads)
``agentdb_db``              test     a fresh clone (:class:`~agentdb.testing.Database`)
``agentdb_login``           session  ``(user, password)`` the pools log in as; ``None``: admin
``agentdb_pool``            test     an agentdb pool on ``agentdb_db``
``agentdb_tenant``          test     a tenant id in ``agentdb_db``
``agentdb_bouncer``         session  a PgBouncer in transaction mode in front of the server
``agentdb_bouncer_logins``  session  ``((user, password), ...)`` PgBouncer lets in
``agentdb_pooled_db``       test     ``agentdb_db`` reached through ``agentdb_bouncer``
``agentdb_pooled_pool``     test     a pool through it, with ``pooler="transaction"``
==========================  =======  =================================================

Session fixtures are synchronous and hand out strings and frozen objects only:
a pool or connection is bound to the event loop that opened it, and
pytest-asyncio gives each test its own loop by default. The pools are
function-scoped async fixtures, so they live on the test's loop. Override
``agentdb_server``, ``agentdb_template`` or ``agentdb_login`` in a
``conftest.py`` to bring a server, a template of your own (your tables
migrated too) or your application's role.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from agentdb import _db, tenancy
from agentdb.testing._postgres import (
    Clones,
    Database,
    Server,
    clones,
    migrated_template,
    provision,
)
from agentdb.tools.pgbouncer import Bouncer, pgbouncer

Login = tuple[str, str | None]


@pytest.fixture(scope="session")
def agentdb_server() -> Iterator[Server]:
    """The PostgreSQL of this session: ``$AGENTDB_TEST_DSN``, else an embedded one.

    Raises:
        RuntimeError: the DSN cannot be reached, or the embedded server cannot start.
    """
    with contextlib.ExitStack() as stack:
        yield provision(stack)


@pytest.fixture(scope="session")
def agentdb_template(agentdb_server: Server) -> Iterator[str]:
    """A database migrated once per session, which each test's database is cloned from.

    Raises:
        MigrationError: the migrations failed.
    """
    with migrated_template(agentdb_server) as name:
        yield name


@pytest.fixture(scope="session")
def agentdb_clones(agentdb_server: Server, agentdb_template: str) -> Iterator[Clones]:
    """Where ``agentdb_db`` gets its copies: four made ahead, dropped behind (in threads)."""
    with clones(agentdb_server, agentdb_template) as made:
        yield made


@pytest.fixture
def agentdb_db(agentdb_server: Server, agentdb_clones: Clones) -> Iterator[Database]:
    """A migrated database of this test's own (a clone of the template), dropped after it."""
    name = agentdb_clones.take()
    try:
        yield Database(agentdb_server, name)
    finally:
        agentdb_clones.give_back(name)


@pytest.fixture(scope="session")
def agentdb_login() -> Login | None:
    """The login ``agentdb_pool`` uses: ``None`` for the server's admin (override it)."""
    return None


def _dsn(db: Database, login: Login | None) -> str:
    return db.dsn if login is None else db.url(*login)


@pytest_asyncio.fixture
async def agentdb_pool(
    agentdb_db: Database, agentdb_login: Login | None
) -> AsyncIterator[_db.Pool]:
    """A pool on this test's database (closed after the test, on the test's event loop)."""
    pool = await _db.create_pool(_dsn(agentdb_db, agentdb_login), min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest_asyncio.fixture
async def agentdb_tenant(agentdb_db: Database) -> uuid.UUID:
    """A tenant registered in this test's database."""
    conn = await _db.connect(agentdb_db.dsn)
    try:
        return await tenancy.create_tenant(conn, "test tenant")
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def agentdb_bouncer_logins(agentdb_server: Server) -> tuple[Login, ...]:
    """The logins PgBouncer lets in, with the password it presents upstream (the admin's)."""
    parts = urlsplit(agentdb_server.admin_dsn)
    return ((parts.username or "postgres", parts.password),)


@pytest.fixture(scope="session")
def agentdb_bouncer(
    agentdb_server: Server, agentdb_bouncer_logins: tuple[Login, ...]
) -> Iterator[Bouncer]:
    """A PgBouncer (transaction pooling) in front of the server; needs the ``pgbouncer`` binary.

    Raises:
        ConfigurationError: there is no pgbouncer binary, or it did not start.
    """
    logins = {user: password or "" for user, password in agentdb_bouncer_logins}
    with pgbouncer(agentdb_server.admin_dsn, logins, pool_size=3) as running:
        yield running


@pytest.fixture
def agentdb_pooled_db(agentdb_db: Database, agentdb_bouncer: Bouncer) -> Database:
    """``agentdb_db``, every DSN of it pointed at the PgBouncer (same logins, same rows)."""
    through = Server(agentdb_bouncer.url(agentdb_db.server.admin_dsn), "pgbouncer")
    return Database(through, agentdb_db.name)


@pytest_asyncio.fixture
async def agentdb_pooled_pool(
    agentdb_pooled_db: Database, agentdb_login: Login | None
) -> AsyncIterator[_db.Pool]:
    """A pool through PgBouncer with ``pooler="transaction"`` (no named prepared statements)."""
    pool = await _db.create_pool(
        _dsn(agentdb_pooled_db, agentdb_login), min_size=1, max_size=4, pooler="transaction"
    )
    yield pool
    await pool.close()
