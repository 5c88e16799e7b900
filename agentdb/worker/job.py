"""The job a handler receives: one claimed task, for the duration of one attempt."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentdb import _db, _faults, children, operations, signals, steps, telemetry
from agentdb._ids import new_id
from agentdb.errors import (
    AgentDBError,
    Cancelled,
    ConfigurationError,
    NotFound,
    OperationInFlight,
    OperationUnsettled,
    PastDeadline,
    StaleWrite,
)
from agentdb.models import Lease, Operation, Reservation, Signal, Task
from agentdb.operations import Completion, Cost, ReserveRequest
from agentdb.worker.completer import GroupCommit
from agentdb.worker.durable import Durable, Reconcile
from agentdb.worker.outcomes import MANUAL, Reconciler

__all__ = ["Job"]


class Job(Durable):
    """One claimed task, for the duration of one attempt.

    Every write made through it is fenced by the current lease. ``task`` is
    the row as claimed; ``lease`` the latest renewal (the worker's heartbeat
    replaces it). The straight-line API - :meth:`step`, :meth:`effect`,
    :meth:`wait_for_signal`, :meth:`sleep`, :meth:`run_children` - is
    :mod:`agentdb.worker.durable`'s; below it, :meth:`reserve` and the settling
    methods for handlers that keep their own state.
    """

    def __init__(
        self,
        pool: _db.Pool,
        task: Task,
        *,
        reconcilers: Mapping[str, Reconciler],
        definite: tuple[type[BaseException], ...] = (),
        on_reconciled: Callable[[], None] = lambda: None,
        completions: GroupCommit[Completion, Operation] | None = None,
        reservations: GroupCommit[ReserveRequest, Reservation] | None = None,
    ) -> None:
        lease = task.lease
        if lease is None:
            raise ConfigurationError(
                f"task {task.id} holds no lease: only a claimed task makes a job"
            )
        self.pool = pool
        self.task = task
        self.lease: Lease = lease
        self.lease_lost = False
        #: the lease went with a cancel of the task (G20), not to another worker.
        self.cancelled = False
        #: the lease went with the deadline sweep (G21).
        self.past_deadline = False
        #: set by the worker's lease watch: renew now (the lease looks gone).
        self.nudge = asyncio.Event()
        self._reconcilers = reconcilers
        self._on_reconciled = on_reconciled
        #: the worker's group commits of completions and reservations; None: each alone.
        self._completions = completions
        self._reservations = reservations
        self._fresh: dict[uuid.UUID, Operation] = {}
        #: the last signal ``seq`` this attempt read (None: it read none).
        self.signals_read: int | None = None
        #: what earlier runs recorded (steps and effects), read on the first named call.
        self._ledger: steps.Ledger | None = None
        #: exceptions an effect's function raises when the provider did nothing (the
        #: worker's ``definite=``; NotPerformed always is one).
        self._definite = definite

    async def spawn(
        self, task_type: str, key: str, params: Mapping[str, Any] | None = None, **create: Any
    ) -> Task:
        """Create child ``key`` of this task, once per key (:func:`agentdb.children.spawn`,
        G23); a retried attempt that spawns the same keys gets the same children.

        Raises:
            as :func:`agentdb.children.spawn`.
        """
        return await children.spawn(self.pool, self.task, task_type, key, params=params, **create)

    async def children(self) -> list[children.Child]:
        """This task's children, with the results of those that finished (G23)."""
        return await children.children(self.pool, self.task.tenant_id, self.task.id)

    async def signals(self) -> list[Signal]:
        """The signals and approvals the task has not read yet, in order (G22).

        They count as read once the attempt ends in a ``Wait`` (which moves the
        task's cursor past them); an attempt that ends otherwise - a retry, a
        crash - leaves them unread for the next one, and a finished task reads
        nothing more. Calling it again returns what arrived since, too.
        """
        found = await signals.unread(self.pool, self.task.tenant_id, self.task.id)
        if found:
            self.signals_read = max(self.signals_read or 0, found[-1].seq)
        return found

    async def reserve(
        self, idempotency_key: str, action: str, input: Any, *, cost: Cost | None = None
    ) -> Reservation:
        """Reserve an operation for this task under the job's lease (:func:`operations.reserve`).

        ``cost`` holds an estimate on the tenant's (and task's) budgets (G19).

        If an earlier attempt of this task left the key reserved, in flight or
        unknown (it crashed, or raised before recording what the provider said),
        its outcome is settled first (G13): by the reconcile hook registered for
        ``action``; with :data:`MANUAL` registered instead, the operation is
        marked 'unknown' and :class:`OperationUnsettled` is raised (the worker
        parks the task until an operator settles it); with neither, the
        reservation is handed back ``fresh`` once more, marked unknown and then
        in flight in the ledger (``operation.unknown``, ``operation.started``):
        call the provider again **with the same idempotency key** - a repeat the
        provider's key makes safe, and the only way to learn the outcome without
        a hook.

        Raises:
            OperationUnsettled: as above; the worker parks the task.
            OperationInFlight: the key is held by another task's unsettled operation.
            IdempotencyConflict: the key was used for a different input.
            LeaseLost: the lease is gone; the worker stops the job.
            BudgetExceeded: a budget has no room for ``cost``.
            RateLimited: the action is over its rate limit; unhandled, the worker
                retries the task when the window ends, without spending an attempt.
        """
        return await self._reserve_effect(idempotency_key, action, input, cost, None)

    async def _reserve_effect(
        self, key: str, action: str, input: Any, cost: Cost | None, policy: Reconcile
    ) -> Reservation:
        """:meth:`reserve`, settling an earlier attempt's operation by ``policy`` (a hook,
        MANUAL, or None: the worker's hook for the action, else a repeat with the key)."""
        try:
            res = await self._reserve(key, action, input, cost)
        except OperationInFlight as busy:
            if busy.operation.task_id != self.task.id or busy.operation.id in self._fresh:
                # Another task's operation, or this attempt's own: genuinely in flight.
                raise
            chosen = policy if policy is not None else self._reconcilers.get(busy.operation.action)
            res = await self._recover(busy.operation, key, action, input, cost, chosen)
        if res.fresh:
            self._fresh[res.operation.id] = res.operation
            _faults.point("after_reserve")
        return res

    async def _reserve(self, key: str, action: str, input: Any, cost: Cost | None) -> Reservation:
        lease = self.lease

        def alone() -> Awaitable[Reservation]:
            return operations.reserve(
                self.pool, self.task.tenant_id, self.task.id, key, action, input, lease=lease,
                trace_id=self.task.trace_id, span_id=self.task.span_id, cost=cost,
            )  # fmt: skip

        if self._reservations is None or cost is not None:  # a cost is held alone
            return await alone()
        # The ids are resolved here, in this job's context (its current span), not in
        # the flush's, which runs in whichever job's context started it (G16).
        trace_id, span_id = telemetry.ids(self.task.trace_id, self.task.span_id)
        op_id = new_id()
        request = ReserveRequest(
            lease, key, action, input, trace_id=trace_id, span_id=span_id, operation_id=op_id
        )
        done = await self._reservations.submit(request, alone)
        if isinstance(done, AgentDBError):
            raise done  # this element's refusal, as its own write's
        if isinstance(done, Reservation):
            return done
        # The batch was refused whole (or held this key twice), or its answer was
        # lost: if it committed, the operation with the id this job chose is its own
        # reservation - not an earlier attempt's, to reconcile (G13). Else alone.
        try:
            mine = await operations.get(self.pool, self.task.tenant_id, op_id)
        except NotFound:
            return await alone()
        if mine.state != "reserved":  # moved on since (a takeover's reconcile): decide alone
            return await alone()
        return Reservation(mine, fresh=True)

    async def _recover(
        self,
        op: Operation,
        key: str,
        action: str,
        input: Any,
        cost: Cost | None,
        policy: Reconciler | None,
    ) -> Reservation:
        # We hold the task's lease, so the attempt that reserved this operation
        # is fenced out: its outcome is whatever the provider recorded.
        if policy == MANUAL or policy is None:
            if op.state != "unknown":
                op = await operations.mark_unknown(
                    self.pool, op, error="left unsettled by an attempt that stopped",
                    lease=self.lease,
                )  # fmt: skip
            if policy == MANUAL:
                raise OperationUnsettled(op)
            # No hook to ask: the provider's idempotency key answers a repeat with the
            # first call's effect, so calling it again with the same key is how the
            # outcome is learned - recorded as such (unknown, then started), never blind.
            return Reservation(await operations.start(self.pool, op, lease=self.lease), fresh=True)
        found = await policy(op)
        if found is None:
            # The provider has no record: the effect never happened.
            await operations.fail(
                self.pool, op, "no effect found at the provider", lease=self.lease
            )
            self._on_reconciled()
            return await self._reserve(key, action, input, cost)
        settled = await operations.reconcile(
            self.pool,
            op,
            succeeded=found.succeeded,
            provider_reference=found.provider_reference,
            result=found.result,
            error=found.error,
            lease=self.lease,
        )
        self._on_reconciled()
        if settled.state == "succeeded":
            return Reservation(settled, fresh=False)
        return await self._reserve(key, action, input, cost)

    async def complete(
        self,
        op: Operation,
        *,
        result: Any = None,
        provider_reference: str | None = None,
        cost: Cost | None = None,
    ) -> Operation:
        """Record an operation's success under the job's lease; ``cost``: what it used (G19).

        Raises:
            as :func:`agentdb.operations.complete`.
        """
        _faults.point("after_call")

        def alone(lease: Lease | None) -> Awaitable[Operation]:
            return operations.complete(
                self.pool, op, result=result, provider_reference=provider_reference,
                lease=lease, cost=cost,
            )  # fmt: skip

        async def write(lease: Lease | None) -> Operation:
            if self._completions is None or cost is not None:  # a cost is written alone
                return await alone(lease)
            done = await self._completions.submit(
                Completion(op, result, provider_reference, lease), lambda: alone(lease)
            )
            if isinstance(done, AgentDBError):
                raise done  # this element's refusal, as its own write's
            if isinstance(done, Operation):
                return done
            return await self._landed_or(op, alone(lease))  # the batch was refused whole

        done = await self._settle(op, write)
        _faults.point("after_complete")
        return done

    async def _landed_or(self, op: Operation, write: Awaitable[Operation]) -> Operation:
        """``write``'s result - or, if refused because a group commit whose answer was lost
        had recorded the success already, the operation as recorded.

        Raises:
            whatever ``write`` raises otherwise.
        """
        try:
            return await write
        except StaleWrite:
            now = await operations.get(self.pool, op.tenant_id, op.id)
            if now.state == "succeeded" and now.state_version == op.state_version + 1:
                return now
            raise

    async def fail(
        self, op: Operation, error: str, *, provider_reference: str | None = None
    ) -> Operation:
        """Record an operation's definite failure under the job's lease.

        Raises:
            as :func:`agentdb.operations.fail`.
        """
        return await self._settle(
            op,
            lambda lease: operations.fail(
                self.pool, op, error, provider_reference=provider_reference, lease=lease
            ),
        )

    async def mark_unknown(self, op: Operation, error: str | None = None) -> Operation:
        """Record that an operation's outcome is unknown (a timeout): reconcile it later.

        Raises:
            as :func:`agentdb.operations.mark_unknown`.
        """
        return await self._settle(
            op, lambda lease: operations.mark_unknown(self.pool, op, error=error, lease=lease)
        )

    async def _settle(
        self, op: Operation, write: Callable[[Lease | None], Awaitable[Operation]]
    ) -> Operation:
        """``write`` under the job's lease; after a cancel or the deadline sweep (G20,
        G21), once more without it, then re-raise: nobody takes such a task over, and
        this attempt knows what the provider did - a cancel never makes an effect
        disappear. A lease taken over by another worker stays a refusal (G12)."""
        try:
            done = await write(self.lease)
        except (Cancelled, PastDeadline):
            with contextlib.suppress(AgentDBError):  # else abandon marks it unknown
                await write(None)
                self._fresh.pop(op.id, None)
            raise
        self._fresh.pop(op.id, None)
        return done

    async def abandon_fresh_operations(self) -> int:
        """Mark operations this attempt reserved but did not settle as 'unknown' (best effort).

        After a cancel or the deadline sweep (``cancelled``, ``past_deadline``) the
        marks are written without the lease, which went with the task.
        """
        lease = None if self.cancelled or self.past_deadline else self.lease
        n = 0
        for op in list(self._fresh.values()):
            with contextlib.suppress(AgentDBError):
                await operations.mark_unknown(
                    self.pool,
                    op,
                    error="attempt stopped before the outcome was recorded",
                    lease=lease,
                )
                n += 1
        self._fresh.clear()
        return n
