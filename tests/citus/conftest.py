"""A Citus cluster for `make test-citus`: a fresh database on every node, migrated --citus.

``AGENTDB_CITUS_DSN`` names a database on the coordinator where the citus
extension is installed and the workers are registered; the session reads
the workers from it, creates a new database of the same owner on the
coordinator and on every worker, installs citus there, registers the
workers, runs ``agentdb migrate --citus`` and drops it all at the end.
Not part of `make test`: no registry ships Citus (tests/conftest.py skips
collecting this folder unless the variable is set).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import asyncpg
import pytest
from psycopg import sql

from agentdb import migrate, tenancy
from tests import _pg

ENV = "AGENTDB_CITUS_DSN"


@dataclass(frozen=True)
class Cluster:
    """The test database on a Citus coordinator, and the workers that hold its shards."""

    dsn: str  # the test database on the coordinator
    workers: tuple[str, ...]  # the same database on each worker (for inspection)

    def url(self, user: str | None = None) -> str:
        parts = self.dsn.rsplit("/", 1)[-1].split("?")[0]
        return _pg.with_db(self.dsn, parts, user=user, password=_pg.TEST_PASSWORD if user else None)


def _nodes(dsn: str) -> list[tuple[str, int]]:
    with _pg.admin(dsn) as conn:
        rows = conn.execute(
            "SELECT node_name, node_port FROM citus_get_active_worker_nodes() ORDER BY 1, 2"
        ).fetchall()
    return [(str(h), int(p)) for h, p in rows]


def _at(dsn: str, host: str, port: int, dbname: str) -> str:
    base = _pg.with_db(dsn, dbname)
    scheme, rest = base.split("://", 1)
    creds, tail = rest.rsplit("@", 1) if "@" in rest else ("", rest)
    path = tail.split("/", 1)[1]
    return f"{scheme}://{creds + '@' if creds else ''}{host}:{port}/{path}"


@contextlib.contextmanager
def fresh_database(base: str, prefix: str = "agentdb_ct") -> Iterator[Cluster]:
    """A new, empty database on the coordinator of ``base`` and on every worker, with
    citus installed and the workers registered; dropped on every node at the end."""
    workers = _nodes(base)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    coord = _pg.with_db(base, name)
    nodes = [coord, *(_at(base, h, p, name) for h, p in workers)]
    created: list[str] = []
    try:
        for url in nodes:
            with _pg.admin(_pg.with_db(url, "postgres")) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            created.append(url)
            with _pg.admin(url) as conn:
                conn.execute("CREATE EXTENSION citus")
        with _pg.admin(coord) as conn:
            host, port = coord.rsplit("@", 1)[-1].split("/", 1)[0].rsplit(":", 1)
            conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (host, int(port)))
            for h, p in workers:
                conn.execute("SELECT citus_add_node(%s, %s)", (h, p))
        yield Cluster(coord, tuple(nodes[1:]))
    finally:
        for url in reversed(created):
            with _pg.admin(_pg.with_db(url, "postgres")) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


@pytest.fixture(scope="session")
def citus() -> Iterator[Cluster]:
    base = os.environ.get(ENV)
    if not base:
        pytest.exit(f"{ENV} is not set: point it at a Citus coordinator database", returncode=2)
    if not _nodes(base):
        pytest.exit(f"{ENV}: no active Citus workers are registered there", returncode=2)
    with fresh_database(base) as cluster:
        migrate.migrate(cluster.dsn, citus=True)
        with _pg.admin(cluster.dsn) as conn:
            # Citus connects to the workers as the same login: each must log in there.
            _pg.ensure_role(conn, "agentdb_ct_runtime", member_of="agentdb_runtime")
            _pg.ensure_role(conn, "agentdb_ct_agent", member_of="agentdb_agent")
        yield cluster


@pytest.fixture
async def conn(citus: Cluster) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(citus.dsn)
    try:
        yield c
    finally:
        await c.close()


@dataclass(frozen=True)
class Three:
    x: uuid.UUID
    y: uuid.UUID
    z: uuid.UUID


@pytest.fixture
async def three(conn: asyncpg.Connection) -> Three:
    """Three new tenants: every test sees only its own tenants' rows."""
    ids = [await tenancy.create_tenant(conn, f"ct-{uuid.uuid4().hex[:8]}") for _ in range(3)]
    return Three(*ids)
