"""Where the testing kit gets its PostgreSQL: a server, a migrated template, a clone per test.

The server is ``$AGENTDB_TEST_DSN`` when set (a role that may CREATE DATABASE),
else an embedded PostgreSQL (``pgserver``: binaries from a wheel) started in a
temporary directory. The template is migrated once; each test gets a copy
(``CREATE DATABASE ... TEMPLATE``), which takes milliseconds, and it is
dropped afterwards.

Everything here is synchronous and hands out plain strings and frozen
objects, so session-scoped fixtures never hold something bound to an event
loop.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

__all__ = [
    "ROLE_LOCK",
    "Database",
    "Server",
    "admin",
    "create_database",
    "drop_database",
    "migrated_template",
    "provision",
    "temp_database",
    "with_db",
]

#: A cluster-wide advisory lock: migrations create agentdb's roles, which are
#: cluster-wide, and two test sessions on one server must not race on CREATE ROLE.
ROLE_LOCK = 0x61_67_65_6E_74_64_62


@dataclass(frozen=True)
class Server:
    """A PostgreSQL server the tests may create databases (and roles) on."""

    admin_dsn: str
    source: str

    def url(self, dbname: str, user: str | None = None, password: str | None = None) -> str:
        """This server's DSN for database ``dbname`` (as the admin, or as ``user``)."""
        return with_db(self.admin_dsn, dbname, user=user, password=password)


@dataclass(frozen=True)
class Database:
    """One migrated database for one test (``dsn`` logs in as the server's admin)."""

    server: Server
    name: str

    @property
    def dsn(self) -> str:
        return self.server.url(self.name)

    @property
    def admin_dsn(self) -> str:
        return self.dsn

    def url(self, user: str, password: str | None = None) -> str:
        """This database's DSN for the login ``user``."""
        return self.server.url(self.name, user=user, password=password)


def with_db(dsn: str, dbname: str, *, user: str | None = None, password: str | None = None) -> str:
    """Return ``dsn`` pointed at another database and, optionally, another login."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if user is not None:
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{user}:{password}@{host}" if password else f"{user}@{host}"
    return urlunsplit((parts.scheme, netloc, f"/{dbname}", parts.query, parts.fragment))


def admin(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection (CREATE DATABASE cannot run in a transaction).

    Raises:
        psycopg.OperationalError: the server cannot be reached.
    """
    return psycopg.connect(dsn, autocommit=True)


def provision(stack: contextlib.ExitStack) -> Server:
    """``$AGENTDB_TEST_DSN`` if set, else an embedded PostgreSQL that ``stack`` stops.

    Raises:
        RuntimeError: the DSN cannot be reached, or there is no DSN and the
            embedded server cannot start (pgserver missing) - saying how to provide one.
    """
    dsn = os.environ.get("AGENTDB_TEST_DSN")
    if dsn:
        try:
            with admin(dsn):  # fail now, with the reason, if it cannot be reached
                pass
        except psycopg.Error as exc:
            raise RuntimeError(f"AGENTDB_TEST_DSN cannot be reached: {exc}") from exc
        return Server(dsn, "AGENTDB_TEST_DSN")
    from agentdb.errors import ConfigurationError
    from agentdb.tools.embedded import embedded_postgres

    try:
        return Server(stack.enter_context(embedded_postgres(migrate=False)), "embedded")
    except ConfigurationError as exc:
        raise RuntimeError(
            "no PostgreSQL for the tests: set AGENTDB_TEST_DSN=postgresql://user@host/postgres "
            "(a role that may CREATE DATABASE) or pip install 'agentdb-pg[testing]' for the "
            f"embedded server ({exc})"
        ) from exc


def create_database(
    server: Server, *, template: str | None = None, owner: str | None = None
) -> str:
    """Create a database with a fresh name (a copy of ``template`` when given, owned by
    ``owner`` when given); return its name.

    Raises:
        psycopg.Error: the server refused (e.g. the template is in use by a session).
    """
    name = f"agentdb_t_{uuid.uuid4().hex[:12]}"
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    if owner is not None:
        stmt += sql.SQL(" OWNER {}").format(sql.Identifier(owner))
    with admin(server.admin_dsn) as conn:
        conn.execute(stmt)
    return name


def drop_database(server: Server, name: str) -> None:
    """Drop ``name``, ending its sessions (a test's leftover connections included)."""
    with admin(server.admin_dsn) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextlib.contextmanager
def temp_database(
    server: Server, *, template: str | None = None, owner: str | None = None
) -> Iterator[str]:
    """A database (see :func:`create_database`) dropped when the block ends."""
    name = create_database(server, template=template, owner=owner)
    try:
        yield name
    finally:
        drop_database(server, name)


@contextlib.contextmanager
def migrated_template(server: Server) -> Iterator[str]:
    """A database with agentdb's migrations and the recording provider's tables, for cloning.

    Raises:
        MigrationError: the migrations failed.
    """
    from agentdb import migrate
    from agentdb.testing.provider import INSTALL

    with temp_database(server) as name:
        with admin(server.admin_dsn) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (ROLE_LOCK,))
            try:
                migrate.migrate(server.url(name))
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (ROLE_LOCK,))
        with admin(server.url(name)) as conn:
            for statement in INSTALL:
                conn.execute(statement)
        yield name
