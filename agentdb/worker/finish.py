"""Writing an attempt's outcome so that the task never stays 'running' behind its worker's back.

The finishing write is one fenced statement (version + lease, G7/G12); a
success shares it with the others that finished meanwhile
(:mod:`~agentdb.worker.completer`), each element fenced and refused alone. What
the worker does when it does not simply land - one rule per case, and why:

* **Lost connection, serialization failure, deadlock** (:class:`TransientError`,
  or an :class:`OSError` from the socket): the same statement is tried again
  on a fresh connection from the pool, :data:`WRITE_TRIES` times in all with
  short backoff. A retry cannot apply twice: if an earlier try did commit, the
  fence refuses the retry, and the task row then shows the write landed
  (:meth:`Finisher.persist` checks, so it is not miscounted as a take-over).
* **Still failing**: the lease is released - due now, event ``task.released``,
  ``last_error`` saying why - so another worker retries the task at once
  instead of after the lease expires. The attempt is not refunded: the
  handler ran, and counting it is what a crash at that point would do; it also
  bounds a task whose finish can never land by ``max_attempts`` (a last attempt
  so released is 'dead'). If the release fails too the job is *held*:
  maintenance and shutdown try the release again; failing those, the lease
  expires and any worker reclaims it (G13).
* **The outcome is refused** - by the client-side caps (an outbox payload over
  64 KiB, an event payload over 8 KiB: :class:`PayloadTooLarge`; NaN or a value
  that is not JSON: :class:`ConfigurationError`) or by Postgres (a NUL byte,
  which jsonb cannot hold: SQLSTATE 22P05; a secret: :class:`SecretInPayload`;
  any other error that is not transient): the task is *failed*, with
  ``last_error`` ``"outcome refused: <Outcome>: <Error>: <why>"`` and event
  ``task.failed``; none of the refused payload or outbox is written. Not
  Retry: the outcome is what the handler computes from the task, so another
  attempt would repeat every effect it did not reserve and be refused again,
  until the attempts run out. If even that plain Fail is refused, the lease is
  released as above.
* **LeaseLost**: another worker took the task over, or the task was cancelled
  (``Cancelled``, G20) or swept past its deadline (``PastDeadline``, G21);
  nothing more is written and the late write is counted
  (``late_writes_refused``, G12).
* **DeadlineExceeded**: the task passed its deadline before the sweep ended it
  (G21); nothing of the outcome is written, the write is counted
  (``late_writes_refused``) and the sweep runs at once.
* **StaleVersion / NotFound**: another writer moved the task on under our
  lease; the lease is released if we still hold it (the release is fenced by
  the lease alone), else nothing is written.
* **PoolerMismatch**: a transaction pooler agentdb was not told about; no write
  can work, so the worker stops (``on_fatal``) and releases what it holds on
  the way out.

Error texts are made storable first: a NUL byte (which a Postgres ``text``
cannot hold) or a lone surrogate in an exception message would otherwise get
the write that records it refused.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from agentdb import _db, _faults, children, leases, tasks
from agentdb._runtime import backoff, describe, storable
from agentdb.errors import (
    AgentDBError,
    Cancelled,
    DeadlineExceeded,
    LeaseLost,
    PastDeadline,
    PoolerMismatch,
    StaleWrite,
    TransientError,
)
from agentdb.models import Task
from agentdb.worker.completer import ALONE, Success, successes
from agentdb.worker.job import Job
from agentdb.worker.outcomes import Fail, Outcome, Parked, Retry, Succeed, Wait

if TYPE_CHECKING:
    from agentdb.worker.loop import WorkerStats

__all__ = ["WRITE_TRIES", "Finisher", "storable"]

log = logging.getLogger("agentdb.worker")
T = TypeVar("T")

#: Tries of one finishing write (or release) before the worker gives up on it.
WRITE_TRIES = 4
#: Base of the backoff between tries, seconds (0.1, 0.2, 0.4, jittered).
WRITE_PAUSE = 0.1
_WRITE_PAUSE_CAP = 2.0
_TRANSIENT = (TransientError, OSError)


_brief = describe


@dataclass(frozen=True, slots=True)
class _Held:
    job: Job
    error: str


class Finisher:
    """Records each attempt's outcome for one worker; :meth:`finish` never raises.

    ``on_fatal(exc, job)`` is called when the database says the worker cannot
    work at all (:class:`PoolerMismatch`); ``job`` still holds its lease and is
    the worker's to release on the way out.
    """

    def __init__(
        self,
        pool: _db.Pool,
        stats: WorkerStats,
        *,
        retry_base: float,
        on_fatal: Callable[[PoolerMismatch, Job], None],
        retry_cap: float = 300.0,
        tries: int = WRITE_TRIES,
        pause: float = WRITE_PAUSE,
    ) -> None:
        self.pool = pool
        self.stats = stats
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.tries = max(1, tries)
        self.pause = pause
        self._on_fatal = on_fatal
        self._held: dict[uuid.UUID, _Held] = {}
        #: the successes' group commit (the other outcomes are written one by one).
        self.completer = successes(pool)

    async def finish(self, job: Job, outcome: Outcome) -> None:
        """Record ``outcome`` - or, failing that, fail the task or release its lease.

        Raises:
            CancelledError: only that (a shutdown); the caller releases the lease.
        """
        await self._record(job, outcome, fallback=False)

    async def _record(self, job: Job, outcome: Outcome, *, fallback: bool) -> None:
        task = job.task
        try:
            await self._write(job, outcome)
        except LeaseLost as exc:
            self.stats.late_writes_refused += 1
            if isinstance(exc, Cancelled | PastDeadline):
                # Ended under us (G20, G21): nobody takes the task over, so what the
                # attempt left unsettled is marked unknown, to be reconciled.
                job.cancelled = isinstance(exc, Cancelled)
                job.past_deadline = not job.cancelled
                await abandon(job)
                if job.cancelled:
                    self.stats.cancelled += 1
                else:
                    self.stats.past_deadline += 1
                log.info("task %s: outcome not written - %s", task.id, exc)
            else:
                log.warning("task %s: late write refused - the lease was taken over (G12)", task.id)
        except DeadlineExceeded:
            # G21: past its deadline nothing keeps the task alive - not this outcome,
            # not a fallback Fail, not a release; the sweep ends it now.
            self.stats.late_writes_refused += 1
            self.stats.past_deadline += 1
            log.warning("task %s: outcome not written - the task passed its deadline", task.id)
            try:
                await leases.expire_deadlines(self.pool, actor=job.lease.owner)
            except (AgentDBError, OSError) as exc:  # the next maintenance sweeps it
                log.warning("deadline sweep skipped: %s", _brief(exc))
            job.past_deadline = True
            await abandon(job)
        except PoolerMismatch as exc:
            self._on_fatal(exc, job)
        except _TRANSIENT as exc:
            await self.give_back(job, f"finishing write failed {self.tries} times: {_brief(exc)}")
        except StaleWrite as exc:
            await self.give_back(job, f"finishing write refused: {_brief(exc)}")
        except Exception as exc:
            if fallback:
                await self.give_back(job, f"recording the failure was refused too: {_brief(exc)}")
                return
            self.stats.refused += 1
            error = f"outcome refused: {type(outcome).__name__}: {_brief(exc)}"
            log.error("task %s (%s): %s", task.id, task.task_type, error)
            await self._record(job, Fail(error), fallback=True)

    async def _write(self, job: Job, outcome: Outcome) -> None:
        task = job.task
        if isinstance(outcome, Succeed | Fail):
            await _unsettled_at_the_end(job)
        # Every finishing write is the job's task at its version, under its lease.
        finish = functools.partial(
            tasks.transition,
            self.pool,
            task.tenant_id,
            task.id,
            expected_version=task.state_version,
            lease=job.lease,
        )
        if isinstance(outcome, Succeed):
            # Materialised once, so a retried write carries the same messages.
            outbox = tuple(outcome.outbox)

            def write() -> Awaitable[Task]:
                return finish(to_state="succeeded", payload=outcome.payload, outbox=outbox)

            landed = await self.completer.submit(
                Success(task, outcome.payload, outbox),
                alone=lambda: self.persist(job, write, ("succeeded",)),
            )
            if isinstance(landed, AgentDBError):
                raise landed  # this element's refusal, handled as its own write's
            if landed is ALONE:
                await self.persist(job, write, ("succeeded",), maybe_landed=True)
            _faults.point("after_transition")
            self.stats.succeeded += 1
        elif isinstance(outcome, Fail):
            error = storable(outcome.error)
            await self.persist(job, lambda: finish(to_state="failed", error=error), ("failed",))
            self.stats.failed += 1
        elif isinstance(outcome, Wait):
            step = tasks.KEEP if outcome.step is None else outcome.step
            want = await self._children_wanted(job, outcome)
            await self.persist(
                job,
                lambda: finish(
                    to_state="waiting",
                    wake_at=outcome.until,
                    step=step,
                    wait_signal=outcome.signal,
                    # Only a wait for a signal moves the cursor past what the run read: a
                    # run that waits for its children or a time reads the same signals
                    # again when it is re-entered from the top (an approval read before
                    # a fan-out is still there after it).
                    signals_read=job.signals_read if outcome.signal is not None else None,
                    wait_children=want,
                ),
                lands_in=("waiting",),
            )
            self.stats.waiting += 1
        else:
            await self._retry(job, outcome)

    async def _children_wanted(self, job: Job, outcome: Wait) -> int | None:
        """How many children a ``Wait(children=...)`` waits for (G23); None for no children.

        Raises:
            ConfigurationError: the task has no children, or fewer than asked for.
        """
        if outcome.children is False:
            return None
        finished = None if outcome.children is True else int(outcome.children)
        return await children.wanted(self.pool, job.task, finished)

    async def _retry(self, job: Job, outcome: Retry) -> None:
        task = job.task
        after = outcome.after or backoff(task.attempts, base=self.retry_base, cap=self.retry_cap)
        wake_at = datetime.now(UTC) + after
        error = storable(outcome.error)
        await abandon(job)
        released = await self.persist(
            job,
            lambda: leases.release(
                self.pool,
                job.lease,
                wake_at=wake_at,
                error=error,
                refund_attempt=outcome.refund_attempt,
                event_type="task.parked"
                if isinstance(outcome, Parked)
                else "task.rate_limited"
                if outcome.refund_attempt
                else "task.retry",
            ),
            lands_in=("pending", "dead"),
        )
        # A release whose answer was lost but which landed (None) decided as the
        # statement does: on the row the job holds, whose attempts no one else moved.
        died = (
            released.state == "dead"
            if released is not None
            else not outcome.refund_attempt and task.attempts >= task.max_attempts
        )
        if died:
            self.stats.failed += 1
            log.warning(
                "task %s is dead after %d attempts: %s", task.id, task.attempts, outcome.error
            )
        else:
            self.stats.retried += 1

    async def persist(
        self,
        job: Job,
        write: Callable[[], Awaitable[T]],
        lands_in: tuple[str, ...],
        *,
        maybe_landed: bool = False,
    ) -> T | None:
        """``write()``'s result, retrying transient failures on a fresh connection.

        ``None`` when a retry was refused because an earlier try, whose answer
        was lost with its connection, had landed (the task moved to one of
        ``lands_in`` at the next version, lease dropped). ``maybe_landed``: an
        earlier write of the same outcome (a group commit) may have landed
        already, so even the first try's refusal is checked so.

        Raises:
            TransientError, OSError: still failing after :attr:`tries` tries.
            whatever else ``write`` raises, at once.
        """
        failures = 0
        while True:
            try:
                return await write()
            except StaleWrite:
                if (failures or maybe_landed) and await self._landed(job, lands_in):
                    log.info("task %s: the write whose answer was lost had landed", job.task.id)
                    return None
                raise
            except _TRANSIENT as exc:
                failures += 1
                if failures >= self.tries:
                    raise
                log.warning(
                    "task %s: write failed (%s); trying again on a fresh connection",
                    job.task.id,
                    _brief(exc),
                )
                pause = backoff(failures, base=self.pause, cap=_WRITE_PAUSE_CAP)
                await asyncio.sleep(pause.total_seconds())

    async def _landed(self, job: Job, lands_in: tuple[str, ...]) -> bool:
        try:
            now = await tasks.get(self.pool, job.task.tenant_id, job.task.id)
        except Exception:  # unknown is not landed: the caller reports the refusal
            return False
        return (
            now.state in lands_in
            and now.state_version == job.task.state_version + 1
            and now.lease_owner is None
        )

    async def give_back(self, job: Job, error: str) -> None:
        """Release the lease now (attempt counted, ``last_error`` set), so another worker
        retries at once; if that fails, hold the job for :meth:`release_held`."""
        error = storable(error)
        try:
            await abandon(job)
            released = await self.persist(
                job,
                lambda: leases.release(
                    self.pool, job.lease, error=error, event_type="task.released"
                ),
                lands_in=("pending", "dead"),
            )
        except StaleWrite as exc:  # LeaseLost, NotFound: not ours to release any more
            self._held.pop(job.task.id, None)
            log.warning("task %s: nothing to release: %s", job.task.id, _brief(exc))
            return
        except PoolerMismatch as exc:
            self._held.pop(job.task.id, None)
            self._on_fatal(exc, job)
            return
        except Exception as exc:
            self._held[job.task.id] = _Held(job, error)
            log.error(
                "task %s: could not release it either (%s); trying again later, else its lease "
                "expires at %s",
                job.task.id,
                _brief(exc),
                job.lease.expires_at.isoformat(),
            )
            return
        self._held.pop(job.task.id, None)
        self.stats.released_unfinished += 1
        if released is not None:
            state = released.state
        else:  # its answer was lost: where the release statement puts an unrefunded attempt
            state = "dead" if job.task.attempts >= job.task.max_attempts else "pending"
        log.warning("task %s: lease released (now %s): %s", job.task.id, state, error)

    async def release_held(self) -> None:
        """Try again to release every lease :meth:`give_back` could not (best effort)."""
        for held in list(self._held.values()):
            await self.give_back(held.job, held.error)


async def _unsettled_at_the_end(job: Job) -> None:
    """A finished task is never claimed again: an operation its last attempt reserved
    and left unsettled would stay 'reserved' for good (and another task reusing the
    key would get OperationInFlight on every try). Marked 'unknown', it is listed for
    reconcile. Best effort: never raises."""
    try:
        n = await job.abandon_fresh_operations()
    except Exception as exc:
        log.warning("task %s: could not mark its reservations unknown: %s", job.task.id, exc)
        return
    if n:
        log.warning(
            "task %s finished with %d operation(s) it reserved and never settled: "
            "marked unknown, to be reconciled", job.task.id, n,
        )  # fmt: skip


async def abandon(job: Job) -> None:
    """Mark the attempt's unsettled reservations 'unknown' (best effort: never raises)."""
    try:
        await job.abandon_fresh_operations()
    except Exception as exc:  # the release must happen whether or not this did
        log.warning("task %s: could not mark its reservations unknown: %s", job.task.id, exc)
