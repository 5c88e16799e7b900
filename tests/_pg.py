"""Where the tests get their PostgreSQL, and small helpers around it.

Order: ``AGENTDB_TEST_DSN`` if set; else a testcontainers
Postgres when a Docker engine answers; else an embedded Postgres (pgserver,
binaries from a wheel) started for this session. If none can be had the
session fails with instructions - database tests are never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import asyncpg
import psycopg
from psycopg import sql

# The testing kit's server and database helpers are the suite's too.
from agentdb.testing import _postgres
from agentdb.testing._postgres import (
    ON_CITUS,
    Clones,
    Server,
    admin,
    clones,
    create_database,
    drop_database,
    temp_database,
    with_db,
)

__all__ = [
    "ON_CITUS",
    "TEST_PASSWORD",
    "Clones",
    "Server",
    "admin",
    "clones",
    "constraint_of",
    "create_database",
    "drop_database",
    "ensure_role",
    "ensure_roles",
    "guard",
    "provision",
    "temp_database",
    "with_db",
]

TEST_PASSWORD = "agentdb-test"  # only for test roles on throwaway servers


def guard(name: str) -> str | None:
    """The trigger name a guard's error carries as its constraint: none on Citus.

    Citus drops the constraint field of a worker's error, and a guard's
    message does not name its trigger (a CHECK's or key's name is recovered
    from its message; see agentdb._db.execute).
    """
    return None if ON_CITUS else name


def constraint_of(exc: BaseException) -> str | None:
    """The constraint a raw database error names, as agentdb's mapping reads it."""
    from agentdb import _db

    mapped = _db.translate(exc)
    if mapped is exc:  # not one agentdb maps: what the server said, if it said it
        return getattr(exc, "constraint_name", None)
    return getattr(mapped, "constraint", None)


def query_args(dsn: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(dsn).query))


def pg_bin(name: str) -> str:
    """Path of a client binary (pg_dump, psql) at least as new as any server we test.

    pgserver ships PostgreSQL 16 clients, which can dump 15 and 16 servers.
    """
    import pgserver

    path = Path(pgserver.__file__).parent / "pginstall" / "bin" / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found (install the test extra: pip install -e '.[test]')")
    return found


def _docker_engine_answers() -> None:
    """Raise unless a Docker engine answers a ping."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        raise RuntimeError("no Docker engine (DOCKER_HOST unset, no /var/run/docker.sock)")
    import docker

    # The docker client leaks its socket when the engine does not answer;
    # collect it here so the ResourceWarning does not land in a random test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=5)
            try:
                client.ping()
            finally:
                client.close()
        finally:
            gc.collect()


def _docker(stack: contextlib.ExitStack) -> Server:
    _docker_engine_answers()
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:16-alpine", driver=None)
    container.with_command("postgres -c fsync=off -c synchronous_commit=off -c max_connections=200")
    stack.enter_context(container)
    return Server(container.get_connection_url(), "testcontainers")


def start_embedded(stack: contextlib.ExitStack) -> Server:
    """Start a private embedded PostgreSQL in a temp dir, removed on exit."""
    from agentdb.tools.embedded import embedded_postgres

    return Server(stack.enter_context(embedded_postgres(migrate=False)), "embedded")


def provision(stack: contextlib.ExitStack) -> Server:
    if ON_CITUS:  # make test-citus: the kit's Citus server (agentdb.testing._postgres)
        return _postgres.provision(stack)
    dsn = os.environ.get("AGENTDB_TEST_DSN")
    if dsn:
        with admin(dsn):  # fail now, with the reason, if it cannot be reached
            pass
        return Server(dsn, "AGENTDB_TEST_DSN")
    reasons: list[str] = []
    try:
        return _docker(stack)
    except Exception as exc:
        reasons.append(f"testcontainers: {type(exc).__name__}: {exc}")
    try:
        return start_embedded(stack)
    except Exception as exc:
        reasons.append(f"embedded pgserver: {type(exc).__name__}: {exc}")
    raise RuntimeError(
        "no PostgreSQL available for the tests. Set AGENTDB_TEST_DSN="
        "postgresql://user@host:5432/postgres (a role that may CREATE DATABASE and "
        "CREATE ROLE), start a Docker engine, or install the test extra "
        "(pip install -e '.[test]') for the embedded server. Tried: " + "; ".join(reasons)
    )


def ensure_roles(server: Server, roles: dict[str, str | None]) -> None:
    """Create each test login (name -> the role it is a member of) on every node.

    On Citus a login must exist on each worker too (the coordinator connects
    to the workers as the same user); each node gets it in its ``postgres``
    database, where no citus extension propagates it a second time.
    """
    for node in server.nodes():
        with admin(with_db(node, "postgres") if server.citus else node) as conn:
            for name, member_of in roles.items():
                ensure_role(conn, name, member_of=member_of)


def ensure_role(
    conn: psycopg.Connection[Any], name: str, *options: str, member_of: str | None = None
) -> None:
    """Create a login role for tests if it is missing (roles are cluster-wide)."""
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
    if not exists:
        stmt = sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(TEST_PASSWORD)
        )
        for option in options:
            stmt += sql.SQL(" ") + sql.SQL(option)  # options are constants in test code
        conn.execute(stmt)
    if member_of is not None:
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(member_of), sql.Identifier(name))
        )


def schema_dump(dsn: str, *extra: str) -> str:
    """``pg_dump --schema-only`` of ``dsn``, without yoyo's bookkeeping tables.

    Lines setting the ``pg_attver`` column option are dropped: the Debian
    PostgreSQL 15 build on our CI machine stamps that option, with a value that
    changes on every CREATE, onto every column. It is not part of the schema
    and no agentdb migration sets it.
    """
    import subprocess

    args = [pg_bin("pg_dump"), "--schema-only", "--no-owner", *extra]
    args += ["--exclude-table=*._yoyo_*", "--exclude-table=*.yoyo_lock", "--dbname", dsn]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return "".join(line for line in out.splitlines(keepends=True) if "SET (pg_attver=" not in line)


def psql_args(dsn: str) -> list[str]:
    return [pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", dsn]


def encode_query(args: dict[str, str]) -> str:
    return urlencode(args)


def ensure_pgbouncer() -> str:
    """The pgbouncer binary, installed from Debian's packages when missing and we may.

    The PgBouncer tests never skip: with no binary and no way to install one the
    session fails and says how to provide it.
    """
    from agentdb.tools.pgbouncer import find_binary

    found = find_binary()
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        import subprocess

        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "pgbouncer"]):
            subprocess.run(cmd, env=env, capture_output=True, check=False, timeout=600)
        found = find_binary()
    if found is None:
        raise RuntimeError(
            "the PgBouncer tests need pgbouncer (Debian: apt-get install -y pgbouncer; "
            "any 1.x in PATH works) - they are never skipped"
        )
    return found


async def done_or_blocked(admin: asyncpg.Connection, pid: int, work: asyncio.Future[Any]) -> None:
    """Until ``work`` is over or backend ``pid`` waits on a lock - observed, not slept for."""
    for _ in range(1000):
        if work.done() or await admin.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} neither finished nor blocked")
