"""The worker loop: claim due tasks under leases, run handlers, keep leases alive, recover.

Whatever a handler does, the task does not stay 'running' behind the worker
that ran it: every way an attempt ends is turned into an outcome
(:mod:`~agentdb.worker.outcomes`) and written, or - when the write cannot
land - failed or released (:mod:`~agentdb.worker.finish`). The job runner
never raises (a bug in the worker itself is logged with its traceback and the
lease is released); the heartbeat never dies of an error.

Stopping: :meth:`Worker.stop` (SIGTERM/SIGINT) stops claiming; running jobs
get ``shutdown_grace`` seconds, then are cancelled - handlers and finishing
writes alike - and their leases are released with the attempt refunded (a
shutdown never costs a task an attempt); a lease the worker failed to give
back earlier is released as that give-back would have been (attempt
counted, its ``last_error``). A handler that ignores
its cancellation is waited for ``shutdown_grace`` more seconds (at least
one) and then released anyway: its later writes are fenced out (G12); it is
left in :attr:`Worker.abandoned`.
:class:`~agentdb.errors.PoolerMismatch` from any statement is fatal: the
worker stops the same way and :meth:`Worker.run` raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentdb import _db, _faults, leases, schedules, schema, tasks
from agentdb._db.pool import pooler_mode
from agentdb._runtime import describe, nap, owner_id, wakeups
from agentdb.errors import (
    AgentDBError,
    Cancelled,
    ConcurrencyLimitExceeded,
    ConfigurationError,
    DeadlineExceeded,
    IdempotencyConflict,
    LeaseLost,
    OperationUnsettled,
    PastDeadline,
    PoolerMismatch,
    RateLimited,
    StaleWrite,
    StepMissing,
    TransientError,
)
from agentdb.worker.completer import completions, reservations
from agentdb.worker.durable import RUNNING, Suspended
from agentdb.worker.finish import Finisher, abandon, storable
from agentdb.worker.job import Job
from agentdb.worker.outcomes import (
    Fail,
    Handler,
    Outcome,
    Parked,
    Reconciler,
    Retry,
    check_handlers,
    outcome_of,
)

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("agentdb.worker")


_LEASE_MIN, _LEASE_MAX = timedelta(seconds=1), timedelta(days=1)


def _positive(**seconds: float) -> None:
    """Refuse an interval of 0 or less: a poll interval of 0 is a busy loop against Postgres.

    Raises:
        ConfigurationError: naming the first one that is not more than 0 (or not a number).
    """
    for name, value in seconds.items():
        if not value > 0:  # also catches NaN
            raise ConfigurationError(f"{name} must be more than 0 seconds, not {value!r}")


@dataclass
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    waiting: int = 0
    lease_lost: int = 0
    #: attempts stopped because the task was cancelled (G20); counted in lease_lost too.
    cancelled: int = 0
    #: attempts stopped because the task passed its deadline (G21); in lease_lost too.
    past_deadline: int = 0
    late_writes_refused: int = 0
    reconciled: int = 0
    released_on_shutdown: int = 0
    #: attempts a rate limit refused (G19): retried at the window's end, attempt refunded.
    rate_limited: int = 0
    #: attempts parked for an operator (an unknown outcome of a MANUAL effect, G13).
    parked: int = 0
    #: outcomes the caps or the database refused (the task was failed instead).
    refused: int = 0
    #: leases released because the finishing write kept failing.
    released_unfinished: int = 0
    errors: list[str] = field(default_factory=list)


class _NotAwaitable(Exception):
    """The handler's call returned something that cannot be awaited: it ran synchronously."""


class _Escaped(Exception):
    """What the handler raised that is no ``Exception`` (SystemExit, KeyboardInterrupt,
    GeneratorExit, a ``BaseException`` of its own): a failed attempt like any other.
    Raised out of the handler's asyncio task as it is, SystemExit and KeyboardInterrupt
    end the event loop - every job of the worker left running without its shutdown -
    and the others end the job runner with the task still 'running'."""


async def _call(handler: Handler, job: Job) -> object:
    running = RUNNING.set(job)
    try:
        pending: object = handler(job)
        if not inspect.isawaitable(pending):
            raise _NotAwaitable(
                f"handler is not async: its call returned {type(pending).__name__}, not an "
                "awaitable (it ran synchronously, on the event loop)"
            )
        return await pending
    except (Exception, asyncio.CancelledError, Suspended):
        raise
    except BaseException as exc:
        raise _Escaped(describe(exc)) from exc
    finally:
        RUNNING.reset(running)


class Worker:
    """Claims due tasks of the handled types and runs them, ``concurrency`` at a time.

    A handler's failure is retried after ``retry_base * 2 ** (attempts - 1)``
    seconds (jittered), at most ``retry_cap``; attempts count every claim,
    crashes and lost leases included.

    ``listen_dsn``: a DSN for a dedicated LISTEN connection that wakes the
    worker when a task is inserted. Without it, or with ``pooler="transaction"``
    (default ``$AGENTDB_POOLER``: LISTEN cannot outlive a transaction behind such
    a proxy), or if LISTEN fails, the worker polls every ``poll_interval``.

    Raises:
        ConfigurationError: no handlers, ``concurrency`` not a whole number of 1 or more,
            ``lease_ttl`` outside 1 s - 1 day, a poll, retry base,
            retry cap or maintenance interval of 0 or less, a negative ``shutdown_grace``, a handler
            or reconcile hook that is not an async callable (named by its task type or
            action), or an unknown ``pooler``.
    """

    def __init__(
        self,
        pool: _db.Pool,
        handlers: Mapping[str, Handler],
        *,
        reconcilers: Mapping[str, Reconciler] | None = None,
        definite: tuple[type[BaseException], ...] = (),
        worker_id: str | None = None,
        concurrency: int = 4,
        lease_ttl: timedelta | None = None,
        poll_interval: float = 1.0,
        shutdown_grace: float = 5.0,
        listen_dsn: str | None = None,
        pooler: str | None = None,
        maintenance_interval: float = 10.0,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
        park_interval: float = 60.0,
        watch_interval: float = 1.0,
    ) -> None:
        if not handlers:
            raise ConfigurationError("a worker needs at least one handler")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(
                f"concurrency must be a whole number of 1 or more, not {concurrency!r}"
            )
        if lease_ttl is not None and not _LEASE_MIN <= lease_ttl <= _LEASE_MAX:
            # The task's CHECK agent_tasks_lease_ttl_valid bounds: shorter, the worker
            # would retake its own task mid-run; longer, a crashed worker's task waits days.
            raise ConfigurationError(
                f"lease_ttl must be between 1 second and 1 day, not {lease_ttl}"
            )
        _positive(
            poll_interval=poll_interval,
            retry_base=retry_base,
            retry_cap=retry_cap,
            maintenance_interval=maintenance_interval,
            park_interval=park_interval,
            watch_interval=watch_interval,
        )
        if not all(isinstance(d, type) and issubclass(d, BaseException) for d in definite):
            raise ConfigurationError(
                f"definite= names exception classes (a provider's refusals), not {definite!r}"
            )
        if not shutdown_grace >= 0:  # also catches NaN, with which stop() never returned
            raise ConfigurationError(
                f"shutdown_grace must be 0 seconds or more, not {shutdown_grace!r}"
            )
        check_handlers(handlers, reconcilers)
        self.pool = pool
        self.handlers = dict(handlers)
        self.reconcilers = dict(reconcilers or {})
        self.definite = tuple(definite)
        self.park_interval = park_interval
        self.watch_interval = watch_interval
        self.worker_id = worker_id or owner_id()
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.listen_dsn = None if pooler_mode(pooler) == "transaction" else listen_dsn
        self.maintenance_interval = maintenance_interval
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._running: dict[asyncio.Task[None], Job] = {}
        #: The jobs whose handler ignored its cancellation at the last shutdown, still
        #: tasks of the event loop (their leases released, their writes fenced out):
        #: ``asyncio.run`` waits for them at its end; ``agentdb worker`` exits without.
        self.abandoned: tuple[asyncio.Task[None], ...] = ()
        # Workers start their walk over the tenants at different places (G18).
        self._claim_after = uuid.uuid4()
        # Leases the shutdown releases with the attempt refunded: jobs it
        # interrupted, and jobs a fatal error stopped.
        self._interrupted: dict[uuid.UUID, Job] = {}
        self._fatal: PoolerMismatch | None = None
        self._finisher = Finisher(
            pool,
            self.stats,
            retry_base=retry_base,
            retry_cap=retry_cap,
            on_fatal=self._fatal_error,
        )
        #: the group commits of the jobs' reservations and operation completions (the
        #: successes' is the finisher's).
        self._completions = completions(pool)
        self._reservations = reservations(pool)

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_grace`` seconds, then are released."""
        self._stopping.set()
        self._wake.set()

    async def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Run until :meth:`stop` (or SIGTERM / SIGINT when ``install_signals``).

        Raises:
            MigrationError: the schema is older than this code (checked before any claim).
            PoolerMismatch: a transaction pooler is in the way (after releasing
                what the worker held, as far as it could).
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
            watch = asyncio.create_task(self._watch())
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
                watch.cancel()
                await self._shutdown()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    def _fatal_error(self, exc: PoolerMismatch, job: Job | None) -> None:
        if self._fatal is None:
            log.error("worker %s stopping: %s", self.worker_id, exc)
            self._fatal = exc
        if job is not None:
            self._interrupted[job.task.id] = job
        self.stop()

    async def _maintenance(self) -> None:
        await self._finisher.release_held()
        try:
            buried = await leases.bury_exhausted(self.pool, actor=self.worker_id)
            if buried:
                log.warning("%d task(s) used all their attempts and are now dead", len(buried))
            await self._sweep_deadlines()
            fired = await schedules.fire_due(self.pool)  # G24: one task per tick, whoever fires
            if fired:
                log.info("%d scheduled task(s) created", len(fired))
            for task_type, n in await tasks.count_unhandled(self.pool, self.handlers):
                log.warning(
                    "%d due task(s) of type %r have no handler in this worker; they stay pending",
                    n,
                    task_type,
                )
        except PoolerMismatch:
            raise  # no statement can work: the worker stops
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
                after_tenant=self._claim_after,
            )
        except (TransientError, ConcurrencyLimitExceeded, OSError) as exc:
            log.warning("claim failed, retrying: %s", exc)
            return 0
        if claimed:
            # G18: the next claim walks the tenants from where this one stopped.
            self._claim_after = claimed[-1].tenant_id
        if claimed:
            _faults.point("after_claim")
        for task in claimed:
            self.stats.claimed += 1
            job = Job(
                self.pool, task, reconcilers=self.reconcilers, definite=self.definite,
                on_reconciled=self._reconciled, completions=self._completions,
                reservations=self._reservations,
            )  # fmt: skip
            runner = asyncio.create_task(self._run_job(job))
            self._running[runner] = job
            runner.add_done_callback(self._job_done)
        return len(claimed)

    def _reconciled(self) -> None:
        self.stats.reconciled += 1

    def _job_done(self, runner: asyncio.Task[None]) -> None:
        job = self._running.pop(runner, None)
        self._wake.set()
        # _run_job raises nothing but cancellation; retrieving is for a bug that slipped by.
        if not runner.cancelled() and (exc := runner.exception()) is not None:
            log.error("task %s: job runner failed", job.task.id if job else "?", exc_info=exc)

    async def _run_job(self, job: Job) -> None:
        task = job.task
        work: asyncio.Task[object] = asyncio.create_task(_call(self.handlers[task.task_type], job))
        beat = asyncio.create_task(self._heartbeat(job, work))
        try:
            try:
                outcome = self._verdict(job, await work)
            except Suspended as suspended:
                # A durable wait (job.wait_for_signal, sleep, run_children): the task
                # sleeps on what it waits for, holding no worker.
                outcome = suspended.wait
            except asyncio.CancelledError:
                if job.lease_lost:
                    await self._lost(job, "handler stopped")
                    return
                me = asyncio.current_task()
                if me is not None and me.cancelling():
                    raise  # shutdown: _shutdown releases the lease
                # Cancelled by something of its own, not by the worker: the attempt
                # ended without a verdict.
                outcome = Retry("CancelledError: the handler was cancelled, not by the worker")
            except LeaseLost as exc:
                job.cancelled = job.cancelled or isinstance(exc, Cancelled)
                job.past_deadline = job.past_deadline or isinstance(exc, PastDeadline)
                await self._lost(job, "mid-attempt")
                return
            except PoolerMismatch as exc:
                self._fatal_error(exc, job)
                return
            except (IdempotencyConflict, StepMissing) as exc:
                # The handler reused a key for a different request, or reached another
                # step than it recorded (a deploy renamed it): another attempt would
                # only conflict again.
                outcome = Fail(describe(exc))
            except _NotAwaitable as exc:
                outcome = Fail(str(exc))
                log.error("task %s (%s): %s", task.id, task.task_type, exc)
            except RateLimited as exc:
                # G19: nothing was reserved, so nothing ran: wait for the window
                # to end without spending an attempt.
                after = (
                    max(exc.retry_after - datetime.now(UTC), timedelta(0))
                    if exc.retry_after
                    else None
                )
                outcome = Retry(storable(f"RateLimited: {exc}"), after, refund_attempt=True)
                self.stats.rate_limited += 1
                log.info("task %s: %s; waits %s", task.id, exc, after)
            except _Escaped as exc:
                outcome = Retry(str(exc))
                log.warning("task %s (%s) attempt %d raised %s", task.id, task.task_type,
                            task.attempts, exc, exc_info=exc.__cause__)  # fmt: skip
            except OperationUnsettled as exc:
                # G13: an effect declared MANUAL whose outcome is unknown waits for an
                # operator; the task comes back every park_interval to look, its
                # attempt refunded, so waiting never kills it.
                outcome = Parked(
                    storable(f"parked: {exc}; settle it with operations.reconcile"),
                    timedelta(seconds=self.park_interval),
                    refund_attempt=True,
                )
                self.stats.parked += 1
                log.warning("task %s: %s; parked for an operator", task.id, exc)
            except Exception as exc:
                outcome = Retry(describe(exc))
                log.warning("task %s (%s) attempt %d raised %s", task.id, task.task_type,
                            task.attempts, outcome.error, exc_info=exc)  # fmt: skip
            beat.cancel()
            await self._finisher.finish(job, outcome)
        except Exception:
            # A bug in the worker, not the handler: say so, and do not sit on the lease.
            log.exception("task %s: the worker failed to finish it", task.id)
            await self._finisher.give_back(job, "the worker failed to finish it")
        finally:
            beat.cancel()

    @staticmethod
    def _verdict(job: Job, value: object) -> Outcome:
        outcome = outcome_of(value)
        if isinstance(outcome, Fail) and outcome is not value:
            log.error("task %s (%s): %s", job.task.id, job.task.task_type, outcome.error)
        return outcome

    async def _sweep_deadlines(self) -> None:
        """Move the tasks past their deadline to dead (G21). Raises what the sweep raises."""
        late = await leases.expire_deadlines(self.pool, actor=self.worker_id)
        if late:
            log.warning("%d task(s) passed their deadline and are now dead", len(late))

    async def _lost(self, job: Job, when: str) -> None:
        self.stats.lease_lost += 1
        if job.cancelled or job.past_deadline:
            # Nobody takes the task over: what this attempt reserved and did not
            # settle is marked unknown, to be reconciled - never left as if unused.
            await abandon(job)
        if job.cancelled:
            self.stats.cancelled += 1
            log.info("task %s: cancelled (G20), %s; nothing more is written", job.task.id, when)
        elif job.past_deadline:
            self.stats.past_deadline += 1
            log.warning("task %s: passed its deadline (G21), %s; it is dead", job.task.id, when)
        else:
            log.warning("task %s: lease lost, %s; nothing more is written", job.task.id, when)

    async def _watch(self) -> None:
        """Once every ``watch_interval`` while jobs run, one statement asks which of their
        leases are still this worker's; a job whose lease a cancel (G20), the deadline sweep
        (G21) or a take-over (G12) took has its heartbeat renew now, which finds out why and
        stops the handler - within about a second, not a third of a 5-minute lease. Never
        raises: a failed look is tried again at the next tick (the heartbeat stays the
        backstop)."""
        while True:
            await asyncio.sleep(self.watch_interval)
            jobs = [j for j in self._running.values() if not j.lease_lost]
            if not jobs:
                continue
            try:
                held = await leases.held(
                    self.pool, self.worker_id, [(j.task.tenant_id, j.task.id) for j in jobs]
                )
            except Exception as exc:
                log.debug("lease watch skipped: %s", describe(exc))
                continue
            for job in jobs:
                if held.get(job.task.id) != job.lease.token:
                    job.nudge.set()

    async def _heartbeat(self, job: Job, work: asyncio.Task[Any]) -> None:
        ttl = (
            job.lease.expires_at - (job.task.lease_acquired_at or datetime.now(UTC))
        ).total_seconds()
        interval = max(0.05, ttl / 3)
        while True:
            # Every third of the TTL, or at once when the lease watch saw the lease go.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.nudge.wait(), interval)
            job.nudge.clear()
            try:
                job.lease = await leases.renew(
                    self.pool, job.lease, lease_ttl=timedelta(seconds=ttl)
                )
            except StaleWrite as exc:
                # Cancelled (G20), past its deadline (G21) or taken over: it stops now.
                job.lease_lost = True
                job.cancelled = isinstance(exc, Cancelled)
                job.past_deadline = isinstance(exc, PastDeadline)
                work.cancel()
                return
            except DeadlineExceeded:
                # G21: past its deadline the task is not renewed; it ends now (swept
                # first: once the handler stops, this heartbeat is cancelled).
                job.lease_lost = job.past_deadline = True
                with contextlib.suppress(AgentDBError, OSError):  # else maintenance sweeps
                    await self._sweep_deadlines()
                work.cancel()
                return
            except PoolerMismatch as exc:
                self._fatal_error(exc, None)  # the shutdown cancels the handler and releases
                return
            except Exception as exc:
                # Transient or not understood: keep the handler going while the lease lasts.
                if datetime.now(UTC) >= job.lease.expires_at:
                    job.lease_lost = True
                    work.cancel()
                    return
                log.warning(
                    "task %s: lease renewal failed, retrying: %s: %s",
                    job.task.id,
                    type(exc).__name__,
                    exc,
                    exc_info=not isinstance(exc, (TransientError, OSError)),
                )

    async def _shutdown(self) -> None:
        if self._running:
            log.info(
                "shutting down: %d job(s) running, %.1fs grace",
                len(self._running),
                self.shutdown_grace,
            )
            _, pending = await asyncio.wait(list(self._running), timeout=self.shutdown_grace)
            for runner in pending:
                job = self._running.get(runner)
                if job is not None:
                    self._interrupted[job.task.id] = job
                runner.cancel()
            if pending:
                _, stuck = await asyncio.wait(pending, timeout=max(1.0, self.shutdown_grace))
                self.abandoned = tuple(stuck)
                if stuck:
                    log.warning(
                        "%d handler(s) ignore cancellation; releasing their leases anyway",
                        len(stuck),
                    )
        await self._finisher.release_held()
        reason = "worker shut down" if self._fatal is None else f"worker stopped: {self._fatal}"
        for job in list(self._interrupted.values()):
            await self._release_interrupted(job, storable(reason))
        self._interrupted.clear()

    async def _release_interrupted(self, job: Job, reason: str) -> None:
        await abandon(job)
        try:
            await self._finisher.persist(
                job,
                functools.partial(
                    leases.release,
                    self.pool,
                    job.lease,
                    refund_attempt=True,
                    event_type="task.released",
                    error=reason,
                ),
                lands_in=("pending",),
            )
            self.stats.released_on_shutdown += 1
        except LeaseLost:
            log.info("task %s: finished or taken over before the release", job.task.id)
        except Exception as exc:
            log.warning(
                "task %s: could not release on shutdown (%s: %s); its lease expires at %s",
                job.task.id,
                type(exc).__name__,
                exc,
                job.lease.expires_at.isoformat(),
            )
