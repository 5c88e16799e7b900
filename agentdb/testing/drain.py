"""Run the real :class:`~agentdb.worker.Worker` in-process until the queue is idle.

:func:`drain` is what a handler test awaits after creating its tasks: the same
claim, lease, heartbeat, reserve/complete and finishing writes as in
production, with short poll and retry intervals so a test takes milliseconds,
and a result read back from the database.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from agentdb import _db, tasks
from agentdb.models import Task
from agentdb.relay import Publisher, Relay
from agentdb.testing._postgres import Database
from agentdb.testing.provider import recording
from agentdb.worker import Handler, Job, Worker, WorkerStats
from agentdb.worker.outcomes import Reconciler

__all__ = ["DrainTimeout", "Drained", "drain", "split_handlers"]

# Tasks of the handled types that still have work now: running, or pending and
# due within the horizon (a retry's backoff is milliseconds under drain).
_LEFT = (
    "SELECT id, tenant_id, task_type, state, attempts, wake_at, last_error FROM agent_tasks"
    " WHERE task_type = ANY ($1) AND (state = 'running'"
    " OR (state IN ('pending', 'waiting') AND wake_at <= now() + $2::interval))"
    " ORDER BY created_at"
)


class DrainTimeout(AssertionError):
    """The queue did not become idle in time; the message lists the tasks still at work."""


@dataclass(frozen=True)
class Drained:
    """What a :func:`drain` did: every task its handlers ran, as the database has it now."""

    #: The tasks the handlers ran, in the order they first ran, as they ended up.
    tasks: tuple[Task, ...]
    #: Handler calls (attempts), retries included.
    runs: int
    stats: WorkerStats
    #: Outbox messages the publisher was given and that were marked delivered.
    delivered: int = 0
    elapsed: float = 0.0
    by_state: Mapping[str, tuple[Task, ...]] = field(init=False)

    def __post_init__(self) -> None:
        grouped: dict[str, list[Task]] = {}
        for t in self.tasks:
            grouped.setdefault(t.state, []).append(t)
        object.__setattr__(self, "by_state", {s: tuple(ts) for s, ts in grouped.items()})

    def count(self, state: str) -> int:
        """How many of the tasks ended in ``state``."""
        return len(self.by_state.get(state, ()))

    def task(self, task_id: uuid.UUID) -> Task:
        """The final row of one task the handlers ran.

        Raises:
            KeyError: no handler ran that task in this drain.
        """
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"task {task_id} was not run by this drain")

    def __str__(self) -> str:
        lines = [f"drained {len(self.tasks)} task(s) in {self.runs} run(s):"]
        lines += [
            f"  {t.id} {t.task_type} {t.state} attempts={t.attempts}"
            + (f" last_error={t.last_error!r}" if t.last_error else "")
            for t in self.tasks
        ]
        return "\n".join(lines)


def split_handlers(
    handlers: Mapping[str, Handler] | Any,
    reconcilers: Mapping[str, Reconciler] | None = None,
) -> tuple[dict[str, Handler], dict[str, Reconciler]]:
    """Handlers and hooks from a dict, or from an object with ``.handlers`` and
    ``.reconcilers`` (the shape ``agentdb worker MODULE:ATTR`` loads); ``reconcilers``
    given here are added to the object's."""
    table = getattr(handlers, "handlers", handlers)
    hooks = dict(getattr(handlers, "reconcilers", {}) or {})
    hooks.update(reconcilers or {})
    return dict(table), hooks


async def drain(
    db: _db.Pool | Database | str,
    handlers: Mapping[str, Handler] | Any,
    *,
    reconcilers: Mapping[str, Reconciler] | None = None,
    publisher: Publisher | None = None,
    within: float = 30.0,
    concurrency: int = 4,
    retry_base: float = 0.001,
    horizon: timedelta = timedelta(seconds=2),
) -> Drained:
    """Run a worker with ``handlers`` until no task of their types has work left; report.

    ``db`` is a pool, a :class:`Database` (the ``agentdb_db`` fixture) or a DSN.
    Work left means a task running, or pending and due within ``horizon``
    (retries back off from ``retry_base`` seconds, so they come due at once);
    tasks waiting on purpose (``Wait`` for a signal or children, a far ``wake_at``) do not
    keep it going; a wait that ends within ``horizon`` (a short ``job.sleep``) does.
    With ``publisher``, the outbox is then relayed to it until nothing is due.
    Recording fakes (:class:`~agentdb.testing.RecordingProvider`) called by the
    handlers record through the drain's pool.

    Raises:
        DrainTimeout: still work left after ``within`` seconds (the tasks are listed).
        ConfigurationError: as :class:`~agentdb.worker.Worker` (no handlers, a sync one, ...).
        MigrationError: the database is not migrated.
        PoolerMismatch: a transaction pooler is in the way and the pool does not know.
    """
    table, hooks = split_handlers(handlers, reconcilers)
    ran: dict[uuid.UUID, uuid.UUID] = {}
    runs = 0

    def tracked(handler: Handler) -> Handler:
        async def run(job: Job) -> Any:
            nonlocal runs
            runs += 1
            ran.setdefault(job.task.id, job.task.tenant_id)
            return await handler(job)

        return run

    pool, own_pool = await _open(db, concurrency + 3)
    start = time.monotonic()
    try:
        worker = Worker(
            pool, {t: tracked(h) for t, h in table.items()}, reconcilers=hooks,
            definite=tuple(getattr(handlers, "definite", ())),
            concurrency=concurrency, poll_interval=0.02, retry_base=retry_base,
            shutdown_grace=1.0, maintenance_interval=0.5,
        )  # fmt: skip
        relay = None
        if publisher is not None:
            relay = Relay(pool, publisher, poll_interval=0.02, retry_base=retry_base)
        with recording(pool):
            stats, delivered = await _run(pool, worker, sorted(table), relay, within, horizon)
        found = [await tasks.get(pool, tenant, task_id) for task_id, tenant in ran.items()]
    finally:
        if own_pool:
            await pool.close()
    return Drained(tuple(found), runs, stats, delivered, time.monotonic() - start)


async def _open(db: _db.Pool | Database | str, size: int) -> tuple[_db.Pool, bool]:
    """``db`` if it is a pool, else a new pool on it (and whether the caller must close it)."""
    if isinstance(db, Database | str):
        dsn = db.dsn if isinstance(db, Database) else db
        return await _db.create_pool(dsn, min_size=1, max_size=size), True
    return db, False


async def _run(
    pool: _db.Pool,
    worker: Worker,
    types: list[str],
    relay: Relay | None,
    within: float,
    horizon: timedelta,
) -> tuple[WorkerStats, int]:
    deadline = time.monotonic() + within
    running = asyncio.create_task(worker.run(install_signals=False))
    delivered = 0
    try:
        while True:
            if running.done():
                running.result()  # the worker stopped by itself: raise what stopped it
            left = await pool.fetch(_LEFT, types, horizon)
            if not left:
                break
            if time.monotonic() > deadline:
                rows = "\n".join(
                    f"  {r['id']} {r['task_type']} {r['state']} attempts={r['attempts']}"
                    f" wake_at={r['wake_at']} last_error={r['last_error']!r}"
                    for r in left
                )
                raise DrainTimeout(f"still work left after {within:g}s:\n{rows}")
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        stats = await running
    if relay is not None:
        delivered = await relay.drain()
    return stats, delivered
