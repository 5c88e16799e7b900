"""Workers and relays refuse to start on a schema older than their code (one line, exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import psycopg
import pytest
from psycopg import sql

from agentdb import migrate, schema
from agentdb.errors import MigrationError
from agentdb.relay import Relay
from agentdb.worker import Job, Worker
from tests import _pg
from tests.conftest import Database

ROOT = Path(__file__).resolve().parent.parent


async def _noop(job: Job) -> None:
    return None


async def test_the_migrated_schema_is_at_the_newest_shipped_migration(
    pool: asyncpg.Pool,
) -> None:
    assert await schema.check(pool) == schema.required_version() == migrate.migration_ids()[-1]


def test_every_migration_from_the_baseline_on_records_its_own_version() -> None:
    """The baseline's newest migration (0012.citus) defines agentdb_schema_version(); each
    later one redefines it whole with its own id."""
    for mid in migrate.migration_ids():
        if mid < "0012":
            continue
        text = (migrate.migrations_dir() / f"{mid}.sql").read_text()
        assert f"SELECT '{mid}'::text" in text, mid


async def test_worker_and_relay_refuse_an_older_schema(db: Database) -> None:
    # Back to 0011.retention: no agentdb_schema_version() at all.
    migrate.rollback(db.admin_dsn, count=sum(m >= "0012" for m in migrate.migration_ids()))
    pool = await asyncpg.create_pool(db.admin_dsn, min_size=1, max_size=2)
    try:
        with pytest.raises(MigrationError, match="run `agentdb migrate` first"):
            await Worker(pool, {"t": _noop}).run(install_signals=False)

        async def publish(message: object) -> None:
            return None

        with pytest.raises(MigrationError, match="older than this agentdb"):
            await Relay(pool, publish).run(install_signals=False)
    finally:
        await pool.close()
    migrate.migrate(db.admin_dsn)
    pool = await asyncpg.create_pool(db.admin_dsn, min_size=1, max_size=1)
    try:
        assert await schema.check(pool) == schema.required_version()
    finally:
        await pool.close()


def test_the_worker_command_says_so_in_one_line(db: Database) -> None:
    older, newest = migrate.migration_ids()[-2:]
    # A schema an older agentdb migrated: its newest migration named itself.
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION agentdb_schema_version() RETURNS text"
                " LANGUAGE sql IMMUTABLE AS $$ SELECT {}::text $$"
            ).format(sql.Literal(older))
        )
    proc = subprocess.run(
        [sys.executable, "-m", "agentdb", "worker", "tests.fixture_handlers:HANDLERS",
         "--dsn", db.admin_dsn, "--no-listen"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        f"agentdb: the database schema is at migration {older}, this agentdb needs {newest}"
    ), proc.stderr


def test_an_empty_database_is_not_migrated_not_older(pg_server: _pg.Server) -> None:
    """A first run before `agentdb migrate` is told so, not that its schema is "older"."""
    with _pg.temp_database(pg_server) as name:
        for command in (["worker", "tests.fixture_handlers:HANDLERS", "--no-listen"], ["status"]):
            proc = subprocess.run(
                [sys.executable, "-m", "agentdb", *command, "--dsn", pg_server.url(name)],
                cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                text=True, timeout=60, check=False,
            )  # fmt: skip
            assert proc.returncode == 1, proc.stderr
            assert proc.stderr.count("\n") == 1, proc.stderr
            assert proc.stderr.startswith(
                "agentdb: the database schema is not migrated (no agentdb tables on the"
                " search_path): run `agentdb migrate` first"
            ), proc.stderr
