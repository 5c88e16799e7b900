"""The ``agentdb worker`` contender: real worker processes, started as a user starts them.

``workers`` processes of ``python -m agentdb worker`` run the full cycle
(:mod:`agentdb.tools.bench.handlers`) with ``--concurrency`` jobs each
(sharing at most 12 connections: ``--pool-size``), with
every cost a user's deployment pays: a process per worker, its pool, its
LISTEN connection, its heartbeats, its maintenance round, the group commit of
its successes. They are started first and idle until each has its LISTEN
connection open (so startup is left out, as for every contender); the
tasks are then seeded in bulk and the clock starts as that commit returns;
the run ends when none is pending or running (polled every 10 ms). Client CPU is
the worker processes' own (``/proc/<pid>/stat``), not this process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import IO, LiteralString

from agentdb import _db
from agentdb.tools.bench.handlers import HANDLER_ENV, TYPE_ENV
from agentdb.tools.bench.harness import (
    ANALYZE,
    Clock,
    Cycle,
    Database,
    Probe,
    Window,
    seed_tasks,
)

__all__ = ["proc_ticks", "spawn_worker", "until", "worker_run"]

_HANDLERS = "agentdb.tools.bench.handlers:HANDLERS"
# The worker processes' LISTEN connections: one each once it is up.
_LISTENING: LiteralString = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN %'"
)
# Cheap enough to ask every 10 ms: two probes of the partial due and running indexes.
_BUSY: LiteralString = (
    "SELECT EXISTS (SELECT 1 FROM agent_tasks WHERE tenant_id = $1 AND task_type = $2"
    " AND state IN ('pending', 'waiting')) OR EXISTS (SELECT 1 FROM agent_tasks"
    " WHERE tenant_id = $1 AND task_type = $2 AND state = 'running')"
)
_DONE: LiteralString = (
    "SELECT count(*) FROM agent_tasks WHERE task_type = $1 AND state = 'succeeded'"
)
# Connections per process at most: four processes stay inside a default max_connections
# of 100 whatever their concurrency (the jobs share them, as behind a pooler).
_POOL = 12
# Seconds the processes get to start, and the whole run to finish, before it is an error.
_START_PATIENCE = 60.0
_RUN_PATIENCE = 600.0


def proc_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            rest = f.read().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(rest[11]) + int(rest[12])  # utime + stime


def spawn_worker(
    url: str, task_type: str, concurrency: int, log: IO[bytes], handler: str
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, **{TYPE_ENV: task_type, HANDLER_ENV: handler})
    env.pop("AGENTDB_FAULTS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "agentdb", "worker", _HANDLERS, "--dsn", url,
         "--concurrency", str(concurrency), "--pool-size", str(min(concurrency + 2, _POOL)),
         "--poll-interval", "0.05", "--lease-ttl", "3600",
         "--log-level", "warning"],
        env=env, stdout=log, stderr=log,
    )  # fmt: skip


async def until(what: str, patience: float, check: object, procs: list[subprocess.Popen[bytes]],
                 log: IO[bytes]) -> None:  # fmt: skip
    """Poll ``check()`` every 10 ms until true.

    Raises:
        RuntimeError: a process died, or ``patience`` seconds passed (naming ``what``
            and the processes' last output).
    """
    deadline = time.monotonic() + patience
    while not await check():  # type: ignore[operator]
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            why = f"worker exited with {dead[0].returncode}" if dead else "timed out"
            raise RuntimeError(f"agentdb worker processes, {what}: {why}: {tail}")
        await asyncio.sleep(0.01)


async def worker_run(
    db: Database,
    pool: _db.Pool,
    tenant: uuid.UUID,
    task_type: str,
    workers: int,
    concurrency: int,
    n: int,
    clock: Clock,
    probe: Probe,
    handler: str = "cycle",
) -> tuple[Cycle, Window]:
    """Drain ``n`` seeded tasks with ``workers`` real worker processes running ``handler``
    (:mod:`agentdb.tools.bench.handlers`).

    Returns:
        what ran (with the processes' CPU seconds over the run), and the run's window.

    Raises:
        RuntimeError: a process died or the run did not finish in time (with its output).
    """
    with tempfile.TemporaryFile() as log:
        procs = [spawn_worker(db.url, task_type, concurrency, log, handler) for _ in range(workers)]
        try:

            async def listening() -> bool:
                return bool(await pool.fetchval(_LISTENING, db.name) >= workers)

            await until("starting", _START_PATIENCE, listening, procs, log)
            await pool.execute(ANALYZE)  # before: the processes start on the seed's commit
            await seed_tasks(pool, tenant, task_type, n)
            clock.mark()
            cpu_before = sum(proc_ticks(p.pid) for p in procs)

            async def drained() -> bool:
                return not await pool.fetchval(_BUSY, tenant, task_type)

            async def work() -> None:
                await until("running", _RUN_PATIENCE, drained, procs, log)

            _, window = await probe.timed(db.name, work)
            cpu = (sum(proc_ticks(p.pid) for p in procs) - cpu_before) / probe.tick
            done = int(await pool.fetchval(_DONE, task_type))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(5)
    return Cycle(done, client_cpu=cpu), window
