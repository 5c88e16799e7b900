"""`agentdb migrate` killed (SIGINT and SIGKILL) anywhere: nothing is half-applied, and a plain
re-run completes with the schema an uninterrupted run gives.

The kill points cover the whole run: timed ones through start-up and connecting (measured on an
uninterrupted run first), then, watching the database, one SIGINT and one SIGKILL just after
each migration boundary, a few milliseconds into the next migration's transaction.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from agentdb import migrate
from tests import _pg

IDS = migrate.migration_ids()
MIGRATE = [sys.executable, "-m", "agentdb", "migrate", "--dsn"]


@dataclass(frozen=True)
class Kill:
    """Send ``sig`` ``jitter`` seconds after the target has ``records`` migrations recorded
    (``records=None``: ``jitter`` seconds after the start, whatever the child is doing)."""

    sig: signal.Signals
    records: int | None
    jitter: float

    def __str__(self) -> str:
        where = "after start" if self.records is None else f"after {self.records} recorded"
        return f"{self.sig.name} {self.jitter * 1000:.0f} ms {where}"


def _recorded(conn: psycopg.Connection[Any]) -> list[str]:
    try:
        rows = conn.execute("SELECT migration_id FROM _yoyo_migration").fetchall()
    except psycopg.errors.UndefinedTable:
        return []
    return sorted(str(r[0]) for r in rows)


def _others(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()
    return int(row[0]) if row else 0


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.0005)


def _migrate(dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MIGRATE, dsn], capture_output=True, text=True, check=False)


def _connect_time(server: _pg.Server) -> float:
    """Seconds from spawning `agentdb migrate` until its session shows up on the server."""
    with _pg.temp_database(server) as name, _pg.admin(server.url(name)) as conn:
        start = time.monotonic()
        proc = subprocess.Popen([*MIGRATE, server.url(name)], stdout=subprocess.DEVNULL)
        _wait_for(lambda: _others(conn) > 0 or proc.poll() is not None, "the child to connect")
        took = time.monotonic() - start
        assert proc.wait(60) == 0
    return took


def _prefix_dumps(server: _pg.Server) -> list[str]:
    """dumps[k]: the schema with the first k migrations applied (from the full one, down)."""
    with _pg.temp_database(server) as name:
        dsn = server.url(name)
        assert _migrate(dsn).returncode == 0
        dumps = [_pg.schema_dump(dsn)]
        for _ in IDS:
            migrate.rollback(dsn, count=1)
            dumps.append(_pg.schema_dump(dsn))
    return dumps[::-1]


@dataclass(frozen=True)
class Outcome:
    kill: Kill
    code: int
    recorded: int
    stderr: str


def _kill_and_rerun(server: _pg.Server, kill: Kill, dumps: list[str]) -> Outcome:
    with _pg.temp_database(server) as name, _pg.admin(server.url(name)) as watch:
        dsn = server.url(name)
        proc = subprocess.Popen(
            [*MIGRATE, dsn], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            need = kill.records
            if need is not None:
                # 0 recorded: wait for the child's session, so the kill lands after it connected.
                reached: Callable[[], bool] = (lambda: _others(watch) > 0) if need == 0 else (
                    lambda: len(_recorded(watch)) >= need
                )  # fmt: skip
                _wait_for(lambda: reached() or proc.poll() is not None, str(kill))
            time.sleep(kill.jitter)
            proc.send_signal(kill.sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # A SIGKILLed client's server process runs on until it notices: let it finish.
        _wait_for(lambda: _others(watch) == 0, "the killed run's session to end")
        recorded = _recorded(watch)
        assert recorded == IDS[: len(recorded)], (str(kill), recorded)
        # Nothing half-applied: exactly the recorded migrations are in the schema.
        assert _pg.schema_dump(dsn) == dumps[len(recorded)], str(kill)
        again = _migrate(dsn)
        assert again.returncode == 0, (str(kill), again.stderr)
        assert again.stdout.count("applied ") == len(IDS) - len(recorded), str(kill)
        assert _pg.schema_dump(dsn) == dumps[-1], str(kill)
        return Outcome(kill, proc.returncode, len(recorded), err)


def test_migrate_killed_anywhere_reruns_to_the_identical_schema(
    pg_server: _pg.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    dumps = _prefix_dumps(pg_server)
    assert "CREATE TABLE public.agent_tasks" in dumps[-1]
    assert dumps[0] != dumps[-1]
    connect = _connect_time(pg_server)
    signals = [signal.SIGINT, signal.SIGKILL]
    timed = [Kill(signals[i % 2], None, connect * i / 6) for i in range(7)]
    # Into the next migration's transaction (each takes 3-11 ms here): each boundary gets
    # both signals, at different offsets.
    watched = [
        Kill(sig, k, 0.001 * ((3 * k + j * 2) % 5))
        for k in range(len(IDS))
        for j, sig in enumerate(signals)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda k: _kill_and_rerun(pg_server, k, dumps), timed + watched))

    for o in outcomes:
        if o.kill.sig == signal.SIGINT:
            # 130 and one line from the CLI's handler; -2 when the signal came before Python
            # could raise it (interpreter start-up) or after main() returned; 0: too late;
            # 1 only from CPython itself, interrupted while setting up its standard streams
            # or importing runpy for ``-m`` (before any module of agentdb is imported; seen
            # on a loaded machine, 92 ms after the start).
            startup = o.code == 1 and o.stderr.startswith(
                ("Fatal Python error: init_", "Could not import runpy module")
            )
            assert o.code in (130, -signal.SIGINT, 0) or startup, (str(o.kill), o.code, o.stderr)
            if o.code == 130:
                assert o.stderr == "agentdb: interrupted\n", (str(o.kill), o.stderr)
            # A traceback may only come from before agentdb's CLI runs (runpy importing it).
            assert "agentdb/tools/cli.py" not in o.stderr, (str(o.kill), o.stderr)
    midway = [o for o in outcomes if 0 < o.recorded < len(IDS)]
    assert len(midway) >= len(IDS), "too few kills landed between the first and last migration"
    with capsys.disabled():
        codes = Counter((o.kill.sig.name, o.code) for o in outcomes)
        early = sum("Traceback" in o.stderr for o in outcomes)
        print(
            f"\n{len(outcomes)} kills ({sum(o.kill.sig == signal.SIGINT for o in outcomes)}"
            f" SIGINT, {sum(o.kill.sig == signal.SIGKILL for o in outcomes)} SIGKILL),"
            f" recorded before the re-run: {sorted(Counter(o.recorded for o in outcomes).items())},"
            f" exit codes: {dict(codes)}, start-up tracebacks: {early};"
            " every re-run completed with the identical schema"
        )
