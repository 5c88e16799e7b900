"""What every comparison shares: sizes, throwaway databases, probes, clocks, statistics."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, LiteralString, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from agentdb import _db, _dsn
from agentdb.errors import DatabaseUnavailable

__all__ = [
    "ANALYZE",
    "FULL",
    "HOUR",
    "QUICK",
    "SKIP_1M_LARGE",
    "Clock",
    "Cycle",
    "Database",
    "Databases",
    "Probe",
    "Sizes",
    "Window",
    "hold",
    "median",
    "migrate_locked",
    "percentile",
    "ratios",
    "seed_tasks",
]

T = TypeVar("T")

HOUR = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each comparison does per run."""

    stmt_ops: int  # statements per variant per repetition (statement overhead)
    stmt_conns: int  # connections (and concurrent callers) for statement overhead
    cycle_tasks: int  # tasks per run (task cycle)
    cycle_tasks_slow: int  # per run for the slow paths (Procrastinate, agentdb per step)
    relay_rows: int  # outbox rows per run
    scale_small: int  # tasks in the small table (scaling)
    scale_large: int  # tasks in the large table
    scale_claims: int  # timed claims per table per repetition
    tenants_small: int = 10  # tenants sharing the backlog (scaling with tenants)
    tenants_large: int = 10_000
    tenant_tasks: int = 20_000  # tasks in both, spread evenly over the tenants
    citus_tasks: int = 400  # tasks per run of the Citus comparison (per worker count)
    pickup_samples: int = 200  # tasks timed from creation to handler, per wake-up mode
    snapshot_seconds: float = 600.0  # each run of the held-snapshot comparison
    versus_units: int = 1000  # single-effect units per run (agentdb against DBOS)
    versus_runs: int = 400  # multi-step agent runs per run
    versus_workers: int = 4  # worker processes per side
    versus_concurrency: int = 10  # units each process runs at once
    versus_warmup: int = 600  # units each run does first, unmeasured (warm connections)


FULL = Sizes(8000, 16, 8000, 1500, 40_000, 10_000, 1_000_000, 1000)
QUICK = Sizes(640, 16, 400, 100, 2000, 10_000, 100_000, 150, 10, 1_000, 4_000, 80, 30, 5.0,
              versus_units=120, versus_runs=60, versus_workers=2,
              versus_concurrency=5, versus_warmup=20)  # fmt: skip
SKIP_1M_LARGE = 100_000
# Rows per seeding statement: large enough to amortise the round trip, small
# enough that one statement's WAL and memory stay modest.
_SEED_CHUNK = 50_000
# Serialises migrations (which may CREATE ROLE cluster-wide) with other
# sessions on the same server that migrate agentdb at the same moment.
_ROLE_LOCK = 0x61_67_65_6E_74_64_62

# Bulk seeding: every task is born with its creation event (task_state_version
# 0) in the same statement, as the deferred event trigger demands (G8).
_SEED_TASKS: LiteralString = """
WITH t AS (
    INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, params)
    SELECT $1, $2, '1', jsonb_build_object('n', g) FROM generate_series(1, $3) AS g
    RETURNING tenant_id, id, workflow_version, state, state_version, trace_id, span_id
)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, to_state,
                          task_state_version, trace_id, span_id)
SELECT tenant_id, id, 'task.created', 'bench', workflow_version, state, state_version,
       trace_id, span_id
FROM t
"""
# Statistics as autovacuum keeps them on a live system, taken before each
# timed run (for every contender): plans made while a table was empty - the
# foreign-key checks' cached plans included - would otherwise scan it whole.
ANALYZE: LiteralString = "ANALYZE agent_tasks, agent_operations, agent_events, agent_outbox"
_BACKENDS: LiteralString = (
    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
)
_SETTINGS: LiteralString = "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])"
_REPORTED_SETTINGS = ["fsync", "synchronous_commit", "shared_buffers", "max_connections"]


# --- Small statistics -------------------------------------------------------


def median(values: Sequence[float]) -> float:
    """The median, or NaN for no values (the report prints it as n/a)."""
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample.

    Raises:
        IndexError: ``values`` is empty.
    """
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-repetition ratios a_i / b_i: each pair ran back to back."""
    return [x / y for x, y in zip(a, b, strict=False) if y > 0]


# --- Databases -------------------------------------------------------------


@contextlib.contextmanager
def _admin(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit psycopg connection to ``dsn``, for CREATE / DROP DATABASE and locks.

    Raises:
        ConfigurationError: ``dsn`` is not a postgresql:// URL.
        DatabaseUnavailable: the server cannot be reached or refuses the login (so the
            command line says so in one line instead of a traceback).
    """
    try:
        conn = psycopg.connect(
            _dsn.libpq(dsn), autocommit=True, connect_timeout=10, prepare_threshold=None
        )
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())  # libpq's message spans lines
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {reason}") from exc
    with conn:
        yield conn


@dataclass(frozen=True, slots=True)
class Database:
    """One database the bench created: its name (for the probes) and its URL."""

    name: str
    url: str


@dataclass
class Databases:
    """The databases one bench run creates on the server, and drops again."""

    admin_dsn: str
    tag: str
    created: list[str] = field(default_factory=list)

    def name(self, kind: str) -> str:
        # Names are built from a fixed prefix and random hex only; they are
        # still quoted as identifiers, never pasted into SQL text.
        return f"{kind}_bench_{self.tag}"

    def url(self, name: str) -> str:
        """``admin_dsn`` pointed at database ``name``, as a libpq URL.

        Raises:
            ConfigurationError: ``admin_dsn`` is not a postgresql:// URL.
        """
        # agentdb._dsn rewrites schemes and query arguments, not the database
        # (the URL path), so the path is replaced here.
        return urlunsplit(urlsplit(_dsn.libpq(self.admin_dsn))._replace(path=f"/{name}"))

    def create(self, name: str, template: str | None = None) -> Database:
        """Create database ``name`` (a copy of ``template`` if given).

        Raises:
            ConfigurationError: ``admin_dsn`` is not a postgresql:// URL.
            DatabaseUnavailable: the server cannot be reached or refuses the login.
            psycopg.Error: the server refused (no CREATEDB right, name taken, template busy).
        """
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with _admin(self.admin_dsn) as conn:
            conn.execute(stmt)
        self.created.append(name)
        return Database(name, self.url(name))

    def drop_all(self) -> None:
        """Drop every database :meth:`create` made, even with sessions still open.

        Raises:
            DatabaseUnavailable: the server cannot be reached or refuses the login.
            psycopg.Error: the server refused the drop.
        """
        if not self.created:
            return
        with _admin(self.admin_dsn) as conn:
            for name in reversed(self.created):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        self.created.clear()


def migrate_locked(admin_dsn: str, dsn: str) -> None:
    """Migrate ``dsn`` while holding the cluster-wide role lock on ``admin_dsn``.

    Raises:
        DatabaseUnavailable: the server cannot be reached or refuses the login; whatever
            :func:`agentdb.migrate.migrate` raises.
    """
    from agentdb.migrate import migrate

    with _admin(admin_dsn) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_ROLE_LOCK,))
        try:
            migrate(dsn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_ROLE_LOCK,))


@contextlib.asynccontextmanager
async def hold(pool: _db.Pool, n: int) -> AsyncIterator[list[_db.Conn]]:
    """``n`` connections from ``pool``, held for the block and released after it."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(_db.connection(pool)) for _ in range(n)]


async def seed_tasks(db: _db.Executor, tenant: uuid.UUID, task_type: str, n: int) -> None:
    """Insert ``n`` pending tasks of ``task_type``, each with its creation event."""
    for start in range(0, n, _SEED_CHUNK):
        await db.execute(_SEED_TASKS, tenant, task_type, min(_SEED_CHUNK, n - start))


# --- Where the time goes ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Snap:
    wall: float
    client_cpu: float
    backend_ticks: dict[int, int]
    wal: int


@dataclass(frozen=True, slots=True)
class Window:
    """One timed run: the snapshots around it and when the work itself started and ended."""

    before: _Snap
    after: _Snap
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """How long the work itself took (the snapshots left out)."""
        return self.end - self.start


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


def _is_postgres(pid: int) -> bool:
    """Whether ``pid`` on this machine is a postgres process (the server is local)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii") as f:
            return f.read().strip().startswith("postgres")
    except OSError:
        return False


def _proc_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat.rpartition(")")[2].split()
    return int(rest[11]) + int(rest[12])  # utime + stime, in clock ticks


class Probe:
    """Client CPU, server backend CPU and WAL bytes over a run.

    Backend CPU is read from ``/proc/<pid>/stat`` of the run's database
    backends, so it is only reported for a server on this machine; WAL is
    ``pg_current_wal_lsn()``, cluster-wide (other databases' writes count too).
    """

    def __init__(self, conn: _db.Conn, local: bool) -> None:
        self.conn = conn
        self.local = local
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @classmethod
    async def open(cls, admin_dsn: str) -> Probe:
        """Connect to ``admin_dsn`` and find out whether the server runs on this machine.

        Raises:
            ConfigurationError, DatabaseUnavailable: as for :func:`agentdb._db.connect`.
        """
        conn = await _db.connect(admin_dsn)
        pid: int = await conn.fetchval("SELECT pg_backend_pid()")
        return cls(conn, _is_postgres(pid))

    async def server(self) -> tuple[str, dict[str, str]]:
        """The server's version and the settings the report names."""
        version: str = await self.conn.fetchval("SHOW server_version")
        rows = await self.conn.fetch(_SETTINGS, _REPORTED_SETTINGS)
        return version, {r["name"]: r["setting"] for r in rows}

    async def take(self, dbname: str) -> _Snap:
        """Wall clock, this process's CPU, ``dbname``'s backends' CPU ticks, the WAL position."""
        ticks: dict[int, int] = {}
        if self.local:
            for r in await self.conn.fetch(_BACKENDS, dbname):
                t = _proc_ticks(r["pid"])
                if t is not None:
                    ticks[r["pid"]] = t
        wal = _lsn(await self.conn.fetchval("SELECT pg_current_wal_lsn()::text"))
        return _Snap(time.perf_counter(), time.process_time(), ticks, wal)

    async def timed(self, dbname: str, work: Callable[[], Awaitable[T]]) -> tuple[T, Window]:
        """Start ``work()`` between two snapshots of ``dbname``; return its result and window.

        ``work`` is a factory, not an awaitable: ``asyncio.gather`` starts its
        tasks at once, which would put their first steps before the snapshot.

        Raises:
            whatever ``work`` raises.
        """
        before = await self.take(dbname)
        start = time.perf_counter()
        result = await work()
        end = time.perf_counter()
        return result, Window(before, await self.take(dbname), start, end)

    def usage(self, w: Window, units: int) -> dict[str, float]:
        """CPU shares, CPU µs and WAL bytes per unit of work over ``w``."""
        a, b = w.before, w.after
        wall = b.wall - a.wall
        out = {
            "client_cpu_share": (b.client_cpu - a.client_cpu) / wall if wall > 0 else math.nan,
            "client_cpu_us_per_unit": (b.client_cpu - a.client_cpu) * 1e6 / units
            if units
            else math.nan,
            "wal_bytes_per_unit": (b.wal - a.wal) / units if units else math.nan,
        }
        if self.local:
            ticks = sum(t - a.backend_ticks.get(pid, 0) for pid, t in b.backend_ticks.items())
            out["server_cpu_us_per_unit"] = ticks / self.tick * 1e6 / units if units else math.nan
            out["server_cpu_share"] = ticks / self.tick / wall if wall > 0 else math.nan
        return out

    async def close(self) -> None:
        await self.conn.close()


class Clock:
    """Time from the first unit of work handed out to the end of a run.

    Startup (connecting, schema checks, worker registration) is left out for
    every contender alike.
    """

    def __init__(self) -> None:
        self.first: float | None = None

    def mark(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()


@dataclass
class Cycle:
    """The outcome of one task-cycle run."""

    done: int
    refused: int = 0
    #: CPU seconds of the processes that ran it, when they were not this one.
    client_cpu: float | None = None
