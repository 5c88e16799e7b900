"""Migrations through a real PgBouncer 1.18 in transaction pooling mode, with the one switch:
`migrate`, `rollback --all` and `migrate --schema` give no error, concurrent runs apply each
migration once, and no session state reaches the proxy's shared server connections.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from contextlib import ExitStack
from typing import Any

import psycopg

from agentdb import migrate
from agentdb.tools.pgbouncer import Bouncer
from tests import _pg

IDS = migrate.migration_ids()
POOL_SIZE = 3  # the `bouncer` fixture's server connections per (database, user)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )


def _server_state(url: str) -> list[tuple[Any, ...]]:
    """What each of the proxy's server connections for ``url``'s database and user carries:
    as many concurrent transactions as the pool has connections, each pinned to one."""
    with ExitStack() as stack:
        conns = [
            stack.enter_context(psycopg.connect(url, autocommit=True, prepare_threshold=None))
            for _ in range(POOL_SIZE)
        ]
        for c in conns:
            c.execute("BEGIN")
        rows = [
            c.execute(
                "SELECT pg_backend_pid(), current_setting('search_path'),"
                " current_setting('lock_timeout'), current_setting('application_name'),"
                " (SELECT count(*) FROM pg_prepared_statements),"
                " (SELECT count(*) FROM pg_locks"
                "  WHERE locktype = 'advisory' AND pid = pg_backend_pid())"
            ).fetchone()
            for c in conns
        ]
        for c in conns:
            c.execute("ROLLBACK")
    return sorted(tuple(r) for r in rows if r is not None)


def _defaults(dsn: str) -> tuple[str, str]:
    with _pg.admin(dsn) as conn:
        row = conn.execute("SELECT current_setting('search_path'), current_setting('lock_timeout')")
        got = row.fetchone()
    assert got is not None
    return str(got[0]), str(got[1])


def test_migrate_rollback_all_and_migrate_schema_through_the_proxy(
    pg_server: _pg.Server, bouncer: Bouncer
) -> None:
    with _pg.temp_database(pg_server) as name, _pg.temp_database(pg_server) as direct:
        dsn = pg_server.url(name)
        url = bouncer.url(dsn)
        empty = _pg.schema_dump(dsn)
        switch = ["--dsn", url, "--pooler", "transaction"]

        first = _cli("migrate", *switch)
        assert (first.returncode, first.stderr) == (0, "")
        assert first.stdout.count("applied ") == len(IDS)
        listed = _cli("status", "--migrations", *switch)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.count(" applied ") == len(IDS)

        back = _cli("rollback", "--all", *switch)
        assert (back.returncode, back.stderr) == (0, "")
        assert back.stdout.count("rolled back ") == len(IDS)
        assert _pg.schema_dump(dsn) == empty

        # The switch as the environment variable this time.
        env = {**os.environ, "AGENTDB_POOLER": "transaction"}
        agents = _cli("migrate", "--dsn", url, "--schema", "agents", "--create-schema", env=env)
        assert (agents.returncode, agents.stderr) == (0, "")
        assert _pg.schema_dump(dsn) != empty
        assert _pg.schema_dump(dsn, "--schema=public") == _pg.schema_dump(
            pg_server.url(direct), "--schema=public"
        )  # nothing landed in public
        same = _cli(
            "migrate", "--dsn", pg_server.url(direct), "--schema", "agents", "--create-schema"
        )
        assert same.returncode == 0, same.stderr
        assert _pg.schema_dump(dsn, "--schema=agents") == _pg.schema_dump(
            pg_server.url(direct), "--schema=agents"
        )

        state = _server_state(url)
        assert len({row[0] for row in state}) == POOL_SIZE  # every server connection looked at
        path, lock_timeout = _defaults(dsn)
        assert {row[1:] for row in state} == {(path, lock_timeout, "", 0, 0)}


def test_concurrent_migrates_through_the_proxy_apply_each_migration_once(
    pg_server: _pg.Server, bouncer: Bouncer
) -> None:
    with _pg.temp_database(pg_server) as name:
        url = bouncer.url(pg_server.url(name))
        cmd = [sys.executable, "-m", "agentdb", "migrate", "--dsn", url, "--pooler", "transaction"]
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(POOL_SIZE)
        ]
        results = [(p.communicate(timeout=120), p.returncode) for p in procs]
        applied: Counter[str] = Counter()
        for (out, err), code in results:
            assert code == 0, err
            # The only thing a run may say on stderr: that it waits for another one.
            assert all(
                line.startswith("waiting for the migration lock") for line in err.splitlines()
            )
            applied.update(
                line.removeprefix("applied ") for line in out.splitlines() if "applied " in line
            )
        assert applied == Counter(IDS)  # each applied exactly once, by one of the runs
        with _pg.admin(pg_server.url(name)) as conn:
            log = conn.execute(
                "SELECT migration_id, count(*) FROM _yoyo_log WHERE operation = 'apply'"
                " GROUP BY migration_id"
            ).fetchall()
        assert dict(log) == dict.fromkeys(IDS, 1)
        again = _cli("migrate", "--dsn", url, "--pooler", "transaction")
        assert again.returncode == 0, again.stderr
        assert "nothing to apply" in again.stdout
