"""agentdb against DBOS on the same units of work, each in a database of its own.

Two workloads, each run by both sides with the same worker processes
(``workers`` x ``concurrency``, polling every 50 ms; durability untouched):

* **unit** - a tenant's unit of work enqueued idempotently (agentdb:
  ``tasks.create`` with a dedupe key; DBOS: ``DBOSClient.enqueue`` with the
  workflow id as the key), picked up, one external call ledgered (agentdb:
  ``job.effect``, the reservation committed before the call; DBOS: a
  ``@DBOS.step``), one outbox / notification record (agentdb: an outbox
  message with the success; DBOS: ``DBOS.set_event``).
* **agent run** - model step → tool effect → approval wait → tool effect →
  finish: agentdb a durable handler (``job.step``, ``job.effect``,
  ``job.wait_for_signal``, ``job.effect``), DBOS a workflow with steps and
  ``DBOS.recv``. The bench driver approves each run once it waits
  (``signals.approve`` / ``DBOSClient.send``), looking every 10 ms.

A run starts its processes and waits until they serve (startup left out for
both), warms them up, then the driver enqueues the run's units (8 at a time)
while the workers drain them; the run ends when every unit finished.

Warm connections: before the measured units, each run drives
``Sizes.versus_warmup`` units of the same workload through the same
processes, for another tenant, and leaves them out of every figure. A
worker's first statements on each pooled connection cost what its later
ones do not: PostgreSQL plans a prepared statement afresh for its first five
executions before it settles on a generic plan, and asyncpg asks the server
once per connection how to encode each array type a statement uses (a
catalogue query that takes ~10 ms to plan). Profiled with
``pg_stat_statements`` on cold processes (4 x 12 connections draining 1,000
units), planning was 42% of agentdb's statement time and those type queries
8%: what a worker that lives for days pays once was being charged to each
of a short run's units. DBOS's processes get the same warm-up. Measured per
run: units per second from the first enqueue to the last finish; the
server CPU of the database's backends (:class:`~agentdb.tools.bench.harness.Probe`)
and the worker processes' CPU, per unit; the database's own WAL per unit,
read back with ``pg_waldump`` (:mod:`.walstats`; cluster-wide positions
when it cannot be read); latency from enqueue to finish, p50 / p95, from
each side's own rows. The contenders alternate inside each repetition (the
one that goes first alternates too), so noise hits both alike; ratios are
taken per repetition.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, LiteralString

from agentdb import _db, signals, tasks, tenancy
from agentdb.tools.bench.harness import (
    ANALYZE,
    Database,
    Probe,
    Sizes,
    median,
    percentile,
    ratios,
)
from agentdb.tools.bench.walstats import WalReader, WalUsage, lsn, name_relations
from agentdb.tools.bench.workers import proc_ticks, spawn_worker, until

__all__ = [
    "SIDES", "WORKLOADS", "Versus", "bench_versus", "dbos_install", "ratio_rows", "warm_tenant_id",
]  # fmt: skip

#: The workloads: (key, title, the agentdb handler, the DBOS workflow).
WORKLOADS = (
    ("unit", "single-effect unit", "unit", "unit"),
    ("agent_run", "agent run (model, tool, approval, tool)", "agent-run", "agent_run"),
)
SIDES = ("agentdb", "dbos")
_ENQUEUERS = 8  # units enqueued at a time by the driver, on both sides
_LOOK = 0.01  # seconds between the driver's looks (done? waiting for approval?)
_POLL = 0.05  # both sides' polling interval, seconds
_START_PATIENCE = 90.0
_RUN_PATIENCE = 900.0

_LISTENING: LiteralString = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN %'"
)
_A_BUSY: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM agent_tasks WHERE tenant_id = $1 AND task_type = $2"
    " AND state IN ('pending', 'waiting', 'running'))"
)
_A_WAITING: LiteralString = (
    "SELECT id FROM agent_tasks WHERE tenant_id = $1 AND id = ANY($2::uuid[]) AND state = 'waiting'"
)
_A_LATENCY: LiteralString = (
    "SELECT extract(epoch FROM updated_at - created_at) * 1000 AS ms, state FROM agent_tasks"
    " WHERE tenant_id = $1 AND task_type = $2"
)
_D_BUSY: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM dbos.workflow_status WHERE queue_name = $1"
    " AND status IN ('ENQUEUED', 'PENDING'))"
)
_D_WAITING: LiteralString = (
    "SELECT workflow_uuid FROM dbos.operation_outputs WHERE workflow_uuid = ANY($1::text[])"
    " AND function_name = 'DBOS.sleep'"
)
_D_LATENCY: LiteralString = (
    "SELECT (updated_at - created_at)::float8 AS ms, status AS state FROM dbos.workflow_status"
    " WHERE workflow_uuid LIKE $1"
)
_OID: LiteralString = "SELECT oid FROM pg_database WHERE datname = $1"


@dataclass
class _Run:
    """What one run of one side measured."""

    units: int
    seconds: float
    enqueue_seconds: float
    finished: int
    latencies_ms: list[float]
    usage: dict[str, float]
    worker_cpu: float
    wal: WalUsage | None
    wal_bytes: int


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)


async def _each(items: Sequence[Any], n: int, fn: Callable[[Any], Awaitable[None]]) -> None:
    """``fn(item)`` for every item, ``n`` at a time."""
    it = iter(items)

    async def one() -> None:
        for item in it:
            await fn(item)

    await asyncio.gather(*(one() for _ in range(n)))


@dataclass
class Versus:
    """Both sides' databases, the driver's connections to them, the probes."""

    agentdb: Database
    dbos: Database
    probe: Probe
    wal: WalReader | None
    sizes: Sizes
    pool: _db.Pool | None = None
    dpool: _db.Pool | None = None
    client: Any = None
    tenant: uuid.UUID | None = None
    warm_tenant: uuid.UUID | None = None
    threads: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(_ENQUEUERS))
    oids: dict[str, int] = field(default_factory=dict)
    runs: int = 0

    async def open(self) -> None:
        """Connect the driver to both databases (the schemas are installed already).

        Raises:
            DatabaseUnavailable: a pool could not be opened; whatever DBOS raises.
        """
        from dbos import DBOSClient  # type: ignore[import-not-found,unused-ignore]

        self.pool = await _db.create_pool(self.agentdb.url, min_size=2, max_size=_ENQUEUERS)
        self.dpool = await _db.create_pool(self.dbos.url, min_size=1, max_size=2)
        self.tenant = await tenancy.create_tenant(self.pool, "bench-versus")
        self.warm_tenant = await tenancy.create_tenant(
            self.pool, "bench-versus-warmup", tenant_id=warm_tenant_id(self.tenant)
        )
        self.client = DBOSClient(
            system_database_url=_sqlalchemy(self.dbos.url),
            system_database_pool_size=_ENQUEUERS + 2,
        )
        for side, db in (("agentdb", self.agentdb), ("dbos", self.dbos)):
            self.oids[side] = int(await self.pool.fetchval(_OID, db.name))

    async def close(self) -> None:
        if self.client is not None:
            await asyncio.get_running_loop().run_in_executor(self.threads, self.client.destroy)
        for p in (self.pool, self.dpool):
            if p is not None:
                await p.close()
        self.threads.shutdown(wait=False)

    # --- one side, one workload ------------------------------------------------

    def _spawn(
        self, side: str, handler: str, task_type: str, log: IO[bytes], ready: Path
    ) -> list[subprocess.Popen[bytes]]:
        s = self.sizes
        if side == "agentdb":
            return [spawn_worker(self.agentdb.url, task_type, s.versus_concurrency, log, handler)
                    for _ in range(s.versus_workers)]  # fmt: skip
        c = s.versus_concurrency
        return [_dbos_worker(self.dbos.url, f"bench-{i}", c, Path(f"{ready}.{i}"), log)
                for i in range(s.versus_workers)]  # fmt: skip

    async def run(self, side: str, workload: str, n: int, *, breakdown: bool = False) -> _Run:
        """``n`` units of ``workload`` on ``side``'s worker processes; what it measured.

        Raises:
            RuntimeError: a process died or the run did not finish in time (with its output).
        """
        assert self.pool is not None
        assert self.dpool is not None
        _, _, handler, workflow = next(w for w in WORKLOADS if w[0] == workload)
        self.runs += 1
        tag = f"v{self.runs}"
        db = self.agentdb if side == "agentdb" else self.dbos
        conn_pool = self.pool if side == "agentdb" else self.dpool
        with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as tmp:
            ready = Path(tmp) / "ready"
            procs = self._spawn(side, handler, tag, log, ready)
            try:
                await until(f"{side} starting", _START_PATIENCE,
                            self._ready(side, ready, len(procs)), procs, log)  # fmt: skip
                await conn_pool.execute(ANALYZE if side == "agentdb" else "ANALYZE")
                drive = self._drive_agentdb if side == "agentdb" else self._drive_dbos
                if self.sizes.versus_warmup:
                    # Another tenant's units, left out of every figure: each
                    # worker connection's first statements (see the module's
                    # "Warm connections") are what a long-running worker pays
                    # once, not per unit.
                    await drive(tag, workflow, self.sizes.versus_warmup, procs, log, warm=True)
                cpu_before = sum(proc_ticks(p.pid) for p in procs)
                wal_start = await self._position()
                (seconds, enqueue_seconds), window = await self.probe.timed(
                    db.name, lambda: drive(tag, workflow, n, procs, log)
                )
                wal_end = await self._position()
                worker_cpu = (sum(proc_ticks(p.pid) for p in procs) - cpu_before) / self.probe.tick
            finally:
                _stop(procs)
        latencies, finished = await self._latencies(side, tag)
        usage = self.probe.usage(window, n)
        wal: WalUsage | None = None
        if self.wal is not None:
            wal = await asyncio.get_running_loop().run_in_executor(
                None, self.wal.database, self.oids[side], wal_start, wal_end
            )
            await self.wal.release()
            if breakdown:
                await name_relations(conn_pool, wal)  # type: ignore[arg-type]
        return _Run(n, seconds, enqueue_seconds, finished, latencies, usage, worker_cpu, wal,
                    wal.bytes if wal is not None else wal_end - wal_start)  # fmt: skip

    def _ready(self, side: str, ready: Path, workers: int) -> Callable[[], Awaitable[bool]]:
        assert self.pool is not None

        async def agentdb() -> bool:
            assert self.pool is not None
            return bool(await self.pool.fetchval(_LISTENING, self.agentdb.name) >= workers)

        async def dbos() -> bool:
            return _all_exist([Path(f"{ready}.{i}") for i in range(workers)])

        return agentdb if side == "agentdb" else dbos

    async def _position(self) -> int:
        if self.wal is not None:
            return await self.wal.position()
        return lsn(await self.probe.conn.fetchval("SELECT pg_current_wal_lsn()::text"))

    async def _drive_agentdb(
        self, tag: str, workload: str, n: int, procs: list[subprocess.Popen[bytes]],
        log: IO[bytes], *, warm: bool = False,
    ) -> tuple[float, float]:  # fmt: skip
        pool, tenant = self.pool, self.warm_tenant if warm else self.tenant
        assert pool is not None
        assert tenant is not None
        waiting: set[uuid.UUID] = set()
        start = time.perf_counter()

        async def enqueue(i: int) -> None:
            t = await tasks.create(pool, tenant, tag, params={"n": i}, dedupe_key=f"{tag}/{i}")
            if workload == "agent_run":
                waiting.add(t.id)

        async def busy() -> bool:
            if workload == "agent_run" and waiting:
                rows = await pool.fetch(_A_WAITING, tenant, list(waiting))
                ids = [r["id"] for r in rows]
                waiting.difference_update(ids)
                await _each(ids, _ENQUEUERS, approve)
            if not enqueued.done():
                return True
            return bool(await pool.fetchval(_A_BUSY, tenant, tag))

        async def approve(task_id: uuid.UUID) -> None:
            await signals.approve(pool, tenant, task_id, approver="bench-driver",
                                  dedupe_key="approval")  # fmt: skip

        async def enqueue_all() -> float:
            await _each(range(n), _ENQUEUERS, enqueue)
            return time.perf_counter() - start

        enqueued = asyncio.ensure_future(enqueue_all())
        try:
            await until("agentdb running", _RUN_PATIENCE, _negate(busy), procs, log)
        finally:
            enqueue_seconds = await enqueued
        return time.perf_counter() - start, enqueue_seconds

    async def _drive_dbos(
        self, tag: str, workflow: str, n: int, procs: list[subprocess.Popen[bytes]],
        log: IO[bytes], *, warm: bool = False,
    ) -> tuple[float, float]:  # fmt: skip
        from agentdb.tools.bench.dbos_worker import QUEUE

        dpool, client = self.dpool, self.client
        tenant = str(self.warm_tenant if warm else self.tenant)
        assert dpool is not None
        loop = asyncio.get_running_loop()
        waiting: set[str] = set()
        start = time.perf_counter()

        async def enqueue(i: int) -> None:
            wid = f"{tag}/{tenant}/{i}"
            options = {"queue_name": QUEUE, "workflow_name": workflow, "workflow_id": wid}
            await loop.run_in_executor(self.threads, lambda: client.enqueue(options, tenant, i))
            if workflow == "agent_run":
                waiting.add(wid)

        async def approve(wid: str) -> None:
            await loop.run_in_executor(self.threads, lambda: client.send(
                wid, {"decision": "approved", "approver": "bench-driver"}, "approval",
                f"{wid}/approval"))  # fmt: skip

        async def busy() -> bool:
            if workflow == "agent_run" and waiting:
                rows = await dpool.fetch(_D_WAITING, list(waiting))
                ids = [r["workflow_uuid"] for r in rows]
                waiting.difference_update(ids)
                await _each(ids, _ENQUEUERS, approve)
            if not enqueued.done():
                return True
            return bool(await dpool.fetchval(_D_BUSY, QUEUE))

        async def enqueue_all() -> float:
            await _each(range(n), _ENQUEUERS, enqueue)
            return time.perf_counter() - start

        enqueued = asyncio.ensure_future(enqueue_all())
        try:
            await until("dbos running", _RUN_PATIENCE, _negate(busy), procs, log)
        finally:
            enqueue_seconds = await enqueued
        return time.perf_counter() - start, enqueue_seconds

    async def _latencies(self, side: str, tag: str) -> tuple[list[float], int]:
        assert self.pool is not None
        assert self.dpool is not None
        if side == "agentdb":
            rows = await self.pool.fetch(_A_LATENCY, self.tenant, tag)
            ok = "succeeded"
        else:
            rows = await self.dpool.fetch(_D_LATENCY, f"{tag}/{self.tenant}/%")
            ok = "SUCCESS"
        done = [float(r["ms"]) for r in rows if r["state"] == ok]
        return done, len(done)


def _negate(check: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
    async def negated() -> bool:
        return not await check()

    return negated


def _all_exist(paths: Sequence[Path]) -> bool:
    return all(p.exists() for p in paths)


def warm_tenant_id(measured: uuid.UUID) -> uuid.UUID:
    """A random tenant id that sorts before ``measured``, for the warm-up's tenant.

    agentdb's indexes lead with the tenant, and a tenant's new rows go to the
    end of its range (time-ordered ids). With the warm-up tenant's range after
    the measured one's, the measured rows were inserted in the middle of each
    index: PostgreSQL splits such a page in half, where it splits the last page
    of an index to leave it nearly full, and the splits wrote about 650 bytes
    more WAL per single-effect unit (859 against 206 bytes of Btree/SPLIT_R
    in two runs on 2026-12-07). Which of the two happened depended on two
    random ids; now the measured tenant is always last, as a lone tenant is.
    """
    return uuid.UUID(int=secrets.randbelow(measured.int))


def _dbos_worker(
    url: str, executor: str, concurrency: int, ready: Path, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """A :mod:`agentdb.tools.bench.dbos_worker` process serving the queue."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentdb.tools.bench.dbos_worker", "--url", url,
         "--executor", executor, "--concurrency", str(concurrency), "--poll", str(_POLL),
         "--ready", str(ready)],
        stdout=log, stderr=log,
    )  # fmt: skip


def _sqlalchemy(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


async def dbos_install(db: Database) -> str:
    """Create DBOS's system tables in ``db`` (one worker process launched once); its version.

    Raises:
        RuntimeError: the process did not come up (with its output); whatever DBOS raises.
    """
    import importlib.metadata

    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        proc = _dbos_worker(db.url, "bench-install", 1, ready, log)
        try:

            async def up() -> bool:
                return _all_exist([ready])

            await until("dbos installing", _START_PATIENCE, up, [proc], log)
        finally:
            _stop([proc])
    return importlib.metadata.version("dbos")


def _row(side: str, workload: str) -> dict[str, Any]:
    return {
        "side": side, "workload": workload, "units_per_run": 0,
        "units_per_s": [], "enqueued_per_s": [], "server_cpu_us_per_unit": [],
        "worker_cpu_us_per_unit": [],
        "driver_cpu_us_per_unit": [], "wal_bytes_per_unit": [], "fpi_bytes_per_unit": [],
        "wal_no_fpi_bytes_per_unit": [],
        "p50_ms": [], "p95_ms": [], "errors": [], "breakdown": None,
    }  # fmt: skip


def _record(row: dict[str, Any], rep: int, r: _Run) -> None:
    if r.finished != r.units:
        row["errors"].append(f"rep {rep}: {r.finished} of {r.units} units finished")
    row["units_per_run"] = r.units
    row["units_per_s"].append(r.units / r.seconds)
    row["enqueued_per_s"].append(r.units / r.enqueue_seconds)
    if "server_cpu_us_per_unit" in r.usage:
        row["server_cpu_us_per_unit"].append(r.usage["server_cpu_us_per_unit"])
    row["worker_cpu_us_per_unit"].append(r.worker_cpu * 1e6 / r.units)
    row["driver_cpu_us_per_unit"].append(r.usage["client_cpu_us_per_unit"])
    row["wal_bytes_per_unit"].append(r.wal_bytes / r.units)
    if r.wal is not None:
        row["fpi_bytes_per_unit"].append(r.wal.fpi_bytes / r.units)
        row["wal_no_fpi_bytes_per_unit"].append((r.wal.bytes - r.wal.fpi_bytes) / r.units)
        row["breakdown"] = r.wal.as_json(r.units)  # the last repetition's
    if r.latencies_ms:
        row["p50_ms"].append(percentile(r.latencies_ms, 50))
        row["p95_ms"].append(percentile(r.latencies_ms, 95))


#: (title, key in a row, digits, higher is better) for the report and the ratios.
METRICS = (
    ("units/s", "units_per_s", 0, True),
    ("server CPU µs/unit", "server_cpu_us_per_unit", 0, False),
    ("worker processes' CPU µs/unit", "worker_cpu_us_per_unit", 0, False),
    ("WAL bytes/unit", "wal_bytes_per_unit", 0, False),
    # Full-page images depend on when the last checkpoint was: the rest does not.
    ("WAL bytes/unit without full-page images", "wal_no_fpi_bytes_per_unit", 0, False),
    ("latency p50, ms", "p50_ms", 1, False),
    ("latency p95, ms", "p95_ms", 1, False),
)


def ratio_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """agentdb ÷ DBOS per workload and metric: the per-repetition ratios and their median."""
    out = []
    for key, title, _, _ in WORKLOADS:
        rows = {r["side"]: r for r in result["rows"] if r["workload"] == key}
        if set(rows) != set(SIDES):
            continue
        for name, metric, _, higher in METRICS:
            per_rep = ratios(rows["agentdb"][metric], rows["dbos"][metric])
            out.append({"workload": key, "title": title, "metric": name, "key": metric,
                        "higher_is_better": higher, "ratios": per_rep,
                        "median": median(per_rep)})  # fmt: skip
    return out


async def bench_versus(
    agentdb: Database,
    dbos: Database,
    sizes: Sizes,
    reps: int,
    probe: Probe,
    admin_dsn: str,
    notes: list[str],
    *,
    workloads: Sequence[str] = ("unit", "agent_run"),
    history: int = 0,
) -> dict[str, Any]:
    """Both workloads on both sides, ``reps`` interleaved repetitions; rows, ratios, breakdowns.

    ``history``: single-effect units each side runs first, unmeasured, and then a
    CHECKPOINT before every measured run. A fresh database's indexes are a few pages,
    which a run dirties once; a database with a history has more pages than a run
    touches, and after each checkpoint the first change to each page writes it whole
    to the WAL - the steady state a production database is in.

    Raises:
        DatabaseUnavailable: a pool could not be opened; RuntimeError: a run failed.
    """
    wal, why = await WalReader.open(admin_dsn)
    if wal is None:
        notes.append(why)
    v = Versus(agentdb, dbos, probe, wal, sizes)
    rows = {(s, w): _row(s, w) for w in workloads for s in SIDES}
    try:
        await v.open()
        for side in SIDES if history else ():
            await v.run(side, "unit", history)  # the history, not measured
        for rep in range(reps):
            for workload in workloads:
                n = sizes.versus_units if workload == "unit" else sizes.versus_runs
                order = SIDES if rep % 2 == 0 else SIDES[::-1]
                for side in order:
                    if history:
                        await v.probe.conn.execute("CHECKPOINT")
                    got = await v.run(side, workload, n, breakdown=rep == reps - 1)
                    _record(rows[(side, workload)], rep, got)
    finally:
        await v.close()
        if wal is not None:
            await wal.close()
    result: dict[str, Any] = {
        "workers": sizes.versus_workers,
        "concurrency": sizes.versus_concurrency,
        "poll_ms": _POLL * 1000,
        "wal_per_database": wal is not None,
        "history": history,
        "warmup": sizes.versus_warmup,
        "rows": list(rows.values()),
    }
    result["ratios"] = ratio_rows(result)
    return result
