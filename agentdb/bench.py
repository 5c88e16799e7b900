"""``agentdb bench``: agentdb side by side with raw asyncpg, PgQueuer and Procrastinate.

Four comparisons, each run with its contenders interleaved in the same
process and on the same server (A B A B ..., ``--reps`` repetitions; medians
with min-max), so noisy neighbours hit every contender alike:

1. **Statement overhead** - agentdb's helpers (transition + event, reserve,
   claim, complete) against ``conn.fetch`` of the very same SQL text and
   arguments, on the same number of connections.
2. **Task cycle** - claim under a lease, reserve and complete an operation,
   finish the task with its event and an outbox row (which drops the lease),
   with 1 and 4 workers: agentdb one statement per step, agentdb batched
   (``reserve_many`` / ``operations.complete_many`` / ``tasks.complete_many``),
   PgQueuer (default and tuned batch) and Procrastinate no-op jobs.
3. **Outbox relay** - :class:`agentdb.relay.Relay` and the outbox helpers
   against raw SKIP LOCKED drains.
4. **Scaling** - claim latency (p50 / p99) with a small and a large task
   table, and the claim's plan.

It creates its own databases (``agentdb_bench_<hex>``, ``pgqueuer_bench_<hex>``,
``procrastinate_bench_<hex>``), drops them at the end, and writes
``report.md``, ``results.json`` and ``chart.png``. It is a benchmark, not a
test: it reports what it measures and asserts no speed.

    python -m agentdb.bench --quick                      # embedded Postgres, < 1 minute
    agentdb bench --dsn postgresql://postgres@host/postgres --out bench-results
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, LiteralString, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psycopg
from psycopg import sql

from agentdb import _exec, leases, operations, outbox, tasks, tenancy
from agentdb.errors import AgentDBError, ConfigurationError
from agentdb.models import Lease, Message, Operation, OutboxMessage, Reservation, Task

__all__ = ["FULL", "QUICK", "Sizes", "main", "register", "run"]

HOUR = timedelta(hours=1)
_Q = _exec.QUERIES
_UNSETTLED = ["reserved", "in_flight", "unknown"]
# Serialises migrations (which may CREATE ROLE cluster-wide) with other
# sessions on the same server that migrate agentdb at the same moment.
_ROLE_LOCK = 0x61_67_65_6E_74_64_62


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


FULL = Sizes(8000, 16, 8000, 1500, 40_000, 10_000, 1_000_000, 1000)
QUICK = Sizes(640, 16, 400, 100, 2000, 10_000, 100_000, 150)
_SKIP_1M_LARGE = 100_000
_SEED_CHUNK = 50_000
_WARM = 4  # untimed statements per connection and variant before the timed ones

# --- Static SQL the benchmark itself runs (seeding and the raw baselines) ---

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
_SEED_OUTBOX: LiteralString = """
INSERT INTO agent_outbox (tenant_id, topic, payload)
SELECT $1, 'bench.relay', jsonb_build_object('n', g) FROM generate_series(1, $2) AS g
"""
# Statistics as autovacuum keeps them on a live system, taken before each
# timed run (for every contender): plans made while a table was empty - the
# foreign-key checks' cached plans included - would otherwise scan it whole.
_ANALYZE: LiteralString = "ANALYZE agent_tasks, agent_operations, agent_events, agent_outbox"
_COUNT_DONE: LiteralString = (
    "SELECT count(*) FROM agent_tasks WHERE task_type = $1 AND state = 'succeeded'"
)
# The raw baselines for the outbox: what one would hand-write without agentdb.
# One statement per batch: mark delivered, then publish (at most once).
_RAW_DRAIN: LiteralString = """
WITH due AS (
    SELECT tenant_id, id FROM agent_outbox
    WHERE state = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE agent_outbox o SET state = 'delivered', delivered_at = now()
FROM due WHERE o.tenant_id = due.tenant_id AND o.id = due.id
RETURNING o.id, o.topic, o.payload
"""
# Select under a row lock, publish, mark, commit (at least once; holds a
# transaction across the publish).
_RAW_SELECT: LiteralString = """
SELECT tenant_id, id, topic, payload FROM agent_outbox
WHERE state = 'pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
_RAW_MARK: LiteralString = """
UPDATE agent_outbox SET state = 'delivered', delivered_at = now()
WHERE (tenant_id, id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))
"""
_EXPLAIN_CLAIM: LiteralString = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + _Q["task_claim"].sql
_BACKENDS: LiteralString = (
    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
)


# --- Small statistics -------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-repetition ratios a_i / b_i: each pair ran back to back."""
    return [x / y for x, y in zip(a, b, strict=False) if y > 0]


def _fmt(v: float, digits: int = 0) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:,.{digits}f}"


def _fmt_range(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "n/a"
    return (
        f"{_fmt(_median(values), digits)} ({_fmt(min(values), digits)}-{_fmt(max(values), digits)})"
    )


# --- Databases -------------------------------------------------------------


def _with_db(dsn: str, name: str) -> str:
    """``dsn`` pointed at database ``name`` (postgresql:// URLs only)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigurationError("--dsn must be a postgresql:// URL")
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


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
        return _with_db(self.admin_dsn, name)

    def create(self, name: str, template: str | None = None) -> str:
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(stmt)
        self.created.append(name)
        return self.url(name)

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in reversed(self.created):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        self.created.clear()


def _migrate_locked(admin_dsn: str, dsn: str) -> None:
    from agentdb.migrate import migrate

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_ROLE_LOCK,))
        try:
            migrate(dsn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_ROLE_LOCK,))


# --- Where the time goes ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Snap:
    wall: float
    client_cpu: float
    backend_ticks: dict[int, int]
    wal: int


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

    def __init__(self, conn: asyncpg.Connection[Any], local: bool) -> None:
        self.conn = conn
        self.local = local
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @classmethod
    async def open(cls, admin_dsn: str) -> Probe:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(admin_dsn)
        pid: int = await conn.fetchval("SELECT pg_backend_pid()")
        return cls(conn, _is_postgres(pid))

    async def take(self, dbname: str) -> _Snap:
        ticks: dict[int, int] = {}
        if self.local:
            for r in await self.conn.fetch(_BACKENDS, dbname):
                t = _proc_ticks(r["pid"])
                if t is not None:
                    ticks[r["pid"]] = t
        wal = _lsn(await self.conn.fetchval("SELECT pg_current_wal_lsn()::text"))
        return _Snap(time.perf_counter(), time.process_time(), ticks, wal)

    def usage(self, a: _Snap, b: _Snap, units: int) -> dict[str, float]:
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


# --- Helpers shared by the comparisons --------------------------------------


async def _seed_tasks(
    db: asyncpg.Pool[Any] | asyncpg.Connection[Any], tenant: uuid.UUID, task_type: str, n: int
) -> None:
    for start in range(0, n, _SEED_CHUNK):
        await db.execute(_SEED_TASKS, tenant, task_type, min(_SEED_CHUNK, n - start))


def _digest(value: Any) -> str:
    """What a hand-written idempotency layer would hash: sorted-key JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class _Clock:
    """Time from the first unit of work handed out to the end of a run.

    Startup (connecting, schema checks, worker registration) is left out for
    every contender alike.
    """

    def __init__(self) -> None:
        self.first: float | None = None

    def mark(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()


# --- 1. Statement overhead --------------------------------------------------


@dataclass
class _Slot:
    """One connection's own running task and lease, for statement overhead."""

    tenant: uuid.UUID
    lease: Lease
    version: int
    ops: list[Operation] = field(default_factory=list)
    raw_rows: list[asyncpg.Record] = field(default_factory=list)
    used: int = 0

    @property
    def task_id(self) -> uuid.UUID:
        return self.lease.task_id

    @property
    def owner(self) -> str:
        return self.lease.owner

    @property
    def token(self) -> int:
        return self.lease.token


_Body: TypeAlias = "Callable[[_exec.Conn, _Slot, int, str], Awaitable[None]]"


async def _transition_helper(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    for _ in range(n):
        t = await tasks.transition(
            conn,
            s.tenant,
            s.task_id,
            expected_version=s.version,
            to_state="running",
            step="bench",
            lease=s.lease,
        )
        s.version = t.state_version


async def _transition_raw(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    q = _Q["task_transition"].sql
    for _ in range(n):
        rows = await conn.fetch(
            q,
            s.tenant,
            s.task_id,
            s.version,
            "running",
            True,
            "bench",
            None,
            None,
            s.owner,
            s.token,
            "task.running",
            s.owner,
            "{}",
            [],
            [],
            [],
            None,
            None,
        )
        if len(rows) != 1:
            raise RuntimeError("raw transition matched no row")
        s.version = rows[0]["state_version"]


async def _reserve_helper(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    for i in range(n):
        res = await operations.reserve(
            conn, s.tenant, s.task_id, f"{tag}-{i}", "send", {"n": i}, lease=s.lease
        )
        s.ops.append(res.operation)


async def _reserve_raw(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    q = _Q["operation_reserve"].sql
    for i in range(n):
        rows = await conn.fetch(
            q,
            s.tenant,
            uuid.uuid4(),
            s.task_id,
            f"{tag}-{i}",
            "send",
            _digest({"n": i}),
            s.owner,
            s.owner,
            s.token,
            None,
            None,
        )
        if len(rows) != 1 or not rows[0]["created"]:
            raise RuntimeError("raw reserve did not reserve")
        s.raw_rows.append(rows[0])


async def _claim_helper(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    for _ in range(n):
        got = await leases.claim(conn, s.owner, batch=1, lease_ttl=HOUR, task_types=["claim"])
        if len(got) != 1:
            raise RuntimeError("the claim queue ran dry")


async def _claim_raw(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    q = _Q["task_claim"].sql
    for _ in range(n):
        rows = await conn.fetch(q, s.owner, 1, HOUR, ["claim"])
        if len(rows) != 1:
            raise RuntimeError("the claim queue ran dry")


async def _complete_helper(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    for op in s.ops[s.used : s.used + n]:
        await operations.complete(
            conn, op, result={"ok": True}, provider_reference="ref", lease=s.lease
        )
    s.used += n


async def _complete_raw(conn: _exec.Conn, s: _Slot, n: int, tag: str) -> None:
    q = _Q["operation_settle"].sql
    for op in s.ops[s.used : s.used + n]:
        rows = await conn.fetch(
            q,
            s.tenant,
            op.id,
            op.state_version,
            _UNSETTLED,
            "succeeded",
            "ref",
            json.dumps({"ok": True}),
            None,
            s.owner,
            s.owner,
            s.token,
            "operation.succeeded",
        )
        if len(rows) != 1:
            raise RuntimeError("raw complete matched no row")
    s.used += n


_STATEMENTS: tuple[tuple[str, _Body, _Body], ...] = (
    ("transition + event", _transition_helper, _transition_raw),
    ("reserve", _reserve_helper, _reserve_raw),
    ("claim", _claim_helper, _claim_raw),
    ("complete", _complete_helper, _complete_raw),
)


async def bench_statements(dsn: str, sizes: Sizes, reps: int, probe: Probe) -> list[dict[str, Any]]:
    conns = sizes.stmt_conns
    per_conn = max(1, sizes.stmt_ops // conns)
    total = per_conn * conns
    dbname = urlsplit(dsn).path.lstrip("/")
    pool: asyncpg.Pool[Any] = await asyncpg.create_pool(dsn, min_size=conns, max_size=conns)
    try:
        tenant = await tenancy.create_tenant(pool, "bench-statements")
        await _seed_tasks(pool, tenant, "slot", conns)
        await _seed_tasks(pool, tenant, "claim", (total + _WARM * conns) * 2 * reps)
        slots: list[_Slot] = []
        for i in range(conns):
            [t] = await leases.claim(pool, f"stmt-{i}", lease_ttl=HOUR, task_types=["slot"])
            assert t.lease is not None
            slots.append(_Slot(tenant, t.lease, t.state_version))
        held = [await pool.acquire() for _ in range(conns)]
        try:
            out: list[dict[str, Any]] = []
            for name, helper, raw in _STATEMENTS:
                if name == "complete":
                    # Complete the operations the reserve runs left reserved.
                    for s in slots:
                        s.ops.extend(Operation.from_record(r) for r in s.raw_rows)
                        s.raw_rows.clear()
                # Untimed warm-up: prepares the statements on every connection and
                # gives empty tables rows, so the plans Postgres caches (its own
                # foreign-key checks included) are made with real statistics.
                for variant, body in (("agentdb", helper), ("raw", raw)):
                    await asyncio.gather(
                        *(
                            body(c, s, _WARM, f"warm-{variant}-{k}")
                            for k, (c, s) in enumerate(zip(held, slots, strict=True))
                        )
                    )
                rates: dict[str, list[float]] = {"agentdb": [], "raw": []}
                cpu: dict[str, list[float]] = {
                    f"{v}_{k}": [] for v in ("helper", "raw") for k in ("client_us", "server_us")
                }
                for rep in range(reps):
                    for variant, body in (("agentdb", helper), ("raw", raw)):
                        tag = f"{variant}-{rep}"
                        jobs = [
                            body(c, s, per_conn, f"{tag}-{k}")
                            for k, (c, s) in enumerate(zip(held, slots, strict=True))
                        ]
                        await held[0].execute(_ANALYZE)
                        before = await probe.take(dbname)
                        t0 = time.perf_counter()
                        await asyncio.gather(*jobs)
                        rates[variant].append(total / (time.perf_counter() - t0))
                        usage = probe.usage(before, await probe.take(dbname), total)
                        who = "helper" if variant == "agentdb" else "raw"
                        cpu[f"{who}_client_us"].append(usage["client_cpu_us_per_unit"])
                        if "server_cpu_us_per_unit" in usage:
                            cpu[f"{who}_server_us"].append(usage["server_cpu_us_per_unit"])
                out.append(
                    {"statement": name, "ops_per_rep": total, "connections": conns, **rates, **cpu}
                )
            return out
        finally:
            for c in held:
                await pool.release(c)
    finally:
        await pool.close()


# --- 2. Task cycle -----------------------------------------------------------


@dataclass
class _Cycle:
    """The outcome of one task-cycle run."""

    done: int
    refused: int = 0


async def _agentdb_single(
    conns: Sequence[_exec.Conn], task_type: str, clock: _Clock, batch: int
) -> _Cycle:
    """One statement per step: claim a batch, then reserve, complete, finish each task."""
    result = _Cycle(0)

    async def worker(conn: _exec.Conn, owner: str) -> None:
        while True:
            claimed = await leases.claim(
                conn, owner, batch=batch, lease_ttl=HOUR, task_types=[task_type]
            )
            if not claimed:
                return
            clock.mark()
            for t in claimed:
                res = await operations.reserve(
                    conn,
                    t.tenant_id,
                    t.id,
                    f"{t.id}/send",
                    "send",
                    {"n": t.params["n"]},
                    lease=t.lease,
                )
                if res.fresh:  # the provider call would go here, outside any transaction
                    await operations.complete(
                        conn,
                        res.operation,
                        result={"ok": True},
                        provider_reference=f"ref-{t.params['n']}",
                        lease=t.lease,
                    )
                await tasks.transition(
                    conn,
                    t.tenant_id,
                    t.id,
                    expected_version=t.state_version,
                    to_state="succeeded",
                    lease=t.lease,
                    outbox=[Message("task.done", {"n": t.params["n"]})],
                )
                result.done += 1

    await asyncio.gather(*(worker(c, f"single-{i}") for i, c in enumerate(conns)))
    return result


async def _agentdb_batched(
    conns: Sequence[_exec.Conn], task_type: str, clock: _Clock, batch: int
) -> _Cycle:
    """One statement per step for the whole claimed batch."""
    result = _Cycle(0)

    async def worker(conn: _exec.Conn, owner: str) -> None:
        while True:
            claimed = await leases.claim(
                conn, owner, batch=batch, lease_ttl=HOUR, task_types=[task_type]
            )
            if not claimed:
                return
            clock.mark()
            held = [(t, t.lease) for t in claimed if t.lease is not None]
            reserved = await operations.reserve_many(
                conn,
                [
                    operations.ReserveRequest(lease, f"{t.id}/send", "send", {"n": t.params["n"]})
                    for t, lease in held
                ],
            )
            # The provider calls would go here, outside any transaction.
            settled = await operations.complete_many(
                conn,
                [
                    operations.Completion(
                        r.operation,
                        result={"ok": True},
                        provider_reference=f"ref-{t.params['n']}",
                        lease=lease,
                    )
                    for (t, lease), r in zip(held, reserved, strict=True)
                    if isinstance(r, Reservation) and r.fresh
                ],
            )
            finished = await tasks.complete_many(
                conn,
                claimed,
                outbox={t.id: [Message("task.done", {"n": t.params["n"]})] for t in claimed},
            )
            result.refused += sum(
                isinstance(r, AgentDBError) for r in (*reserved, *settled, *finished)
            )
            result.done += sum(isinstance(r, Task) for r in finished)

    await asyncio.gather(*(worker(c, f"batched-{i}") for i, c in enumerate(conns)))
    return result


async def _agentdb_noop(
    conns: Sequence[_exec.Conn], task_type: str, clock: _Clock, batch: int
) -> _Cycle:
    """The same work as a queue's no-op job: claim a batch, finish it (state + event)."""
    result = _Cycle(0)

    async def worker(conn: _exec.Conn, owner: str) -> None:
        while True:
            claimed = await leases.claim(
                conn, owner, batch=batch, lease_ttl=HOUR, task_types=[task_type]
            )
            if not claimed:
                return
            clock.mark()
            finished = await tasks.complete_many(conn, claimed)
            refused = sum(isinstance(r, AgentDBError) for r in finished)
            result.refused += refused
            result.done += len(finished) - refused

    await asyncio.gather(*(worker(c, f"noop-{i}") for i, c in enumerate(conns)))
    return result


_AGENTDB_RUNS: dict[str, Callable[[Sequence[_exec.Conn], str, _Clock, int], Awaitable[_Cycle]]] = {
    "agentdb-single": _agentdb_single,
    "agentdb-batched": _agentdb_batched,
    "agentdb-noop": _agentdb_noop,
}


@dataclass
class _Contender:
    name: str
    workers: int
    kind: str  # agentdb-single, agentdb-batched, agentdb-noop, pgqueuer or procrastinate
    batch: int
    note: str = ""


class _Peers:
    """The optional peers, imported if installed; a missing one is reported, not fatal."""

    def __init__(self) -> None:
        self.missing: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        for name in ("pgqueuer", "procrastinate"):
            try:
                importlib.import_module(name)
                self.versions[name] = importlib.metadata.version(name)
            except Exception as exc:  # ImportError, or a broken install
                self.missing[name] = f"{type(exc).__name__}: {exc}"

    def has(self, name: str) -> bool:
        return name not in self.missing


async def _pgqueuer_install(dsn: str) -> None:
    from pgqueuer.db import AsyncpgDriver  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.queries import Queries  # type: ignore[import-not-found,unused-ignore]

    conn: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def _pgqueuer_run(
    dsn: str, workers: int, batch: int, n: int, clock: _Clock, probe: Probe, dbname: str
) -> tuple[_Cycle, dict[str, float]]:
    from pgqueuer.db import AsyncpgDriver  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.models import Job  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.qm import QueueManager  # type: ignore[import-not-found,unused-ignore]
    from pgqueuer.queries import Queries  # type: ignore[import-not-found,unused-ignore]

    seed: asyncpg.Connection[Any] = await asyncpg.connect(dsn)
    conns: list[asyncpg.Connection[Any]] = [await asyncpg.connect(dsn) for _ in range(workers)]
    try:
        payloads: list[bytes | None] = [None] * n
        await Queries(AsyncpgDriver(seed)).enqueue(["noop"] * n, payloads, [0] * n)
        await seed.execute("ANALYZE")  # as for agentdb: fresh statistics before the run
        done = _Cycle(0)
        managers: list[Any] = []

        async def noop(job: Job) -> None:
            clock.mark()
            done.done += 1
            if done.done >= n:
                # Every job ran: stop; run() returns once the batched
                # completion log is flushed (committed).
                for qm in managers:
                    qm.shutdown.set()

        for c in conns:
            qm = QueueManager(Queries(AsyncpgDriver(c)))
            qm.entrypoint("noop", accepts_context=False)(noop)
            managers.append(qm)
        before = await probe.take(dbname)
        await asyncio.gather(*(qm.run(batch_size=batch) for qm in managers))
        end = time.perf_counter()
        after = await probe.take(dbname)
        usage = probe.usage(before, after, n)
        usage["end"] = end
        return done, usage
    finally:
        for c in (seed, *conns):
            await c.close()


def _quiet_procrastinate() -> None:
    # Procrastinate warns when its App is created in ``__main__`` (workers in
    # other processes could not import the tasks); these workers run here.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)


async def _procrastinate_install(dsn: str) -> None:
    import procrastinate  # type: ignore[import-not-found,unused-ignore]

    _quiet_procrastinate()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def _procrastinate_run(
    dsn: str, workers: int, n: int, clock: _Clock, probe: Probe, dbname: str
) -> tuple[_Cycle, dict[str, float]]:
    import procrastinate  # type: ignore[import-not-found,unused-ignore]

    _quiet_procrastinate()
    connector = procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=workers + 1, max_size=workers + 1
    )
    app = procrastinate.App(connector=connector)
    done = _Cycle(0)

    @app.task(name="noop", queue="bench")
    async def noop() -> None:
        clock.mark()
        done.done += 1

    async with app.open_async():
        await noop.batch_defer_async(*({} for _ in range(n)))
        analyze = await asyncpg.connect(dsn)  # as for agentdb: fresh statistics
        try:
            await analyze.execute("ANALYZE")
        finally:
            await analyze.close()
        before = await probe.take(dbname)
        await asyncio.gather(
            *(
                app.run_worker_async(
                    queues=["bench"],
                    concurrency=1,
                    wait=False,
                    listen_notify=False,
                    install_signal_handlers=False,
                    name=f"w{i}",
                )
                for i in range(workers)
            )
        )
        end = time.perf_counter()
        after = await probe.take(dbname)
    usage = probe.usage(before, after, n)
    usage["end"] = end
    return done, usage


async def bench_cycle(
    dsn: str,
    peer_dsns: dict[str, str],
    sizes: Sizes,
    reps: int,
    peers: _Peers,
    probe: Probe,
    notes: list[str],
) -> list[dict[str, Any]]:
    contenders: list[_Contender] = []
    for w in (1, 4):
        contenders += [
            _Contender("agentdb, one statement per step", w, "agentdb-single", 10,
                       "claim 10, then reserve, complete and finish each task"),
            _Contender("agentdb batched, batch 10", w, "agentdb-batched", 10,
                       "claim, reserve_many, complete_many, tasks.complete_many"),
            _Contender("agentdb batched, batch 250", w, "agentdb-batched", 250,
                       "the same, 250 tasks per statement"),
            _Contender("agentdb no-op tasks, batch 250", w, "agentdb-noop", 250,
                       "claim, tasks.complete_many: no operation, no outbox row"),
            _Contender("PgQueuer default (batch 10)", w, "pgqueuer", 10, "no-op jobs"),
            _Contender("PgQueuer tuned (batch 250)", w, "pgqueuer", 250, "no-op jobs"),
            _Contender("Procrastinate", w, "procrastinate", 1,
                       f"no-op jobs, {w} worker(s) of concurrency 1"),
        ]  # fmt: skip
    contenders = [c for c in contenders if c.kind.startswith("agentdb") or peers.has(c.kind)]
    rows: dict[tuple[str, int], dict[str, Any]] = {
        (c.name, c.workers): {
            "name": c.name,
            "workers": c.workers,
            "kind": c.kind,
            "batch": c.batch,
            "note": c.note,
            "tasks_per_s": [],
            "client_cpu_share": [],
            "server_cpu_share": [],
            "client_cpu_us_per_task": [],
            "server_cpu_us_per_task": [],
            "wal_bytes_per_task": [],
            "tasks_per_run": 0,
            "errors": [],
        }
        for c in contenders
    }
    pool: asyncpg.Pool[Any] = await asyncpg.create_pool(dsn, min_size=4, max_size=4)
    failed: set[str] = set()
    try:
        tenant = await tenancy.create_tenant(pool, "bench-cycle")
        dbname = urlsplit(dsn).path.lstrip("/")
        run_no = 0
        for rep in range(reps):
            for c in contenders:
                if c.kind in failed:
                    continue
                row = rows[(c.name, c.workers)]
                slow = c.kind in ("procrastinate", "agentdb-single")
                n = sizes.cycle_tasks_slow if slow else sizes.cycle_tasks
                row["tasks_per_run"] = n
                clock = _Clock()
                run_no += 1
                try:
                    if c.kind.startswith("agentdb"):
                        task_type = f"cycle-{run_no}"
                        await _seed_tasks(pool, tenant, task_type, n)
                        await pool.execute(_ANALYZE)
                        held = [await pool.acquire() for _ in range(c.workers)]
                        try:
                            before = await probe.take(dbname)
                            got = await _AGENTDB_RUNS[c.kind](held, task_type, clock, c.batch)
                            end = time.perf_counter()
                            after = await probe.take(dbname)
                        finally:
                            for h in held:
                                await pool.release(h)
                        usage = probe.usage(before, after, n)
                        finished = await pool.fetchval(_COUNT_DONE, task_type)
                        if finished != n or got.refused:
                            row["errors"].append(
                                f"rep {rep}: {finished} of {n} succeeded, {got.refused} refused"
                            )
                    elif c.kind == "pgqueuer":
                        got, usage = await _pgqueuer_run(
                            peer_dsns["pgqueuer"],
                            c.workers,
                            c.batch,
                            n,
                            clock,
                            probe,
                            urlsplit(peer_dsns["pgqueuer"]).path.lstrip("/"),
                        )
                        end = usage.pop("end")
                    else:
                        got, usage = await _procrastinate_run(
                            peer_dsns["procrastinate"],
                            c.workers,
                            n,
                            clock,
                            probe,
                            urlsplit(peer_dsns["procrastinate"]).path.lstrip("/"),
                        )
                        end = usage.pop("end")
                except Exception as exc:
                    if c.kind.startswith("agentdb"):
                        raise
                    failed.add(c.kind)
                    notes.append(f"{c.kind} failed and was left out: {type(exc).__name__}: {exc}")
                    continue
                if got.done != n:
                    row["errors"].append(f"rep {rep}: {got.done} of {n} jobs ran")
                if clock.first is None or end <= clock.first:
                    row["errors"].append(f"rep {rep}: no work was timed")
                    continue
                row["tasks_per_s"].append(got.done / (end - clock.first))
                row["client_cpu_share"].append(usage["client_cpu_share"])
                row["client_cpu_us_per_task"].append(usage["client_cpu_us_per_unit"])
                row["wal_bytes_per_task"].append(usage["wal_bytes_per_unit"])
                if "server_cpu_us_per_unit" in usage:
                    row["server_cpu_us_per_task"].append(usage["server_cpu_us_per_unit"])
                    row["server_cpu_share"].append(usage["server_cpu_share"])
    finally:
        await pool.close()
    return [r for r in rows.values() if r["tasks_per_s"] or r["errors"]]


# --- 3. Outbox relay ---------------------------------------------------------


async def _publish(message: OutboxMessage | asyncpg.Record) -> None:
    """A publisher that accepts everything at once: the relay's own cost is what is measured."""


async def _relay_agentdb(pool: asyncpg.Pool[Any], batch: int) -> int:
    from agentdb.relay import Relay

    relay = Relay(pool, _publish, relay_id="bench-relay", batch=batch)
    return await relay.drain()


async def _relay_helpers(pool: asyncpg.Pool[Any], batch: int) -> int:
    delivered = 0
    while claimed := await outbox.claim(pool, "bench-helpers", batch=batch):
        for m in claimed:
            await _publish(m)
        delivered += len(await outbox.mark_delivered(pool, claimed))
    return delivered


async def _relay_raw_one_statement(pool: asyncpg.Pool[Any], batch: int) -> int:
    delivered = 0
    while rows := await pool.fetch(_RAW_DRAIN, batch):
        for r in rows:
            await _publish(r)
        delivered += len(rows)
    return delivered


async def _relay_raw_transaction(pool: asyncpg.Pool[Any], batch: int) -> int:
    delivered = 0
    async with pool.acquire() as conn:
        while True:
            async with conn.transaction():
                rows = await conn.fetch(_RAW_SELECT, batch)
                for r in rows:
                    await _publish(r)
                await conn.execute(
                    _RAW_MARK, [r["tenant_id"] for r in rows], [r["id"] for r in rows]
                )
            if not rows:
                return delivered
            delivered += len(rows)


_RELAYS: tuple[tuple[str, str, Callable[[asyncpg.Pool[Any], int], Awaitable[int]]], ...] = (
    (
        "agentdb Relay.drain()",
        "claim + mark_delivered, publish per message (gather)",
        _relay_agentdb,
    ),
    ("agentdb outbox.claim + mark_delivered", "the helpers in a plain loop", _relay_helpers),
    (
        "raw SKIP LOCKED, one statement",
        "UPDATE … RETURNING, then publish (at most once)",
        _relay_raw_one_statement,
    ),
    (
        "raw SKIP LOCKED, transaction",
        "BEGIN, SELECT … FOR UPDATE, publish, UPDATE, COMMIT",
        _relay_raw_transaction,
    ),
)


async def bench_relay(dsn: str, sizes: Sizes, reps: int, probe: Probe) -> list[dict[str, Any]]:
    batch = 100
    pool: asyncpg.Pool[Any] = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
    dbname = urlsplit(dsn).path.lstrip("/")
    try:
        tenant = await tenancy.create_tenant(pool, "bench-relay")
        # The task cycle left its outbox rows pending: deliver them first, untimed.
        while await pool.fetch(_RAW_DRAIN, 1000):
            pass
        out: dict[str, dict[str, Any]] = {
            name: {
                "name": name,
                "how": how,
                "batch": batch,
                "rows_per_run": sizes.relay_rows,
                "rows_per_s": [],
                "client_cpu_share": [],
                "errors": [],
            }
            for name, how, _ in _RELAYS
        }
        for rep in range(reps):
            for name, _, drain in _RELAYS:
                await pool.execute(_SEED_OUTBOX, tenant, sizes.relay_rows)
                await pool.execute(_ANALYZE)
                before = await probe.take(dbname)
                t0 = time.perf_counter()
                delivered = await drain(pool, batch)
                elapsed = time.perf_counter() - t0
                after = await probe.take(dbname)
                if delivered != sizes.relay_rows:
                    out[name]["errors"].append(
                        f"rep {rep}: delivered {delivered} of {sizes.relay_rows}"
                    )
                out[name]["rows_per_s"].append(delivered / elapsed)
                out[name]["client_cpu_share"].append(
                    probe.usage(before, after, delivered)["client_cpu_share"]
                )
        return list(out.values())
    finally:
        await pool.close()


# --- 4. Scaling --------------------------------------------------------------


async def _seed_large(dsn: str, n: int) -> None:
    """Seed ``n`` pending tasks (with their events) on two connections in parallel."""
    conns: list[asyncpg.Connection[Any]] = [await asyncpg.connect(dsn) for _ in range(2)]
    try:
        tenant = await tenancy.create_tenant(conns[0], "bench-scaling")
        chunks = [min(_SEED_CHUNK, n - s) for s in range(0, n, _SEED_CHUNK)]

        async def feed(conn: asyncpg.Connection[Any]) -> None:
            while chunks:
                await conn.execute(_SEED_TASKS, tenant, "scale", chunks.pop())

        await asyncio.gather(*(feed(c) for c in conns))
        # Fresh statistics and visibility map, so autovacuum does not start
        # in the middle of the measurement and the planner sees the real size.
        await conns[0].execute("VACUUM (ANALYZE) agent_tasks")
        await conns[0].execute("VACUUM (ANALYZE) agent_events")
    finally:
        for c in conns:
            await c.close()


async def bench_scaling(dsns: dict[int, str], sizes: Sizes, reps: int) -> dict[str, Any]:
    for n, dsn in dsns.items():
        await _seed_large(dsn, n)
    conns = {n: await asyncpg.connect(dsn) for n, dsn in dsns.items()}
    try:
        for c in conns.values():  # prepare the statement and warm the cache
            for _ in range(20):
                await leases.claim(c, "warm-up", lease_ttl=HOUR)
        p50: dict[int, list[float]] = {n: [] for n in dsns}
        p99: dict[int, list[float]] = {n: [] for n in dsns}
        for _ in range(reps):
            for n, c in conns.items():
                lat: list[float] = []
                for _ in range(sizes.scale_claims):
                    t0 = time.perf_counter()
                    got = await leases.claim(c, "scale", lease_ttl=HOUR)
                    lat.append((time.perf_counter() - t0) * 1000)
                    if len(got) != 1:
                        raise RuntimeError("the scaling queue ran dry")
                p50[n].append(_percentile(lat, 50))
                p99[n].append(_percentile(lat, 99))
        large = max(conns)
        conn = conns[large]
        tr = conn.transaction()
        await tr.start()
        try:  # EXPLAIN ANALYZE runs the claim: roll it back
            plan = "\n".join(
                r[0] for r in await conn.fetch(_EXPLAIN_CLAIM, "explain", 1, HOUR, None)
            )
        finally:
            await tr.rollback()
        return {
            "sizes": sorted(dsns),
            "claims_per_rep": sizes.scale_claims,
            "p50_ms": {str(n): v for n, v in p50.items()},
            "p99_ms": {str(n): v for n, v in p99.items()},
            "explain_rows": large,
            "explain": plan,
            "index_path": "agent_tasks_due_idx" in plan and "Seq Scan on agent_tasks" not in plan,
        }
    finally:
        for c in conns.values():
            await c.close()


# --- The run -----------------------------------------------------------------


@dataclass
class Options:
    dsn: str | None
    quick: bool
    reps: int
    out: Path
    skip_1m: bool


def _versions(server: str, peers: _Peers) -> dict[str, str]:
    from agentdb import __version__

    v = {
        "postgres": server,
        "agentdb": __version__,
        "python": platform.python_version(),
        "asyncpg": asyncpg.__version__,
        "psycopg": psycopg.__version__,
    }
    v.update(peers.versions)
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        v["matplotlib"] = importlib.metadata.version("matplotlib")
    return v


async def _bench(
    admin: str,
    urls: dict[str, str],
    scale: dict[int, str],
    opts: Options,
    sizes: Sizes,
    peers: _Peers,
    notes: list[str],
) -> dict[str, Any]:
    probe = await Probe.open(admin)
    try:
        server = await probe.conn.fetchval("SHOW server_version")
        settings = {
            r["name"]: r["setting"]
            for r in await probe.conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])",
                ["fsync", "synchronous_commit", "shared_buffers", "max_connections"],
            )
        }
        if not probe.local:
            notes.append("server CPU is not reported: the server is not on this machine")
        peer_dsns: dict[str, str] = {}
        if peers.has("pgqueuer"):
            peer_dsns["pgqueuer"] = urls["pgqueuer"]
            await _pgqueuer_install(urls["pgqueuer"])
        if peers.has("procrastinate"):
            peer_dsns["procrastinate"] = urls["procrastinate"]
            await _procrastinate_install(urls["procrastinate"])
        started = time.perf_counter()
        stamps: dict[str, float] = {}
        statements = await bench_statements(urls["agentdb"], sizes, opts.reps, probe)
        stamps["statements"] = time.perf_counter() - started
        cycle = await bench_cycle(urls["agentdb"], peer_dsns, sizes, opts.reps, peers, probe, notes)
        stamps["cycle"] = time.perf_counter() - started - sum(stamps.values())
        relay = await bench_relay(urls["agentdb"], sizes, opts.reps, probe)
        stamps["relay"] = time.perf_counter() - started - sum(stamps.values())
        scaling = await bench_scaling(scale, sizes, opts.reps)
        stamps["scaling"] = time.perf_counter() - started - sum(stamps.values())
    finally:
        await probe.close()
    return {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "quick" if opts.quick else "full",
            "reps": opts.reps,
            "server": "embedded (pgserver)" if opts.dsn is None else _redacted(admin),
            "settings": settings,
            "cpu_count": os.cpu_count() or 0,
            "machine": platform.machine(),
            "platform": platform.platform(terse=True),
            "versions": _versions(server, peers),
            "missing_peers": peers.missing,
            "section_seconds": stamps,
            "server_cpu_measured": probe.local,
        },
        "statements": statements,
        "cycle": cycle,
        "relay": relay,
        "scaling": scaling,
        "notes": notes,
    }


def _redacted(dsn: str) -> str:
    from agentdb.migrate import redact

    return redact(dsn)


def run(opts: Options) -> dict[str, Any]:
    """Run every comparison, write the report, and return the results."""
    if opts.reps < 1:
        raise ConfigurationError("--reps must be at least 1")
    sizes = QUICK if opts.quick else FULL
    if opts.skip_1m and not opts.quick:
        sizes = replace(sizes, scale_large=_SKIP_1M_LARGE)
    peers = _Peers()
    notes: list[str] = []
    if importlib.util.find_spec("opentelemetry") is not None:
        notes.append(
            "opentelemetry-api is installed; with no SDK configured the helpers skip their "
            "own spans and only read the (empty) current span for trace ids"
        )
    notes += [f"{name} is not importable ({why}): left out" for name, why in peers.missing.items()]
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if opts.dsn is None:
            from agentdb.embedded import embedded_postgres

            admin = stack.enter_context(embedded_postgres(migrate=False))
        else:
            admin = opts.dsn
            _with_db(admin, "postgres")  # refuse a non-URL DSN before creating anything
        dbs = Databases(admin, secrets.token_hex(4))
        stack.callback(dbs.drop_all)
        main_db = dbs.name("agentdb")
        urls = {"agentdb": dbs.create(main_db)}
        _migrate_locked(admin, urls["agentdb"])
        scale = {
            sizes.scale_small: dbs.create(f"{main_db}_s", template=main_db),
            sizes.scale_large: dbs.create(f"{main_db}_l", template=main_db),
        }
        for peer in ("pgqueuer", "procrastinate"):
            if peers.has(peer):
                urls[peer] = dbs.create(dbs.name(peer))
        results = asyncio.run(_bench(admin, urls, scale, opts, sizes, peers, notes))
        results["meta"]["databases"] = list(dbs.created)  # all dropped on the way out
    results["meta"]["seconds"] = time.perf_counter() - t0
    results["meta"]["load_before"] = list(load_before)
    results["meta"]["load_after"] = (
        list(os.getloadavg()) if hasattr(os, "getloadavg") else [math.nan] * 3
    )
    write_outputs(results, opts.out)
    return results


# --- Report ------------------------------------------------------------------


def _targets(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for the issue's four targets."""
    out: list[tuple[str, str, str]] = []
    for s in r["statements"]:
        ratio = _median(_ratios(s["agentdb"], s["raw"]))
        out.append(
            (
                f"{s['statement']}: helper ≥ 0.95x raw asyncpg",
                f"{ratio:.3f}x",
                "met" if ratio >= 0.95 else "missed",
            )
        )
    by = {(c["name"], c["workers"]): c for c in r["cycle"]}
    # The no-op rows do less than the cycle the target is about: they stay out.
    agentdb4 = [
        c
        for c in r["cycle"]
        if c["kind"] in ("agentdb-single", "agentdb-batched") and c["workers"] == 4
    ]
    best = max(agentdb4, key=lambda c: _median(c["tasks_per_s"]), default=None)
    for peer in ("PgQueuer default (batch 10)", "PgQueuer tuned (batch 250)"):
        ref = by.get((peer, 4))
        if best is None or ref is None or not ref["tasks_per_s"]:
            out.append((f"task cycle, 4 workers ≥ {peer}", "peer not measured", "n/a"))
            continue
        ratio = _median(best["tasks_per_s"]) / _median(ref["tasks_per_s"])
        bar = "first bar" if "default" in peer else "aim"
        out.append(
            (
                f"task cycle, 4 workers ≥ {peer} ({bar})",
                f"{best['name']}: {ratio:.3f}x",
                "met" if ratio >= 1 else "missed",
            )
        )
    noop = by.get(("agentdb no-op tasks, batch 250", 4))
    for peer in ("PgQueuer default (batch 10)", "PgQueuer tuned (batch 250)"):
        ref = by.get((peer, 4))
        if noop and ref and noop["tasks_per_s"] and ref["tasks_per_s"]:
            ratio = _median(noop["tasks_per_s"]) / _median(ref["tasks_per_s"])
            out.append(
                (
                    f"(the same work as a no-op job) agentdb no-op tasks, 4 workers, vs {peer}",
                    f"{ratio:.3f}x",
                    "for reference",
                )
            )
    relays = {x["name"]: x for x in r["relay"]}
    raw = relays["raw SKIP LOCKED, one statement"]["rows_per_s"]
    for name in ("agentdb Relay.drain()", "agentdb outbox.claim + mark_delivered"):
        ratio = _median(_ratios(relays[name]["rows_per_s"], raw))
        out.append(
            (
                f"{name} ≥ 0.8x raw one-statement drain",
                f"{ratio:.3f}x",
                "met" if ratio >= 0.8 else "missed",
            )
        )
    sc = r["scaling"]
    small, large = (str(n) for n in sc["sizes"])
    ratio = _median(sc["p50_ms"][large]) / _median(sc["p50_ms"][small])
    out.append(
        (
            f"claim p50 at {int(large):,} rows ≤ 1.2x at {int(small):,}",
            f"{ratio:.3f}x",
            "met" if ratio <= 1.2 else "missed",
        )
    )
    return out


def render(r: dict[str, Any]) -> str:
    """The markdown report (also printed to stdout)."""
    m = r["meta"]
    v = m["versions"]
    lines: list[str] = []
    add = lines.append
    add("# agentdb benchmarks")
    add("")
    add(
        f"{m['date']} · {m['mode']} run · {m['reps']} interleaved repetitions · "
        f"{m['cpu_count']} CPU cores ({m['machine']}, {m['platform']}) · "
        f"load average {m['load_before'][0]:.2f} before, {m['load_after'][0]:.2f} after · "
        f"{m['seconds']:.0f} s in all"
    )
    add("")
    settings = ", ".join(f"{k}={val}" for k, val in sorted(m["settings"].items()))
    add(
        f"Server: PostgreSQL {v['postgres']} ({m['server']}; {settings}); client and server "
        "share this machine."
    )
    add("")
    add("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "postgres"))
    add("")
    add(
        "Every figure is the median over the repetitions, with min-max in brackets. Contenders "
        "ran back to back inside each repetition (A B A B …) in one Python process on the "
        "default asyncio loop; ratios are taken per repetition, then the median."
    )
    add("")
    add("## 1. Statement overhead")
    add("")
    s0 = r["statements"][0]
    add(
        f"{s0['connections']} connections, {s0['ops_per_rep']:,} statements per variant per "
        "repetition; the raw variant sends the same SQL text with the same arguments through "
        "`conn.fetch` on the same connections."
    )
    add("")
    add(
        "| statement | agentdb helper, ops/s | raw asyncpg, same SQL, ops/s | helper ÷ raw | "
        "client CPU µs/op, helper / raw | server CPU µs/op, helper / raw |"
    )
    add("|---|---:|---:|---:|---:|---:|")
    for s in r["statements"]:
        ratios = _ratios(s["agentdb"], s["raw"])
        add(
            f"| {s['statement']} | {_fmt_range(s['agentdb'])} | {_fmt_range(s['raw'])} | "
            f"{_fmt_range(ratios, 2)} | {_fmt(_median(s['helper_client_us']))} / "
            f"{_fmt(_median(s['raw_client_us']))} | {_fmt(_median(s['helper_server_us']))} / "
            f"{_fmt(_median(s['raw_server_us']))} |"
        )
    add("")
    add("## 2. Task cycle")
    add("")
    add(
        "agentdb: claim under a lease → reserve an operation → complete it → finish the task "
        "(state + event + one outbox row; the lease is dropped). PgQueuer and Procrastinate run "
        "no-op jobs (no operation ledger, no audit event, no outbox). Throughput is counted "
        "from the first job handed out to the last completion committed."
    )
    add("")
    add(
        "| path | workers | tasks/run | tasks/s | vs PgQueuer default | client CPU | "
        "server CPU | client CPU µs/task | server CPU µs/task | WAL bytes/task |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    by = {(c["name"], c["workers"]): c for c in r["cycle"]}
    for c in r["cycle"]:
        ref = by.get(("PgQueuer default (batch 10)", c["workers"]))
        vs = (
            f"{_median(c['tasks_per_s']) / _median(ref['tasks_per_s']):.2f}x"
            if ref and ref["tasks_per_s"] and c["tasks_per_s"]
            else "n/a"
        )
        add(
            f"| {c['name']} | {c['workers']} | {c['tasks_per_run']:,} | "
            f"{_fmt_range(c['tasks_per_s'])} | {vs} | "
            f"{_pct(c['client_cpu_share'])} | {_pct(c['server_cpu_share'])} | "
            f"{_fmt(_median(c['client_cpu_us_per_task']))} | "
            f"{_fmt(_median(c['server_cpu_us_per_task']))} | "
            f"{_fmt(_median(c['wal_bytes_per_task']))} |"
        )
    add("")
    add(
        "Client CPU is the bench process's CPU time over the run's wall time (100 % = one core "
        "busy: the Python client is the bottleneck); server CPU is the run database's backends "
        "on the same scale (the machine has "
        f"{r['meta']['cpu_count']} cores for both); WAL is cluster-wide."
    )
    add("")
    add("## 3. Outbox relay")
    add("")
    relays = {x["name"]: x for x in r["relay"]}
    raw = relays["raw SKIP LOCKED, one statement"]["rows_per_s"]
    add(
        f"One relay, batch {r['relay'][0]['batch']}, {r['relay'][0]['rows_per_run']:,} rows per "
        "run, a publisher that returns at once."
    )
    add("")
    add("| relay | how | rows/s | ÷ raw one-statement | client CPU |")
    add("|---|---|---:|---:|---:|")
    for x in r["relay"]:
        add(
            f"| {x['name']} | {x['how']} | {_fmt_range(x['rows_per_s'])} | "
            f"{_fmt_range(_ratios(x['rows_per_s'], raw), 2)} | "
            f"{_pct(x['client_cpu_share'])} |"
        )
    add("")
    add("## 4. Scaling: claim latency")
    add("")
    sc = r["scaling"]
    add(
        f"`leases.claim(batch=1)` on one connection, {sc['claims_per_rep']:,} timed claims per "
        "table per repetition, all tasks pending (a backlog: every row is in the claim index)."
    )
    add("")
    add("| tasks in the table | claim p50, ms | claim p99, ms |")
    add("|---:|---:|---:|")
    for n in sc["sizes"]:
        add(
            f"| {n:,} | {_fmt_range(sc['p50_ms'][str(n)], 3)} | "
            f"{_fmt_range(sc['p99_ms'][str(n)], 3)} |"
        )
    small, large = (str(n) for n in sc["sizes"])
    add("")
    add(
        f"p50 ratio {int(large):,} ÷ {int(small):,}: "
        f"{_fmt_range(_ratios(sc['p50_ms'][large], sc['p50_ms'][small]), 2)}; index path: "
        f"{'yes' if sc['index_path'] else 'NO'}."
    )
    add("")
    add(f"The claim's plan at {sc['explain_rows']:,} rows (EXPLAIN ANALYZE, rolled back):")
    add("")
    add("```")
    add(sc["explain"])
    add("```")
    add("")
    add("## Targets")
    add("")
    add("| target | measured | verdict |")
    add("|---|---|---|")
    for target, measured, verdict in _targets(r):
        add(f"| {target} | {measured} | {verdict} |")
    add("")
    problems = [f"{c['name']} ({c['workers']} w): {e}" for c in r["cycle"] for e in c["errors"]] + [
        f"{x['name']}: {e}" for x in r["relay"] for e in x["errors"]
    ]
    if r["notes"] or problems:
        add("## Notes")
        add("")
        for note in (*r["notes"], *problems):
            add(f"- {note}")
        add("")
    return "\n".join(lines)


def _pct(values: Sequence[float]) -> str:
    return "n/a" if not values else f"{_median(values) * 100:.0f} %"


def _chart(r: dict[str, Any], path: Path) -> str | None:
    """Draw chart.png; return why not if matplotlib is missing."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        return f"no chart: matplotlib is not importable ({exc})"

    def bars(
        ax: Any,
        labels: list[str],
        series: list[tuple[str, list[list[float]]]],
        title: str,
        unit: str,
        log: bool = False,
    ) -> None:
        width = 0.8 / max(1, len(series))
        for k, (name, samples) in enumerate(series):
            xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
            med = [_median(s) if s else 0.0 for s in samples]
            lo = [m - min(s) if s else 0.0 for m, s in zip(med, samples, strict=True)]
            hi = [max(s) - m if s else 0.0 for m, s in zip(med, samples, strict=True)]
            ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=name)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=7)

    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    st = r["statements"]
    bars(
        axes[0][0],
        [s["statement"] for s in st],
        [("agentdb helper", [s["agentdb"] for s in st]), ("raw asyncpg", [s["raw"] for s in st])],
        "1. Statement overhead (same SQL)",
        "statements/s",
    )
    names = list(dict.fromkeys(c["name"] for c in r["cycle"]))
    by = {(c["name"], c["workers"]): c["tasks_per_s"] for c in r["cycle"]}
    bars(
        axes[0][1],
        names,
        [
            (f"{w} worker{'s' if w > 1 else ''}", [by.get((n, w), []) for n in names])
            for w in (1, 4)
        ],
        "2. Task cycle",
        "tasks/s (log)",
        log=True,
    )
    bars(
        axes[1][0],
        [x["name"] for x in r["relay"]],
        [("rows/s", [x["rows_per_s"] for x in r["relay"]])],
        "3. Outbox relay",
        "rows/s",
    )
    sc = r["scaling"]
    bars(
        axes[1][1],
        [f"{n:,} tasks" for n in sc["sizes"]],
        [
            ("p50", [sc["p50_ms"][str(n)] for n in sc["sizes"]]),
            ("p99", [sc["p99_ms"][str(n)] for n in sc["sizes"]]),
        ],
        "4. Claim latency",
        "ms",
    )
    m = r["meta"]
    fig.suptitle(
        f"agentdb bench ({m['mode']}, {m['reps']} reps, "
        f"PostgreSQL {m['versions']['postgres'].split()[0]}, "
        f"{m['cpu_count']} cores) - medians, bars span min-max",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_outputs(r: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    why = _chart(r, out / "chart.png")
    if why is not None:
        r["notes"].append(why)
    text = render(r)
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps(r, indent=2) + "\n", encoding="utf-8")
    print(text, flush=True)
    print(
        f"\nwrote {out / 'report.md'}, {out / 'results.json'}"
        f"{'' if why else ', ' + str(out / 'chart.png')}"
    )


# --- Command line ------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dsn",
        help="postgresql:// URL of a server where the bench may CREATE DATABASE "
        "(default: start an embedded Postgres)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute (CI smoke)")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    p.add_argument(
        "--skip-1m", action="store_true", help="scale to 100k tasks instead of 1M (faster)"
    )


def _options(args: argparse.Namespace) -> Options:
    return Options(args.dsn, args.quick, args.reps, args.out, args.skip_1m)


def _cmd_bench(args: argparse.Namespace) -> int:
    run(_options(args))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` subcommand to ``agentdb``'s subparsers."""
    p = sub.add_parser(
        "bench",
        help="benchmark agentdb against raw asyncpg, PgQueuer and Procrastinate",
        description="Create throwaway databases, run each comparison with its contenders "
        "interleaved, and write report.md, results.json and chart.png.",
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_bench)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentdb.bench``: the same as ``agentdb bench``."""
    parser = argparse.ArgumentParser(prog="python -m agentdb.bench", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return _cmd_bench(args)
    except ConfigurationError as exc:
        print(f"agentdb bench: {exc}", file=sys.stderr)
        return 2
    except AgentDBError as exc:
        print(f"agentdb bench: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
