"""The async worker: claim due tasks under leases, run handlers, keep leases alive, recover.

A handler is ``async def handle(job: Job) -> Outcome | None``. The natural shape
is the safe one (G13)::

    async def send_invoice(job: Job) -> None:
        res = await job.reserve(f"invoice-{job.task.params['id']}/charge", "charge", {...})
        if res.fresh:                                   # committed before the call
            ref = await provider.charge(..., idempotency_key=res.operation.idempotency_key)
            await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
        # returning None marks the task succeeded (with its event, one statement)

No transaction is open while the handler awaits the provider. The worker
renews the lease every ``ttl / 3``; when a renewal finds the lease gone the
handler is cancelled and nothing further is written (G12). A handler that
raises is retried with exponential backoff and jitter until the task's
attempts run out (then 'dead'). Operations an earlier, crashed attempt left
reserved or in flight are never re-run blindly: :meth:`Job.reserve` hands
them to the reconcile hook registered for their action, or marks them
'unknown' and retries the task later.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from agentdb import _exec, _faults, leases, operations, tasks
from agentdb._listen import nap, wakeups
from agentdb.errors import (
    AgentDBError,
    IdempotencyConflict,
    LeaseLost,
    OperationInFlight,
    StaleWrite,
    TransientError,
)
from agentdb.models import Lease, Message, Operation, Reservation, Task

__all__ = [
    "Fail",
    "Job",
    "OperationUnsettled",
    "Reconciled",
    "Retry",
    "Succeed",
    "Wait",
    "Worker",
    "WorkerStats",
    "backoff",
]

log = logging.getLogger("agentdb.worker")


# ---- outcomes a handler may return ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Succeed:
    """Finish the task: 'succeeded', with an optional event payload and outbox messages."""

    payload: Mapping[str, Any] | None = None
    outbox: tuple[Message, ...] = ()


@dataclass(frozen=True, slots=True)
class Retry:
    """Give the task back to be tried again after ``after`` (default: exponential backoff)."""

    error: str
    after: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep until ``until`` (state 'waiting'); the next claim after that resumes the task."""

    until: datetime
    step: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """Finish the task as 'failed' (permanent; no more attempts)."""

    error: str


Outcome = Succeed | Retry | Wait | Fail
Handler = Callable[["Job"], Coroutine[Any, Any, Outcome | None]]


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a reconcile hook learned from the provider about an unsettled operation."""

    succeeded: bool
    provider_reference: str
    result: Mapping[str, Any] | None = None
    error: str | None = None


#: ``async def hook(op) -> Reconciled | None``; ``None`` means "the provider
#: has no record of it": the effect did not happen and may be attempted again.
ReconcileHook = Callable[[Operation], Awaitable[Reconciled | None]]


class OperationUnsettled(AgentDBError):
    """An earlier attempt's operation could not be reconciled; the task is retried later.

    The operation is left 'unknown' for an operator or a later reconcile.
    """

    def __init__(self, operation: Operation) -> None:
        super().__init__(
            f"operation {operation.id} ({operation.action}, key {operation.idempotency_key!r}) "
            f"is {operation.state} and has no reconcile hook that could settle it"
        )
        self.operation = operation


def backoff(
    attempt: int, *, base: float = 1.0, cap: float = 300.0, jitter: float = 0.2
) -> timedelta:
    """Exponential backoff for ``attempt`` (1-based) with +/- ``jitter`` spread."""
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return timedelta(seconds=delay * random.uniform(1 - jitter, 1 + jitter))


# ---- the job a handler receives ------------------------------------------------


class Job:
    """One claimed task, for the duration of one attempt.

    Every write made through it is fenced by the current lease. ``task`` is
    the latest row the job has seen; ``lease`` the latest renewal.
    """

    def __init__(self, worker: Worker, task: Task) -> None:
        lease = task.lease
        assert lease is not None, "a claimed task has a lease"
        self.worker = worker
        self.task = task
        self.lease: Lease = lease
        self.lease_lost = False
        self._fresh: dict[uuid.UUID, Operation] = {}

    @property
    def pool(self) -> asyncpg.Pool:
        return self.worker.pool

    async def reserve(self, idempotency_key: str, action: str, input: Any) -> Reservation:
        """Reserve an operation for this task under the job's lease (:func:`operations.reserve`).

        If an earlier attempt of this task left the key reserved, in flight or
        unknown, its outcome is first reconciled through the hook registered
        for ``action``; without a hook (or when the hook cannot tell) the
        operation is marked 'unknown' and :class:`OperationUnsettled` is raised,
        so the provider is never called twice blindly.

        Raises:
            OperationUnsettled: as above; the worker retries the task later.
            IdempotencyConflict: the key was used for a different input.
            LeaseLost: the lease is gone; the worker stops the job.
        """
        try:
            res = await operations.reserve(
                self.pool,
                self.task.tenant_id,
                self.task.id,
                idempotency_key,
                action,
                input,
                lease=self.lease,
                trace_id=self.task.trace_id,
                span_id=self.task.span_id,
            )
        except OperationInFlight as busy:
            op = await operations.get(self.pool, self.task.tenant_id, busy.operation_id)
            if op.task_id != self.task.id:
                raise  # another task's operation: genuinely in flight elsewhere
            res = await self._recover(op, idempotency_key, action, input)
        if res.fresh:
            self._fresh[res.operation.id] = res.operation
            _faults.point("after_reserve")
        return res

    async def _recover(self, op: Operation, key: str, action: str, input: Any) -> Reservation:
        # We hold the task's lease, so the attempt that reserved this operation
        # is fenced out: its outcome is whatever the provider recorded.
        hook = self.worker.reconcilers.get(op.action)
        found = await hook(op) if hook is not None else None
        if hook is not None and found is None:
            # The provider has no record: the effect never happened.
            await operations.fail(
                self.pool, op, "no effect found at the provider", lease=self.lease
            )
            self.worker.stats.reconciled += 1
            return await operations.reserve(
                self.pool, self.task.tenant_id, self.task.id, key, action, input, lease=self.lease
            )
        if found is None:
            if op.state != "unknown":
                op = await operations.mark_unknown(
                    self.pool, op, error="left unsettled by a crashed attempt", lease=self.lease
                )
            raise OperationUnsettled(op)
        settled = await operations.reconcile(
            self.pool,
            op,
            succeeded=found.succeeded,
            provider_reference=found.provider_reference,
            result=found.result,
            error=found.error,
            lease=self.lease,
        )
        self.worker.stats.reconciled += 1
        if settled.state == "succeeded":
            return Reservation(settled, fresh=False)
        return await operations.reserve(
            self.pool, self.task.tenant_id, self.task.id, key, action, input, lease=self.lease
        )

    async def complete(
        self,
        op: Operation,
        *,
        result: Mapping[str, Any] | None = None,
        provider_reference: str | None = None,
    ) -> Operation:
        """Record an operation's success under the job's lease."""
        _faults.point("after_call")
        done = await operations.complete(
            self.pool, op, result=result, provider_reference=provider_reference, lease=self.lease
        )
        self._fresh.pop(op.id, None)
        _faults.point("after_complete")
        return done

    async def fail(
        self, op: Operation, error: str, *, provider_reference: str | None = None
    ) -> Operation:
        """Record an operation's definite failure under the job's lease."""
        done = await operations.fail(
            self.pool, op, error, provider_reference=provider_reference, lease=self.lease
        )
        self._fresh.pop(op.id, None)
        return done

    async def mark_unknown(self, op: Operation, error: str | None = None) -> Operation:
        """Record that an operation's outcome is unknown (a timeout): reconcile it later."""
        done = await operations.mark_unknown(self.pool, op, error=error, lease=self.lease)
        self._fresh.pop(op.id, None)
        return done

    async def step(self, name: str) -> Task:
        """Record progress (``current_step``) with its event; the task stays running."""
        self.task = await tasks.transition(
            self.pool,
            self.task.tenant_id,
            self.task.id,
            expected_version=self.task.state_version,
            to_state="running",
            step=name,
            lease=self.lease,
            event_type="task.step",
        )
        return self.task

    async def abandon_fresh_operations(self) -> int:
        """Mark operations this attempt reserved but did not settle as 'unknown' (best effort)."""
        n = 0
        for op in list(self._fresh.values()):
            with contextlib.suppress(AgentDBError):
                await operations.mark_unknown(
                    self.pool,
                    op,
                    error="attempt stopped before the outcome was recorded",
                    lease=self.lease,
                )
                n += 1
        self._fresh.clear()
        return n


# ---- the worker ------------------------------------------------------------------


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
    worker when a task is inserted. Without it (or if LISTEN fails, e.g. behind
    a transaction-pooling proxy) the worker polls every ``poll_interval``.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        handlers: Mapping[str, Handler],
        *,
        reconcilers: Mapping[str, ReconcileHook] | None = None,
        worker_id: str | None = None,
        concurrency: int = 4,
        lease_ttl: timedelta | None = None,
        poll_interval: float = 1.0,
        shutdown_grace: float = 5.0,
        listen_dsn: str | None = None,
        maintenance_interval: float = 10.0,
        retry_base: float = 1.0,
    ) -> None:
        if not handlers:
            raise ValueError("a worker needs at least one handler")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.pool = pool
        self.handlers = dict(handlers)
        self.reconcilers = dict(reconcilers or {})
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.listen_dsn = listen_dsn
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
        """Run until :meth:`stop` (or SIGTERM / SIGINT when ``install_signals``)."""
        loop = asyncio.get_running_loop()
        async with wakeups(
            dsn=self.listen_dsn, channel="agentdb_tasks", wake=self._wake,
            poll_interval=self.poll_interval, stop=self.stop, install_signals=install_signals,
        ):  # fmt: skip
            log.info(
                "worker %s started: types=%s concurrency=%d",
                self.worker_id,
                sorted(self.handlers),
                self.concurrency,
            )
            next_maintenance = 0.0
            try:
                while not self._stopping.is_set():
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
            rows = await _exec.fetch_many(
                self.pool, _exec.QUERIES["task_count_unhandled"], sorted(self.handlers)
            )
            for r in rows:
                log.warning(
                    "%d due task(s) of type %r have no handler in this worker; they stay pending",
                    r["n"],
                    r["task_type"],
                )
        except (TransientError, OSError) as exc:
            log.warning("maintenance skipped: %s", exc)

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
            job = Job(self, task)
            runner = asyncio.create_task(self._run_job(job))
            self._running[runner] = job
            runner.add_done_callback(self._job_done)
        return len(claimed)

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
            tasks.transition, self.pool, task.tenant_id, task.id,
            expected_version=job.task.state_version, lease=job.lease,
        )  # fmt: skip
        try:
            if isinstance(outcome, Succeed):
                await finish(to_state="succeeded", payload=outcome.payload, outbox=outcome.outbox)
                _faults.point("after_transition")
                self.stats.succeeded += 1
            elif isinstance(outcome, Fail):
                await finish(to_state="failed", error=outcome.error[:4000])
                self.stats.failed += 1
            elif isinstance(outcome, Wait):
                kwargs: dict[str, Any] = {} if outcome.step is None else {"step": outcome.step}
                await finish(to_state="waiting", wake_at=outcome.until, **kwargs)
                self.stats.waiting += 1
            else:
                after = outcome.after or backoff(task.attempts, base=self.retry_base)
                await job.abandon_fresh_operations()
                released = await leases.release(
                    self.pool,
                    job.lease,
                    wake_at=datetime.now(UTC) + after,
                    error=outcome.error[:4000],
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
