"""Bad input to the CLI ends in one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from tests import _pg
from tests.conftest import Database


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args],
        capture_output=True,
        text=True,
        check=False,
        env=full_env,
    )


def _one_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("agentdb: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr


def test_unreachable_dsn() -> None:
    _one_line(_cli("status", "--dsn", "postgresql://nobody@127.0.0.1:1/db"), 1, "cannot connect")


def test_unknown_database(pg_server: _pg.Server) -> None:
    _one_line(_cli("migrate", "--dsn", pg_server.url("agentdb_no_such_db")), 1, "cannot connect")


def test_no_dsn_at_all() -> None:
    _one_line(_cli("migrate"), 2, "DATABASE_URL")


def test_dsn_from_environment(db: Database) -> None:
    result = _cli("status", "--migrations", env={"DATABASE_URL": db.admin_dsn})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["0001.foundation", "applied"]


def test_not_a_url() -> None:
    _one_line(_cli("status", "--dsn", "host=localhost dbname=x"), 2, "postgresql://")


def test_unknown_schema(db: Database) -> None:
    _one_line(_cli("migrate", "--dsn", db.admin_dsn, "--schema", "nope"), 2, "does not exist")


@pytest.mark.parametrize("name", ["My-App", "x; drop table y", "a" * 64])
def test_bad_schema_name(name: str) -> None:
    _one_line(_cli("sql", "--schema", name), 2, "lowercase identifier")


def test_database_migrated_by_a_newer_version(db: Database) -> None:
    with psycopg.connect(db.admin_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO _yoyo_migration (migration_hash, migration_id, applied_at_utc)"
            " VALUES ('f' , '0999.from_the_future', now())"
        )
    _one_line(_cli("migrate", "--dsn", db.admin_dsn), 1, "0999.from_the_future")


def test_sql_roles_prints_create_role() -> None:
    result = _cli("sql", "--roles")
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        'CREATE ROLE "agentdb_runtime" NOLOGIN;',
        'CREATE ROLE "agentdb_agent" NOLOGIN;',
        'CREATE ROLE "agentdb_operator" NOLOGIN;',
    ]
