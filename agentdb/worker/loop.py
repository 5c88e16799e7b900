"""The worker loop: claim due tasks under leases, run handlers, keep leases alive, recover."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentdb import _db, _faults, leases, schema, tasks
from agentdb._db.pool import pooler_mode
from agentdb._runtime import backoff, nap, owner_id, wakeups
from agentdb.errors import (
    AgentDBError,
    ConfigurationError,
    IdempotencyConflict,
    LeaseLost,
    OperationUnsettled,
    StaleWrite,
    TransientError,
)
from agentdb.worker.job import Job
from agentdb.worker.outcomes import (
    Fail,
    Handler,
    Outcome,
    ReconcileHook,
    Retry,
    Succeed,
    Wait,
)

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("agentdb.worker")


@dataclass
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    waiting: int = 0
    lease_lost: int = 0
    late_writes_refused: int = 0
    reconciled: int = 0
    released_on_shutdown: int = 0
    errors: list[str] = field(default_factory=list)


class Worker:
    """Claims due tasks of the handled types and runs them, ``concurrency`` at a time.

    ``listen_dsn``: a DSN for a dedicated LISTEN connection that wakes the
    worker when a task is inserted. Without it, or with ``pooler="transaction"``
    (default ``$AGENTDB_POOLER``: LISTEN cannot outlive a transaction behind such
    a proxy), or if LISTEN fails, the worker polls every ``poll_interval``.
    """

    def __init__(
        self,
        pool: _db.Pool,
        handlers: Mapping[str, Handler],
        *,
        reconcilers: Mapping[str, ReconcileHook] | None = None,
        worker_id: str | None = None,
        concurrency: int = 4,
        lease_ttl: timedelta | None = None,
        poll_interval: float = 1.0,
        shutdown_grace: float = 5.0,
        listen_dsn: str | None = None,
        pooler: str | None = None,
        maintenance_interval: float = 10.0,
        retry_base: float = 1.0,
    ) -> None:
        if not handlers:
            raise ConfigurationError("a worker needs at least one handler")
        if concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        self.pool = pool
        self.handlers = dict(handlers)
        self.reconcilers = dict(reconcilers or {})
        self.worker_id = worker_id or owner_id()
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.listen_dsn = None if pooler_mode(pooler) == "transaction" else listen_dsn
        self.maintenance_interval = maintenance_interval
        self.retry_base = retry_base
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._running: dict[asyncio.Task[None], Job] = {}

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_grace`` seconds, then are released."""
        self._stopping.set()
        self._wake.set()

    async def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Run until :meth:`stop` (or SIGTERM / SIGINT when ``install_signals``).

        Raises:
            MigrationError: the schema is older than this code (checked before any claim).
        """
        await schema.check(self.pool)
        loop = asyncio.get_running_loop()
        async with wakeups(
            dsn=self.listen_dsn,
            channel="agentdb_tasks",
            wake=self._wake,
            poll_interval=self.poll_interval,
            stop=self.stop,
            install_signals=install_signals,
        ):
            log.info(
                "worker %s started: types=%s concurrency=%d",
                self.worker_id,
                sorted(self.handlers),
                self.concurrency,
            )
            next_maintenance = 0.0
            try:
                while not self._stopping.is_set():
                    self._wake.clear()
                    if loop.time() >= next_maintenance:
                        await self._maintenance()
                        next_maintenance = loop.time() + self.maintenance_interval
                    claimed = await self._claim()
                    if claimed and len(self._running) < self.concurrency:
                        continue  # more may be due right now
                    await nap(self._wake, self.poll_interval)
            finally:
                await self._shutdown()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        return self.stats

    async def _maintenance(self) -> None:
        try:
            buried = await leases.bury_exhausted(self.pool, actor=self.worker_id)
            if buried:
                log.warning("%d task(s) used all their attempts and are now dead", len(buried))
            for task_type, n in await tasks.count_unhandled(self.pool, self.handlers):
                log.warning(
                    "%d due task(s) of type %r have no handler in this worker; they stay pending",
                    n,
                    task_type,
                )
        except (AgentDBError, OSError) as exc:
            # Housekeeping must never stop the claim loop; the next round retries it.
            log.warning("maintenance skipped: %s: %s", type(exc).__name__, exc)

    async def _claim(self) -> int:
        free = self.concurrency - len(self._running)
        if free <= 0:
            return 0
        try:
            claimed = await leases.claim(
                self.pool,
                self.worker_id,
                batch=free,
                lease_ttl=self.lease_ttl,
                task_types=sorted(self.handlers),
            )
        except (TransientError, OSError) as exc:
            log.warning("claim failed, retrying: %s", exc)
            return 0
        if claimed:
            _faults.point("after_claim")
        for task in claimed:
            self.stats.claimed += 1
            job = Job(self.pool, task, reconcilers=self.reconcilers, on_reconciled=self._reconciled)
            runner = asyncio.create_task(self._run_job(job))
            self._running[runner] = job
            runner.add_done_callback(self._job_done)
        return len(claimed)

    def _reconciled(self) -> None:
        self.stats.reconciled += 1

    def _job_done(self, runner: asyncio.Task[None]) -> None:
        self._running.pop(runner, None)
        self._wake.set()

    async def _run_job(self, job: Job) -> None:
        task = job.task
        handler = self.handlers[task.task_type]
        work: asyncio.Task[Outcome | None] = asyncio.create_task(handler(job))
        beat = asyncio.create_task(self._heartbeat(job, work))
        try:
            try:
                outcome = await work
            except asyncio.CancelledError:
                if job.lease_lost:
                    self.stats.lease_lost += 1
                    log.warning(
                        "task %s: lease lost, handler stopped; nothing more is written", task.id
                    )
                    return
                raise  # shutdown: _shutdown releases the lease
            except LeaseLost:
                self.stats.lease_lost += 1
                log.warning("task %s: lease lost mid-attempt; nothing more is written", task.id)
                return
            except IdempotencyConflict as exc:
                # The handler reused a key for a different request: another attempt
                # would only conflict again.
                outcome = Fail(f"IdempotencyConflict: {exc}")
            except Exception as exc:
                outcome = Retry(f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, OperationUnsettled):
                    log.warning(
                        "task %s (%s) attempt %d raised %s: %s",
                        task.id,
                        task.task_type,
                        task.attempts,
                        type(exc).__name__,
                        exc,
                    )
            beat.cancel()
            await self._finish(job, outcome or Succeed())
        finally:
            beat.cancel()

    async def _heartbeat(self, job: Job, work: asyncio.Task[Any]) -> None:
        ttl = (
            job.lease.expires_at - (job.task.lease_acquired_at or datetime.now(UTC))
        ).total_seconds()
        interval = max(0.05, ttl / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                job.lease = await leases.renew(
                    self.pool, job.lease, lease_ttl=timedelta(seconds=ttl)
                )
            except StaleWrite:
                job.lease_lost = True
                work.cancel()
                return
            except (TransientError, OSError) as exc:
                if datetime.now(UTC) >= job.lease.expires_at:
                    job.lease_lost = True
                    work.cancel()
                    return
                log.warning("task %s: lease renewal failed, retrying: %s", job.task.id, exc)

    async def _finish(self, job: Job, outcome: Outcome) -> None:
        task = job.task
        # Every finishing write is the job's task at its version, under its lease.
        finish = functools.partial(
            tasks.transition,
            self.pool,
            task.tenant_id,
            task.id,
            expected_version=job.task.state_version,
            lease=job.lease,
        )
        try:
            if isinstance(outcome, Succeed):
                await finish(to_state="succeeded", payload=outcome.payload, outbox=outcome.outbox)
                _faults.point("after_transition")
                self.stats.succeeded += 1
            elif isinstance(outcome, Fail):
                await finish(to_state="failed", error=outcome.error)
                self.stats.failed += 1
            elif isinstance(outcome, Wait):
                step = tasks.KEEP if outcome.step is None else outcome.step
                await finish(to_state="waiting", wake_at=outcome.until, step=step)
                self.stats.waiting += 1
            else:
                after = outcome.after or backoff(task.attempts, base=self.retry_base)
                await job.abandon_fresh_operations()
                released = await leases.release(
                    self.pool,
                    job.lease,
                    wake_at=datetime.now(UTC) + after,
                    error=outcome.error,
                    event_type="task.retry",
                )
                if released.state == "dead":
                    self.stats.failed += 1
                    log.warning(
                        "task %s is dead after %d attempts: %s",
                        task.id,
                        released.attempts,
                        outcome.error,
                    )
                else:
                    self.stats.retried += 1
        except LeaseLost:
            self.stats.late_writes_refused += 1
            log.warning("task %s: late write refused - the lease was taken over (G12)", task.id)

    async def _shutdown(self) -> None:
        if not self._running:
            return
        log.info(
            "shutting down: %d job(s) running, %.1fs grace", len(self._running), self.shutdown_grace
        )
        runners = list(self._running)
        _, pending = await asyncio.wait(runners, timeout=self.shutdown_grace)
        jobs = [self._running[r] for r in pending if r in self._running]
        for r in pending:
            r.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for job in jobs:
            try:
                await job.abandon_fresh_operations()
                await leases.release(
                    self.pool,
                    job.lease,
                    refund_attempt=True,
                    event_type="task.released",
                    error="worker shut down",
                )
                self.stats.released_on_shutdown += 1
            except AgentDBError as exc:
                log.warning("task %s: could not release on shutdown: %s", job.task.id, exc)
