"""dev/mutate/run.py: a mutant's test run that runs out of time leaves nothing behind."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import asyncpg

from dev.mutate.catalogue import Mutant
from dev.mutate.run import _TIMED_OUT, _end_run, _judge, _over_unix_socket
from tests.conftest import Database

_SLEEPING = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)'"


async def test_a_run_out_of_time_is_killed_and_its_queries_ended(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    """A hanging mutant (a query that never ends) must not stall the next one: the run's
    process tree - a grandchild here, as pgbouncer or a worker is - is killed, and the
    session it held, whose query would go on running without its client, is ended."""
    client = (
        "import psycopg, sys; c = psycopg.connect(sys.argv[1], autocommit=True);"
        " c.execute('SELECT pg_sleep(600)')"
    )
    shell = f"{sys.executable} -c \"{client}\" '{db.admin_dsn}'; exit 0"
    proc = await asyncio.to_thread(
        subprocess.Popen,
        ["sh", "-c", shell],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while await admin_conn.fetchval(_SLEEPING) == 0:
        assert time.monotonic() < deadline, "the client never started its query"
        await asyncio.sleep(0.1)
    said = await asyncio.to_thread(_end_run, proc, db.admin_dsn, False)
    assert proc.returncode is not None
    if _over_unix_socket(db.admin_dsn):
        # The embedded server listens on a Unix socket only: the tool says it cannot
        # tell the run's session apart (and leaves it), rather than claiming none.
        assert "cannot be told apart" in said, said
        await admin_conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query = 'SELECT pg_sleep(600)'"
        )
        return
    assert "ended 1 session(s)" in said, said
    assert await admin_conn.fetchval(_SLEEPING) == 0


def test_a_timeout_is_a_kill_counted_apart() -> None:
    m = Mutant("m", "sql/x.sql", "a", "b", ("tests/test_x.py",), "what")
    assert _judge(m, _TIMED_OUT, "timed out")[0] == "timeout"
    assert _judge(m, 1, "1 failed")[0] == "killed"
    declared = Mutant("m", "sql/x.sql", "a", "b", ("tests/test_x.py",), "what", "because")
    assert _judge(declared, _TIMED_OUT, "timed out")[0] == "equivalent-killed"
