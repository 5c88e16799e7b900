"""The testing kit's clones (agentdb.testing._postgres.Clones): each test's database is a fresh
copy of the template, made ahead in background threads, and none is left behind."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentdb.testing import _postgres
from tests import _pg


def _kit_databases(server: _pg.Server) -> set[str]:
    """The databases the testing kit made on ``server`` (other sessions' included)."""
    with _pg.admin(server.admin_dsn) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'agentdb_t_%'")
        return {r[0] for r in rows.fetchall()}


def _copies(server: _pg.Server, before: set[str]) -> set[str]:
    """The databases made since ``before`` that are copies of this test's template
    (they have its table ``clones_marker``; other tests' databases do not)."""
    return {name for name in _kit_databases(server) - before if _has_marker(server, name)}


def _has_marker(server: _pg.Server, name: str) -> bool:
    """``name`` is a copy of this test's template (and not an empty database)."""
    try:
        with _pg.admin(server.url(name)) as conn:
            row = conn.execute("SELECT to_regclass('clones_marker') IS NOT NULL").fetchone()
    except psycopg.OperationalError:  # dropped meanwhile (by another test's clones)
        return False
    return bool(row and row[0])


def _template(server: _pg.Server, stack: contextlib.ExitStack) -> str:
    name = stack.enter_context(_pg.temp_database(server))
    with _pg.admin(server.url(name)) as conn:
        conn.execute("CREATE TABLE clones_marker (id int)")
    return name


def test_each_take_is_a_fresh_copy_and_close_leaves_none(pg_server: _pg.Server) -> None:
    with contextlib.ExitStack() as stack:
        template = _template(pg_server, stack)
        with _pg.admin(pg_server.admin_dsn) as conn:
            before = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
        given: list[str] = []
        with _pg.clones(pg_server, template) as clones:
            for _ in range(6):  # more than are made ahead
                name = clones.take()
                given.append(name)
                # Nothing an earlier test wrote is in this one's copy.
                assert _rows(pg_server, name) == 0
                with _pg.admin(pg_server.url(name)) as conn:
                    conn.execute("INSERT INTO clones_marker VALUES (1)")
                clones.give_back(name)
            assert len(set(given)) == 6
            # The copies for the next tests get made (while nothing is taken).
            _until(
                lambda: len(_copies(pg_server, before) - set(given)) == 4,
                "four copies were not made ahead",
            )
        # The copies given out and the ones made ahead and never used: all dropped.
        assert _copies(pg_server, before) == set()


def _rows(server: _pg.Server, name: str) -> int:
    with _pg.admin(server.url(name)) as conn:
        row = conn.execute("SELECT count(*) FROM clones_marker").fetchone()
    assert row is not None
    return int(row[0])


def _copying(server: _pg.Server, template: str) -> int:
    """How many sessions are running CREATE DATABASE ... TEMPLATE ``template``."""
    with _pg.admin(server.admin_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE DATABASE %%'"
            " AND query LIKE %s",
            (f'%TEMPLATE "{template}"%',),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_copy_made_ahead_that_failed_is_made_again_when_taken(pg_server: _pg.Server) -> None:
    """A test was connected to the template while copies were made ahead: CREATE DATABASE
    waited 5 s for it, then failed; each take makes its copy there and then instead."""
    with contextlib.ExitStack() as stack:
        template = _template(pg_server, stack)
        holder = psycopg.connect(pg_server.url(template))
        clones = _pg.Clones(pg_server, template, ahead=2)
        first = second = ""
        try:
            _until(lambda: _copying(pg_server, template) == 2, "the copies ahead did not start")
            _until(lambda: _copying(pg_server, template) == 0, "the copies ahead did not fail")
            holder.close()
            first, second = clones.take(), clones.take()
            assert first != second
            assert _has_marker(pg_server, first)
            assert _has_marker(pg_server, second)
            clones.give_back(first)
            clones.give_back(second)
        finally:
            holder.close()
            clones.close()
        assert not _has_marker(pg_server, first)
        assert not _has_marker(pg_server, second)


def test_a_template_that_cannot_be_copied_is_the_tests_error(pg_server: _pg.Server) -> None:
    with (
        _pg.clones(pg_server, "agentdb_no_such_template") as clones,
        pytest.raises(psycopg.errors.InvalidCatalogName),
    ):
        clones.take()


@pytest.fixture(scope="module")
def own_server() -> Iterator[_pg.Server]:
    """A private embedded server: every database on it is the child session's."""
    with contextlib.ExitStack() as stack:
        yield _pg.start_embedded(stack)


def test_a_session_ended_by_ctrl_c_drops_the_copies_it_made_ahead(
    own_server: _pg.Server, tmp_path: Path
) -> None:
    """A user's pytest session on their own server (AGENTDB_TEST_DSN), interrupted in a
    test: the template, the test's copy and the copies made ahead are all dropped."""
    (tmp_path / "test_waits.py").write_text(
        "import time\n\n\ndef test_waits(agentdb_db):\n    time.sleep(300)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTDB_")}
    env["AGENTDB_TEST_DSN"] = own_server.admin_dsn
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_waits.py"]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        # The template, the test's copy and four made ahead.
        _until(lambda: len(_kit_databases(own_server)) == 6, "the session did not make its copies")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err
    assert _kit_databases(own_server) == set()


# --- ALTER DATABASE ... ALLOW_CONNECTIONS on one template, from many threads at once -----------
#
# On Citus every Clones thread's first copy seals the template (_seal), and each ran
# ALTER DATABASE on the template's pg_database row at once: Postgres refuses the second
# of two concurrent updates of one catalog row ("tuple concurrently updated", XX000).
# Seen in make test-citus; these reproduce it on any server.

_THREADS = 16
_ROUNDS = 10


def _all_at_once(calls: list[Callable[[], None]]) -> None:
    """Run ``calls`` each in its own thread; re-raise the first error."""
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_many_threads_toggling_one_templates_connections_do_not_collide(
    pg_server: _pg.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every thread is connected before any sends its ALTER DATABASE (a barrier in the
    kit's ``admin``), so the ALTERs reach the server together, round after round."""
    connect = _postgres.admin
    barrier = threading.Barrier(_THREADS, timeout=60)  # a thread that failed: no hang

    def connected_together(dsn: str) -> psycopg.Connection[Any]:
        conn = connect(dsn)
        barrier.wait()
        return conn

    with contextlib.ExitStack() as stack:
        template = _template(pg_server, stack)
        with monkeypatch.context() as patch:  # the template's own CREATE and DROP: unpatched
            patch.setattr(_postgres, "admin", connected_together)
            for round_ in range(_ROUNDS):
                allow = round_ % 2 == 1  # a change every round, and back to allowed at the end
                _all_at_once(
                    [
                        functools.partial(_postgres._allow_connections, pg_server, template, allow)
                        for _ in range(_THREADS)
                    ]
                )
                assert _allows_connections(pg_server, template) is allow


def test_every_clones_thread_sealing_one_template_at_once_seals_it_once(
    pg_server: _pg.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Clones does on Citus: each thread's first copy seals the template. A Citus-shaped
    server whose one worker is the server itself (the nodes are sealed one after the other)."""
    citus = _pg.Server(pg_server.admin_dsn, "test", workers=(pg_server.admin_dsn,))
    for _ in range(_ROUNDS // 2):  # a template made and dropped each round
        monkeypatch.setattr(_postgres, "_sealed", set())
        with contextlib.ExitStack() as stack:
            template = _template(pg_server, stack)
            barrier = threading.Barrier(_THREADS, timeout=60)  # a thread that failed: no hang

            def seal(template: str = template, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                _postgres._seal(citus, template)

            _all_at_once([seal] * _THREADS)
            assert _allows_connections(pg_server, template) is False
            assert _postgres._sealed == {(citus.admin_dsn, template)}


def _allows_connections(server: _pg.Server, name: str) -> bool:
    with _pg.admin(server.admin_dsn) as conn:
        row = conn.execute("SELECT datallowconn FROM pg_database WHERE datname = %s", (name,))
        found = row.fetchone()
    assert found is not None
    return bool(found[0])
