"""Group commit of the worker's writes: one statement for every job that wrote meanwhile.

A worker running many jobs finishes them one commit each, and a commit is
what a small write costs most (the WAL flush, the round trip, the
statement's fixed work). The completer turns the successes that arrive
while one commit is in flight into the next one's batch
(:func:`agentdb.tasks.finish_many`), as Postgres's own group commit and
River's batch completer do: a lone success is written at once, alone, with
no timer to wait for; under load each commit carries everything that
finished during the previous one, up to :data:`MAX_BATCH`. Three writes go
so: a job's reservation of an operation (:func:`reservations`, by
:func:`agentdb.operations.reserve_many`; one with a cost is written alone, as
that statement cannot hold it), the completion of an operation it reserved
(:func:`completions`, by :func:`agentdb.operations.complete_many`; one with an
actual cost is written alone, as that statement cannot carry it) and a job's
success (:func:`successes`, by :func:`agentdb.tasks.finish_many`).

Nothing is weaker than one write per job. Every element keeps its own fence
(state version, lease owner and token: G7, G12) and its own refusal: a
task taken over, cancelled (G20) or past its deadline (G21) is refused
alone and its job handles that as it would have handled its own write; the
rest of the batch commits. A batch refused as a whole (a payload Postgres
refuses, a secret in one, a lost connection) is not retried as a batch:
each of its jobs writes its outcome alone, as before group commit, where a
refusal is that one job's and a write whose answer was lost is checked for
having landed. A crash before a flush loses nothing the database had: the
queued tasks are still 'running' under leases that expire, and the
operation ledger answers their retry (G13). Nothing here holds a transaction
open while a handler runs; each flush is one autocommit statement, and a
job waiting for its reservation gets it only once it has committed, so no
provider is called for an operation the database has not recorded (G13).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from agentdb import _db, _faults, operations, tasks
from agentdb.errors import AgentDBError
from agentdb.models import Message, Operation, Reservation, Task
from agentdb.operations import Completion, ReserveRequest

__all__ = [
    "ALONE",
    "MAX_BATCH",
    "GroupCommit",
    "Success",
    "completions",
    "reservations",
    "successes",
]

log = logging.getLogger("agentdb.worker")

#: Most writes one flush carries: the statement's arrays stay small enough to plan cheaply.
MAX_BATCH: Final = 500

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Alone:
    """The batch was refused as a whole: the job writes alone."""

    def __repr__(self) -> str:
        return "ALONE"


#: What :meth:`GroupCommit.submit` returns when the job must write alone.
ALONE: Final = _Alone()


@dataclass(frozen=True, slots=True)
class Success:
    """One job's success: its claimed task, its event payload, its outbox messages."""

    task: Task
    payload: Mapping[str, Any] | None
    outbox: Sequence[Message]


@dataclass(slots=True)
class _Pending(Generic[Item, Result]):
    item: Item
    alone: Callable[[], Awaitable[Result | None]]
    answer: asyncio.Future[Result | AgentDBError | _Alone | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit(Generic[Item, Result]):
    """One kind of write of one worker's jobs, many per statement when they come together.

    ``write_many(items)`` writes a batch in one statement and answers each item
    with its result, its typed refusal or :data:`ALONE` (this item must be
    written by its job alone), in order. One flush is in flight at
    a time; what arrives meanwhile waits for the next. ``fault``: the fault
    point passed before each flush (:mod:`agentdb._faults`), if any.
    """

    def __init__(
        self,
        write_many: Callable[[list[Item]], Awaitable[Sequence[Result | AgentDBError | _Alone]]],
        *,
        what: str,
        fault: str | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.write_many = write_many
        self.what = what
        self.fault = fault
        self.max_batch = max(1, max_batch)
        #: flushes that wrote two or more items in one statement, and the items they wrote.
        self.group_commits = 0
        self.grouped = 0
        self._queue: list[_Pending[Item, Result]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(
        self, item: Item, alone: Callable[[], Awaitable[Result | None]]
    ) -> Result | AgentDBError | _Alone | None:
        """Write ``item`` in the next flush.

        ``alone()`` is the job's own write of the same item: a flush that
        finds only this one runs it (a batch of one gains nothing), and so
        it raises what that write raises.

        Returns:
            the item's result; the typed error its own write would have raised
            (``LeaseLost`` and its kinds, ``StaleVersion``, ``NotFound``,
            ``DeadlineExceeded``), for the caller to raise; :data:`ALONE`: the
            batch was refused as a whole, write alone - it may have landed if
            the connection was lost after the commit; or what ``alone()``
            returned.

        Raises:
            CancelledError: the job was cancelled (a shutdown). If no flush had
                taken the item yet nothing of it is written; else the flush is
                cancelled with it and may or may not have landed, and the other
                jobs of that flush write alone.
            whatever ``alone()`` raises.
        """
        pending: _Pending[Item, Result] = _Pending(item, alone)
        self._queue.append(pending)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_all())
        try:
            return await asyncio.shield(pending.answer)
        except asyncio.CancelledError:
            if pending in self._queue:
                self._queue.remove(pending)
            elif not pending.answer.done() and self._flusher is not None:
                # Its write is in flight: stop it, as a cancelled job's own write stopped.
                self._flusher.cancel()
            pending.answer.cancel()  # whatever the flush says now, nobody is listening
            raise

    async def _flush_all(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                if self.fault is not None:
                    _faults.point(self.fault)
                if len(batch) == 1:
                    await self._alone(batch[0])
                else:
                    await self._flush(batch)
        finally:
            self._flusher = None
            for pending in self._queue:  # only if this task was cancelled: nobody flushes them
                _answer(pending, ALONE)
            self._queue.clear()

    @staticmethod
    async def _alone(pending: _Pending[Item, Result]) -> None:
        try:
            result = await pending.alone()
        except asyncio.CancelledError:
            pending.answer.cancel()
            raise
        except BaseException as exc:
            if not pending.answer.done():
                pending.answer.set_exception(exc)
        else:
            _answer(pending, result)

    async def _flush(self, batch: list[_Pending[Item, Result]]) -> None:
        try:
            results = await self.write_many([p.item for p in batch])
        except Exception as exc:  # one element spoiled the statement, or the connection went
            log.info(
                "group commit of %d %s refused as a whole (%s: %s); each is written alone",
                len(batch),
                self.what,
                type(exc).__name__,
                exc,
            )
            answers: list[Result | AgentDBError | _Alone] = [ALONE] * len(batch)
        except BaseException:
            for p in batch:
                _answer(p, ALONE)
            raise
        else:
            answers = list(results)
            self.group_commits += 1
            self.grouped += sum(not isinstance(r, AgentDBError | _Alone) for r in results)
        for p, answer in zip(batch, answers, strict=True):
            _answer(p, answer)


def _answer(pending: _Pending[Item, Result], answer: Result | AgentDBError | _Alone | None) -> None:
    if not pending.answer.done():
        pending.answer.set_result(answer)


def successes(pool: _db.Pool) -> GroupCommit[Success, Task]:
    """The group commit of jobs' successes: :func:`agentdb.tasks.finish_many`."""

    async def finish(batch: list[Success]) -> Sequence[Task | AgentDBError]:
        return await tasks.finish_many(
            pool,
            [s.task for s in batch],
            to_state="succeeded",
            payloads={s.task.id: s.payload for s in batch if s.payload is not None},
            outbox={s.task.id: s.outbox for s in batch if s.outbox},
        )

    return GroupCommit(finish, what="successes", fault="before_group_commit")


def completions(pool: _db.Pool) -> GroupCommit[Completion, Operation]:
    """The group commit of operations' completions: :func:`agentdb.operations.complete_many`."""

    async def complete(batch: list[Completion]) -> Sequence[Operation | AgentDBError]:
        return await operations.complete_many(pool, batch)

    return GroupCommit(complete, what="completions")


def reservations(pool: _db.Pool) -> GroupCommit[ReserveRequest, Reservation]:
    """The group commit of jobs' reservations: :func:`agentdb.operations.reserve_many`.

    Two jobs reserving the same key together are not one batch's (the
    statement refuses a key twice): the later one is answered :data:`ALONE`
    and reserves alone, after the first, as it would have without group
    commit (and is told the key is in flight, or replayed).
    """

    async def reserve(batch: list[ReserveRequest]) -> Sequence[Reservation | AgentDBError | _Alone]:
        seen: set[tuple[uuid.UUID, str]] = set()
        is_first: list[bool] = []
        for r in batch:
            key = (r.lease.tenant_id, r.idempotency_key)
            is_first.append(key not in seen)
            seen.add(key)
        firsts = [r for r, first in zip(batch, is_first, strict=True) if first]
        done = iter(await operations.reserve_many(pool, firsts))
        return [next(done) if first else ALONE for first in is_first]

    return GroupCommit(reserve, what="reservations", fault="before_reserve_commit")
