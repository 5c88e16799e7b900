"""Migrations: apply all, roll back all, apply again - the schema is identical.

Also: every migration has its rollback and its dependency line, and
`agentdb sql --schema X` piped into psql builds the same objects as
`agentdb migrate --schema X`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentdb import migrate
from tests import _pg


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args], capture_output=True, text=True, check=False
    )


@pytest.fixture
def empty_db(pg_server: _pg.Server) -> Iterator[str]:
    with _pg.temp_database(pg_server) as name:
        yield pg_server.url(name)


def test_migrate_rollback_all_migrate_gives_an_identical_schema(empty_db: str) -> None:
    before = _pg.schema_dump(empty_db)
    first = _cli("migrate", "--dsn", empty_db)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("applied ") == len(migrate.migration_ids())
    migrated = _pg.schema_dump(empty_db)

    back = _cli("rollback", "--all", "--dsn", empty_db)
    assert back.returncode == 0, back.stderr
    assert _pg.schema_dump(empty_db) == before  # nothing of ours is left behind

    again = _cli("migrate", "--dsn", empty_db)
    assert again.returncode == 0, again.stderr
    assert _pg.schema_dump(empty_db) == migrated
    assert "CREATE TABLE public.agent_tasks" in migrated  # the dump is not vacuous


def test_migrate_is_idempotent_and_status_follows(empty_db: str) -> None:
    ids = migrate.migration_ids()
    assert migrate.migrate(empty_db) == ids
    assert migrate.migrate(empty_db) == []
    assert all(s.applied for s in migrate.status(empty_db))
    assert migrate.rollback(empty_db, count=2) == ids[-1:-3:-1]
    assert [s.applied for s in migrate.status(empty_db)] == [True] * (len(ids) - 2) + [False] * 2
    assert migrate.migrate(empty_db) == ids[-2:]


def test_sql_into_a_named_schema_matches_migrate(pg_server: _pg.Server) -> None:
    script = _cli("sql", "--schema", "myapp")
    assert script.returncode == 0, script.stderr
    with _pg.temp_database(pg_server) as pasted, _pg.temp_database(pg_server) as migrated:
        subprocess.run(
            _pg.psql_args(pg_server.url(pasted)),
            input=script.stdout,
            check=True,
            text=True,
            capture_output=True,
        )
        done = _cli(
            "migrate", "--dsn", pg_server.url(migrated), "--schema", "myapp", "--create-schema"
        )
        assert done.returncode == 0, done.stderr
        a = _pg.schema_dump(pg_server.url(pasted), "--schema=myapp")
        b = _pg.schema_dump(pg_server.url(migrated), "--schema=myapp")
        assert a == b
        assert "CREATE TABLE myapp.agent_tasks" in a
        # Nothing leaked into public.
        assert "agent_" not in _pg.schema_dump(pg_server.url(pasted), "--schema=public")


def test_every_migration_has_a_rollback_and_a_linear_dependency() -> None:
    ids = migrate.migration_ids()
    assert [i.split(".")[0] for i in ids] == [f"{n:04d}" for n in range(1, len(ids) + 1)]
    folder = migrate.migrations_dir()
    for previous, current in zip([None, *ids], ids, strict=False):
        text = (folder / f"{current}.sql").read_text()
        assert (folder / f"{current}.rollback.sql").is_file(), current
        depends = re.findall(r"^-- depends: (.+)$", text, flags=re.M)
        assert depends == ([] if previous is None else [previous]), current


def test_migrations_never_hard_code_a_schema() -> None:
    for path in migrate.migrations_dir().glob("*.sql"):
        assert not re.search(r"\bpublic\.", path.read_text()), path.name
