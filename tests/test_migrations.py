"""Migrations: apply all, roll back all, apply again - the schema is identical.

Also: every migration has its rollback and its dependency line; `agentdb sql --schema X`
piped into psql builds the same objects as `agentdb migrate --schema X` and records them the
same way; yoyo and agentdb each accept what the other applied; a waiting migrate says what it
waits for and `--lock-timeout` bounds it; bad input is one line and writes nothing; every NOTICE
Postgres sends is one line on stderr.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlparse

from agentdb import migrate
from agentdb.schema import split_statements
from tests import _pg

IDS = migrate.migration_ids()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args], capture_output=True, text=True, check=False
    )


def _psql(dsn: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_pg.psql_args(dsn), *args], input=script, text=True, capture_output=True, check=False
    )


def _one_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert result.stderr.startswith("agentdb: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr, result.stderr


def _relations(dsn: str) -> list[str]:
    """Every table, view, sequence and index outside the system schemas: what was written."""
    with _pg.admin(dsn) as conn:
        rows = conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1"
        ).fetchall()
    return [str(r[0]) for r in rows]


@contextlib.contextmanager
def _yoyo(dsn: str) -> Iterator[tuple[Any, Any]]:
    """yoyo itself on sql/, the way a team that runs yoyo points it at the folder."""
    from yoyo import get_backend, read_migrations

    backend = get_backend(dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        yield backend, read_migrations(str(migrate.migrations_dir()))
    finally:
        backend.connection.close()


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


def test_each_rollback_restores_exactly_the_schema_before_its_migration(empty_db: str) -> None:
    """Step by step: yoyo applies the migrations one at a time (a dump after each), then
    agentdb rolls them back one at a time - each rollback must give the dump from before
    its migration, constraint validity and function settings included (a round trip of
    them all would hide a rollback that leaves what the next one takes away)."""
    dumps = [_pg.schema_dump(empty_db)]
    with _yoyo(empty_db) as (backend, migrations), backend.lock():
        for m in migrations:
            one = migrations.filter(lambda x, wanted=m.id: x.id == wanted)
            backend.apply_migrations(backend.to_apply(one))
            dumps.append(_pg.schema_dump(empty_db))
    ids = migrate.migration_ids()
    assert len(dumps) == len(ids) + 1
    inexact = []
    for k in range(len(ids), 0, -1):
        assert migrate.rollback(empty_db, count=1) == [ids[k - 1]]
        if _pg.schema_dump(empty_db) != dumps[k - 1]:
            inexact.append(ids[k - 1])
    assert inexact == []


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
        # The paste recorded what it applied, as migrate does.
        after = _cli("migrate", "--dsn", pg_server.url(pasted), "--schema", "myapp")
        assert after.returncode == 0, after.stderr
        assert after.stdout == "nothing to apply: the schema is up to date\n"


def test_every_migration_has_a_rollback_and_a_linear_dependency() -> None:
    ids = migrate.migration_ids()
    assert [i.split(".")[0] for i in ids] == [f"{n:04d}" for n in range(1, len(ids) + 1)]
    folder = migrate.migrations_dir()
    for previous, current in zip([None, *ids], ids, strict=False):
        text = (folder / f"{current}.sql").read_text()
        assert (folder / f"{current}.rollback.sql").is_file(), current
        depends = re.findall(r"^-- depends: (.+)$", text, flags=re.M)
        assert depends == ([] if previous is None else [previous]), current


def test_each_migration_is_sent_one_statement_at_a_time_and_whole() -> None:
    """What the runner sends (one statement each, for Citus) is the file, nothing lost:
    every dollar-quoted body stays in one piece, and only comments are left out."""
    folder = migrate.migrations_dir()
    for path in sorted(folder.glob("*.sql")):
        text = path.read_text()
        pieces = split_statements(text)
        assert pieces, path.name
        assert all(sqlparse.format(p, strip_comments=True).strip().endswith(";") for p in pieces), (
            path.name
        )
        for p in pieces:  # a body split at one of its own semicolons would end unclosed
            assert p.count("$$") % 2 == 0, (path.name, p[:80])
        # Nothing but comments and whitespace between the pieces.
        rest = text
        for p in pieces:
            head, found, rest = rest.partition(p)
            assert found, (path.name, p[:80])
            assert not sqlparse.format(head, strip_comments=True).strip(), (path.name, head)
        assert not sqlparse.format(rest, strip_comments=True).strip(), (path.name, rest)
    several = split_statements("SELECT 1; -- one\nDO $$ BEGIN PERFORM 2; END $$;\n-- end\n")
    assert several == ["SELECT 1; -- one", "DO $$ BEGIN PERFORM 2; END $$;"]


_VERSION = re.compile(
    r"FUNCTION agentdb_schema_version\(\) RETURNS text.*?SELECT '([^']+)'::text", re.S
)


def test_each_migration_names_itself_in_the_version_function_and_its_rollback_the_last() -> None:
    """A worker refuses a schema whose agentdb_schema_version() is not the newest id it
    knows: a migration that forgets to replace it stops every worker after `migrate`."""
    ids = migrate.migration_ids()
    folder = migrate.migrations_dir()
    first = next(i for i in ids if _VERSION.search((folder / f"{i}.sql").read_text()))
    for previous, current in itertools.pairwise(ids):
        if ids.index(current) < ids.index(first):
            continue
        forward = _VERSION.findall((folder / f"{current}.sql").read_text())
        assert forward[-1:] == [current], current
        if current != first:
            back = _VERSION.findall((folder / f"{current}.rollback.sql").read_text())
            assert back[-1:] == [previous], current


def test_migrations_never_hard_code_a_schema() -> None:
    for path in migrate.migrations_dir().glob("*.sql"):
        assert not re.search(r"\bpublic\.", path.read_text()), path.name


def test_a_pasted_schema_is_recorded_and_a_second_paste_is_refused(
    empty_db: str, pg_server: _pg.Server
) -> None:
    script = _cli("sql")
    assert script.returncode == 0, script.stderr
    pasted = _psql(empty_db, script.stdout)
    assert pasted.returncode == 0, pasted.stderr
    listed = _cli("status", "--migrations", "--dsn", empty_db)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[1] for line in listed.stdout.splitlines()] == ["applied"] * len(IDS)
    again = _cli("migrate", "--dsn", empty_db)
    assert (again.returncode, again.stdout) == (0, "nothing to apply: the schema is up to date\n")
    with _yoyo(empty_db) as (backend, migrations):
        assert list(backend.to_apply(migrations)) == []
    with _pg.temp_database(pg_server) as other:
        assert migrate.migrate(pg_server.url(other)) == IDS
        assert _pg.schema_dump(empty_db) == _pg.schema_dump(pg_server.url(other))
    before = _relations(empty_db)
    twice = _psql(empty_db, script.stdout, "-v", "VERBOSITY=verbose")
    assert twice.returncode != 0
    assert "55000" in twice.stderr  # the script's own refusal, before any DDL
    assert _relations(empty_db) == before


def _users_own_tables(dsn: str) -> None:
    """Schema myapp as a user's application made it: an agent_tasks of its own."""
    with _pg.admin(dsn) as conn:
        conn.execute("CREATE SCHEMA myapp")
        conn.execute("CREATE TABLE myapp.agent_tasks (id bigint PRIMARY KEY, title text)")
        conn.execute("INSERT INTO myapp.agent_tasks VALUES (1, 'mine')")


def test_a_paste_into_a_schema_with_a_users_agent_tasks_stops_at_once(empty_db: str) -> None:
    """psql without -v ON_ERROR_STOP=1, as a user pipes it: the script stops psql itself
    (it used to print hundreds of errors and exit 0), saying what is in the way."""
    _users_own_tables(empty_db)
    script = _cli("sql", "--schema", "myapp")
    assert script.returncode == 0, script.stderr
    pasted = subprocess.run(
        [_pg.pg_bin("psql"), "-X", "-q", "--dbname", empty_db],
        input=script.stdout, text=True, capture_output=True, check=False,
    )  # fmt: skip
    assert pasted.returncode != 0, pasted.stderr
    errors = [line for line in pasted.stderr.splitlines() if "ERROR:" in line]
    assert len(errors) == 1, pasted.stderr
    assert "already holds objects named like agentdb's: table agent_tasks" in errors[0]
    assert _relations(empty_db) == ["myapp.agent_tasks", "myapp.agent_tasks_pkey"]


def test_migrate_into_a_schema_with_a_users_agent_tasks_applies_nothing(empty_db: str) -> None:
    """The clash is the user's own table, not a half-applied agentdb: refused before the
    first migration, naming what is in the way (not advice to `yoyo mark` it)."""
    _users_own_tables(empty_db)
    with _pg.admin(empty_db) as conn:
        conn.execute(
            "CREATE FUNCTION myapp.agentdb_notify() RETURNS int LANGUAGE sql AS 'SELECT 1'"
        )
    refused = _cli("migrate", "--dsn", empty_db, "--schema", "myapp")
    _one_line(refused, 1, "no agentdb migration history but already holds objects named like")
    assert "(table agent_tasks, function agentdb_notify())" in refused.stderr
    assert "yoyo mark" not in refused.stderr
    assert _relations(empty_db) == ["myapp.agent_tasks", "myapp.agent_tasks_pkey"]


def test_yoyo_sees_what_agentdb_applied_and_agentdb_sees_what_yoyo_rolled_back(
    empty_db: str,
) -> None:
    assert migrate.migrate(empty_db) == IDS
    with _yoyo(empty_db) as (backend, migrations):
        assert list(backend.to_apply(migrations)) == []
        with backend.lock():
            backend.rollback_one(next(iter(backend.to_rollback(migrations))))
    assert [s.id for s in migrate.status(empty_db) if not s.applied] == IDS[-1:]
    assert migrate.migrate(empty_db) == IDS[-1:]
    with _yoyo(empty_db) as (backend, migrations):
        assert list(backend.to_apply(migrations)) == []


def test_agentdb_accepts_a_database_yoyo_migrated(empty_db: str, pg_server: _pg.Server) -> None:
    with _yoyo(empty_db) as (backend, migrations), backend.lock():
        backend.apply_migrations(backend.to_apply(migrations))
    assert all(s.applied for s in migrate.status(empty_db))
    again = _cli("migrate", "--dsn", empty_db)
    assert (again.returncode, again.stdout) == (0, "nothing to apply: the schema is up to date\n")
    with _pg.temp_database(pg_server) as other:
        assert migrate.migrate(pg_server.url(other)) == IDS
        assert _pg.schema_dump(empty_db) == _pg.schema_dump(pg_server.url(other))
    assert migrate.rollback(empty_db, count=None) == IDS[::-1]


def test_a_waiting_migrate_says_what_it_waits_for_and_lock_timeout_bounds_it(
    empty_db: str,
) -> None:
    with _pg.admin(empty_db) as holder:
        holder.execute("SET application_name TO 'the lock holder'")
        key = (migrate.LOCK_CLASS, migrate.lock_key("public"))
        holder.execute("SELECT pg_advisory_lock(%s, %s)", key)
        pid = holder.info.backend_pid

        bounded = _cli("migrate", "--dsn", empty_db, "--lock-timeout", "0.5")
        assert bounded.returncode == 1, bounded.stderr
        waiting, gave_up = bounded.stderr.splitlines()
        assert waiting.startswith('waiting for the migration lock on schema "public" of ')
        assert f"held by server process {pid} (the lock holder, " in waiting
        assert gave_up.startswith("agentdb: gave up after 0.5s waiting for the migration lock")
        _one_line(_cli("migrate", "--dsn", empty_db, "--lock-timeout", "0"), 1, "is held by")
        _one_line(_cli("migrate", "--dsn", empty_db, "--lock-timeout", "-1"), 2, "lock timeout")
        # The pasted script takes the same lock (PGOPTIONS: so that psql gives up too).
        script = _cli("sql").stdout
        env = dict(os.environ, PGOPTIONS="-c lock_timeout=200")
        pasted = subprocess.run(
            [*_pg.psql_args(empty_db), "-v", "VERBOSITY=verbose"],
            input=script, text=True, capture_output=True, check=False, env=env,
        )  # fmt: skip
        assert pasted.returncode != 0
        assert "55P03" in pasted.stderr  # lock_not_available
        assert _relations(empty_db) == []  # none of them wrote anything

        proc = subprocess.Popen(
            [sys.executable, "-m", "agentdb", "migrate", "--dsn", empty_db],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("waiting for the migration lock")
        holder.execute("SELECT pg_advisory_unlock(%s, %s)", key)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("applied ") == len(IDS)


@pytest.mark.parametrize("command", [["migrate"], ["rollback"], ["status", "--migrations"]])
@pytest.mark.parametrize(
    ("dsn", "code", "fragment"),
    [
        ("postgresql://", 2, "names no database"),
        ("postgresql://postgres@[::1/x", 2, "not a valid URL"),
        ("postgresql://nobody@127.0.0.1:1/db", 1, "Connection refused"),
    ],
)
def test_a_bad_dsn_is_one_line(command: list[str], dsn: str, code: int, fragment: str) -> None:
    _one_line(_cli(*command, "--dsn", dsn), code, fragment)


def test_an_unknown_dsn_parameter_is_one_line_and_writes_nothing(empty_db: str) -> None:
    odd = empty_db + ("&" if "?" in empty_db else "?") + "foo=bar"
    for command in (["migrate"], ["rollback", "--all"]):
        _one_line(_cli(*command, "--dsn", odd), 2, "foo")
    assert _relations(empty_db) == []


def test_rollback_with_nothing_applied_is_one_line_and_writes_nothing(empty_db: str) -> None:
    _one_line(_cli("rollback", "--dsn", empty_db), 1, "nothing to roll back")
    _one_line(_cli("rollback", "--all", "--dsn", empty_db), 1, "nothing to roll back")
    assert migrate.rollback(empty_db) == []
    assert _relations(empty_db) == []


def test_status_of_a_missing_schema_suggests_no_flag_it_lacks(empty_db: str) -> None:
    result = _cli("status", "--dsn", empty_db, "--schema", "nosuch")
    _one_line(result, 2, "schema 'nosuch' does not exist")
    assert "--" not in result.stderr
    _one_line(_cli("migrate", "--dsn", empty_db, "--schema", "nosuch"), 2, "--create-schema")
    assert _relations(empty_db) == []


@pytest.fixture(scope="module")
def roleless_server() -> Iterator[_pg.Server]:
    """A private cluster without the agentdb roles, so that migrating as an owner who may not
    create roles raises agentdb_grant_roles()'s NOTICEs."""
    with contextlib.ExitStack() as stack:
        yield _pg.start_embedded(stack)


def test_migrate_prints_each_notice_postgres_sends_on_one_line(
    roleless_server: _pg.Server,
) -> None:
    owner = "agentdb_test_plain_owner"
    with _pg.admin(roleless_server.admin_dsn) as conn:
        _pg.ensure_role(conn, owner, "NOCREATEROLE")
    with _pg.temp_database(roleless_server, owner=owner) as name:
        dsn = roleless_server.url(name, user=owner, password=_pg.TEST_PASSWORD)
        done = _cli("migrate", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    roles = ("agentdb_runtime", "agentdb_agent", "agentdb_operator")
    assert len(lines) == len(roles), done.stderr
    for line, role in zip(lines, roles, strict=True):
        assert line.startswith(f"NOTICE: agentdb: role {role} is missing and {owner} may not")


def _waiting_task(conn: Any, tenant: Any, wait: str) -> Any:
    """A task of ``tenant`` moved to 'waiting' with ``wait`` (a SET clause), with its events."""
    event = (
        "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,"
        " task_state_version, from_state, to_state) VALUES (%s, %s, %s, 't', 'p', %s, %s, %s)"
    )
    with conn.transaction():  # the event check is deferred to the commit
        [(task_id,)] = conn.execute(
            "INSERT INTO agent_tasks (tenant_id, task_type, workflow_version)"
            " VALUES (%s, 'w', 'v1') RETURNING id",
            (tenant,),
        ).fetchall()
        conn.execute(event, (tenant, task_id, "task.created", 0, None, "pending"))
    with conn.transaction():
        conn.execute(
            f"UPDATE agent_tasks SET state = 'waiting', wake_at = 'infinity', {wait},"  # noqa: S608
            " state_version = 1 WHERE id = %s",
            (task_id,),
        )
        conn.execute(event, (tenant, task_id, "task.waiting", 1, "pending", "waiting"))
    return task_id


def test_rolling_back_the_control_flow_leaves_no_task_asleep(empty_db: str) -> None:
    """Rolling back 0006.control_flow (and what follows it) makes a task that waited for a
    signal or for its children due, with its event: nothing would wake it any more. One
    past its deadline is left waiting, for the sweep that ends it."""
    migrate.migrate(empty_db)
    with _pg.admin(empty_db) as conn:
        [(tenant,)] = conn.execute(
            "INSERT INTO agent_tenants (name) VALUES ('t') RETURNING id"
        ).fetchall()
        ids = [
            _waiting_task(conn, tenant, w)
            for w in (
                "wait_signal = 'go'",
                "wait_children = 1",
                "wait_signal = 'late', deadline_at = now() - interval '1 hour'",
            )
        ]

    def woken() -> list[tuple[Any, ...]]:
        with _pg.admin(empty_db) as conn:
            return [
                tuple(
                    conn.execute(
                        "SELECT state, wake_at <= now(), (SELECT count(*) FROM agent_events e"
                        "   WHERE e.task_id = k.id AND e.event_type = 'task.woken'),"
                        " wait_signal IS NULL AND wait_children IS NULL"
                        " FROM agent_tasks k WHERE id = %s",
                        (i,),
                    ).fetchall()[0]
                )
                for i in ids
            ]

    asleep = ("waiting", False, 0, False)
    assert woken() == [asleep, asleep, asleep]
    back = migrate.rollback(empty_db, count=len(IDS) - IDS.index("0006.control_flow"))
    assert back[-1] == "0006.control_flow"
    assert woken() == [("pending", True, 1, True), ("pending", True, 1, True), asleep]
