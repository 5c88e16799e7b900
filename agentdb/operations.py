"""Operations: reserve an effect, call the provider outside any transaction, record the outcome.

The safe shape (G13)::

    res = await operations.reserve(pool, tenant, task, "charge-42", "charge", {"amount": 5})
    if res.fresh:                                # we hold the reservation
        try:
            ref = await provider.charge(..., idempotency_key="charge-42")   # no transaction open
        except ProviderTimeout:
            await operations.mark_unknown(pool, res.operation)  # may have happened
            raise
        await operations.complete(pool, res.operation, result={...}, provider_reference=ref)
    else:
        result = res.operation.result             # the first attempt's answer

Each helper commits on its own given a pool (one statement; on Citus one
transaction on the tenant's worker), never across the provider call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from agentdb import _db, _explain, budgets, telemetry
from agentdb._citus import routed
from agentdb._citus.routing import twin
from agentdb._db.jsonb import OBJECT_CAP, TEXT_CAP
from agentdb._db.jsonb import value as json_value
from agentdb._ids import new_id
from agentdb.budgets import Cost
from agentdb.errors import (
    AgentDBError,
    BudgetExceeded,
    ConfigurationError,
    IdempotencyConflict,
    LeaseLost,
    NotFound,
    OperationInFlight,
    RateLimited,
    TransientError,
)
from agentdb.hashing import input_hash
from agentdb.models import Lease, Operation, Reservation

__all__ = [
    "UNSETTLED",
    "Completion",
    "Cost",
    "ReserveRequest",
    "complete",
    "complete_many",
    "fail",
    "get",
    "list_unsettled",
    "mark_unknown",
    "reconcile",
    "reserve",
    "reserve_many",
    "start",
]

_Q = _db.queries(__name__)
#: The states of an operation whose outcome is not recorded yet (G13).
UNSETTLED = ("reserved", "in_flight", "unknown")
# See tasks._RACE_RERUNS: a concurrent reservation of the same key committed
# after this statement's snapshot; a new statement sees it.
_RACE_RERUNS = 3
T = TypeVar("T")


async def get(db: _db.Executor, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> Operation:
    """Return one operation.

    Raises:
        NotFound: no such operation in this tenant.
    """
    row = await _db.fetch_optional(db, _Q["operation_get"], tenant_id=tenant_id, id=operation_id)
    if row is None:
        raise _explain.not_found("operation", tenant_id, operation_id)
    return Operation.from_record(row)


def _lease_args(lease: Lease | None) -> dict[str, Any]:
    return {
        "lease_owner": lease.owner if lease else None,
        "lease_token": lease.token if lease else None,
    }


async def reserve(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    idempotency_key: str,
    action: str,
    input: Any,
    *,
    lease: Lease | None = None,
    retry_failed: bool = True,
    actor: str | None = None,
    trace_id: str | None = None,
    span_id: str | None = None,
    cost: Cost | None = None,
    operation_id: uuid.UUID | None = None,
) -> Reservation:
    """Reserve ``idempotency_key`` for this ``action`` and ``input`` before calling the provider.

    The input is hashed canonically (:mod:`agentdb.hashing`); the key's unique
    index decides who holds it, and the stored hash (which the version guard
    keeps bound to the key, AG008) is compared with this request's:

    * new key: a reserved operation is committed; ``fresh`` is true - call the provider;
    * same key, same input, succeeded: ``fresh`` is false; ``operation.result`` is the answer;
    * same key, same input, failed: re-armed for another attempt (``fresh`` true),
      or returned as is with ``retry_failed=False``;
    * same key, same input, not settled (reserved / in flight / unknown): raises
      :class:`OperationInFlight` - never call the provider twice;
    * same key, different input or action: raises :class:`IdempotencyConflict` -
      the stored result is never handed to a different request.

    With ``lease``, nothing is reserved unless the caller's lease on the task
    is current.

    With ``cost`` (G19), the estimate is held in the same statement on every
    budget of its units that covers the tenant or this task; it is the
    ceiling of what :func:`complete` may spend. Every reservation (and every
    re-armed retry) also counts against the action's rate limits.

    ``operation_id``: the id a new operation gets (default a fresh one); a key
    that holds an operation already keeps that one's.

    Raises:
        IdempotencyConflict, OperationInFlight: as above.
        LeaseLost: ``lease`` was taken over.
        TenantMismatch: the task is not in this tenant.
        BudgetExceeded: a budget would go over its limit (``.remaining`` says
            what each unit has left); nothing was reserved.
        RateLimited: the action used up its rate limit for this window (try
            again at ``.retry_after``); nothing was reserved.
        ConfigurationError: ``input`` is not JSON data, or ``cost`` is malformed.
    """
    digest = input_hash(input)
    costed = budgets.cost_args(cost or None)
    actor = actor or (lease.owner if lease else "agentdb")
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    attrs = {
        "agentdb.tenant_id": tenant_id,
        "agentdb.task_id": task_id,
        "agentdb.operation.key": idempotency_key,
        "agentdb.operation.action": action,
    }
    with telemetry.span("agentdb.operation.reserve", attrs):
        try:
            row = await _reserve_row(db, tenant_id, task_id, idempotency_key, action, digest,
                                     actor, trace_id, span_id, lease, costed,
                                     operation_id)  # fmt: skip
        except (BudgetExceeded, RateLimited) as refused:
            raise await budgets.refusal(
                db, refused, tenant_id, task_id, idempotency_key, action, cost, actor,
                (trace_id, span_id),
            ) from refused  # fmt: skip
    op = Operation.from_record(row)
    if row["created"]:
        return Reservation(op, fresh=True)
    return await _decide(
        db, op, action, digest, retry_failed=retry_failed, lease=lease, actor=actor,
        cost=cost or None,
    )  # fmt: skip


async def _reserve_row(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    idempotency_key: str,
    action: str,
    digest: str,
    actor: str,
    trace_id: str | None,
    span_id: str | None,
    lease: Lease | None,
    costed: dict[str, list[Any] | None],
    operation_id: uuid.UUID | None,
) -> _db.Record:
    """The reserve statement's row, rerun while it loses a race to a concurrent reservation."""
    units, amounts = costed["units"], costed["amounts"]
    cost_doc = None if units is None else json.dumps(dict(zip(units, amounts or [], strict=True)))
    for _ in range(_RACE_RERUNS):
        params = {
            "tenant_id": tenant_id,
            "id": operation_id or new_id(),
            "task_id": task_id,
            "idempotency_key": idempotency_key,
            "action": action,
            "input_hash": digest,
            "actor_id": actor,
            "trace_id": trace_id,
            "span_id": span_id,
            **_lease_args(lease),
        }
        row = await _reserve(db, {**params, **costed, "cost": cost_doc})
        if row is not None:
            return row
        if lease is not None:
            why = await _explain.task_write(db, tenant_id, task_id, None, lease)
            if isinstance(why, LeaseLost | NotFound):
                raise why
    raise TransientError("a concurrent reservation of this key is still settling")


@twin(routed.reserve)
async def _reserve(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """The reservation, its holds and its event in one statement, or the key's holder
    (on Citus: fence, insert or read, holds, event). ``None``: the lease was not
    current, or there is no such task, or the key's holder vanished in between."""
    return await _db.fetch_optional(db, _Q["operation_reserve"], **params)


async def _decide(
    db: _db.Executor,
    op: Operation,
    action: str,
    digest: str,
    *,
    retry_failed: bool,
    lease: Lease | None,
    actor: str | None,
    cost: Cost | None = None,
) -> Reservation:
    """What a reserve answers for a key that already holds ``op`` (G4)."""
    if op.input_hash != digest or op.action != action:
        raise IdempotencyConflict(
            f"idempotency key {op.idempotency_key!r} was used for a different "
            f"{'action' if op.action != action else 'input'}; refusing to reuse its result",
            tenant_id=op.tenant_id,
            key=op.idempotency_key,
            stored_hash=op.input_hash,
            given_hash=digest,
        )
    if op.state == "succeeded" or (op.state == "failed" and not retry_failed):
        return Reservation(op, fresh=False)
    if op.state == "failed" and cost:
        return Reservation(await _rearm_costed(db, op, cost, lease=lease, actor=actor), True)
    if op.state == "failed":
        try:
            rearmed = await _settle(
                db,
                op,
                ("failed",),
                "reserved",
                lease=lease,
                actor=actor,
                event_type="operation.retried",
            )
        except RateLimited as refused:  # a re-arm is a call too (G19)
            raise await _refusal(db, refused, op, None, actor) from refused
        return Reservation(rearmed, fresh=True)
    raise OperationInFlight(
        f"operation {op.id} for key {op.idempotency_key!r} is {op.state}; "
        "its first attempt has not settled - reconcile it, do not call the provider again",
        operation=op,
    )


async def _rearm_costed(
    db: _db.Executor, op: Operation, cost: Cost, *, lease: Lease | None, actor: str | None
) -> Operation:
    """Re-arm a failed operation with a hold of ``cost`` for its next attempt, both in
    one transaction: the hold first, so budgets are always locked before rate limits."""
    try:
        async with _db.transaction(db) as conn:
            await budgets.hold_retry(conn, op, cost)
            return await _settle(conn, op, ("failed",), "reserved", lease=lease, actor=actor,
                                 event_type="operation.retried")  # fmt: skip
    except (BudgetExceeded, RateLimited) as refused:
        raise await _refusal(db, refused, op, cost, actor) from refused


async def _refusal(
    db: _db.Executor,
    refused: BudgetExceeded | RateLimited,
    op: Operation,
    cost: Cost | None,
    actor: str | None,
) -> AgentDBError:
    """:func:`budgets.refusal` for a re-arm of ``op``: its event written, the refusal told."""
    return await budgets.refusal(
        db, refused, op.tenant_id, op.task_id, op.idempotency_key, op.action, cost,
        actor or "agentdb", (op.trace_id, op.span_id),
    )  # fmt: skip


async def _settle(
    db: _db.Executor,
    op: Operation,
    from_states: tuple[str, ...],
    to_state: str,
    *,
    lease: Lease | None,
    actor: str | None,
    event_type: str,
    provider_reference: str | None = None,
    result: Any = None,
    error: str | None = None,
    cost: Cost | None = None,
) -> Operation:
    params = {
        "tenant_id": op.tenant_id,
        "id": op.id,
        "expected_version": op.state_version,
        "from_states": list(from_states),
        "to_state": to_state,
        "provider_reference": provider_reference,
        "result": json_value(result, cap=OBJECT_CAP, what="operation result"),
        "error": error[:TEXT_CAP] if error is not None else None,
        "actor_id": actor or (lease.owner if lease else "agentdb"),
        "event_type": event_type,
        **_lease_args(lease),
        **budgets.cost_args(cost),
    }
    row = await _settle_row(db, params)
    if row is None:
        raise await _explain.settle(db, op, lease, from_states)
    return Operation.from_record(row)


@twin(routed.settle)
async def _settle_row(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """The settlement, its holds and its event in one statement (on Citus: the UPDATE,
    then the rest). ``None``: the UPDATE matched nothing."""
    return await _db.fetch_optional(db, _Q["operation_settle"], **params)


async def start(db: _db.Executor, op: Operation, *, lease: Lease | None = None) -> Operation:
    """Mark a reserved (or unknown, being retried idempotently) operation as in flight.

    Optional: ``reserved`` already means "the call may be happening".

    Raises:
        StaleVersion, LeaseLost, NotFound: the write matched nothing; reload.
    """
    return await _settle(
        db,
        op,
        ("reserved", "unknown"),
        "in_flight",
        lease=lease,
        actor=None,
        event_type="operation.started",
    )


async def complete(
    db: _db.Executor,
    op: Operation,
    *,
    result: Any = None,
    provider_reference: str | None = None,
    lease: Lease | None = None,
    actor: str | None = None,
    cost: Cost | None = None,
) -> Operation:
    """Record success. ``result`` is a bounded fragment (≤ 64 KiB), not the whole response (G9).

    The operation's budget holds are settled in the same statement (G19):
    ``cost`` is what the call actually used, unit by unit, at most what was
    held (a unit not named spends its whole hold); the rest is released.

    Raises:
        StaleVersion: the operation moved on (already settled by someone else).
        LeaseLost: ``lease`` was taken over; this outcome was not recorded.
        PayloadTooLarge: ``result`` is over the cap.
        InvariantViolation: ``cost`` spends more than was held
            (``agent_budget_holds_settled_valid``); nothing was recorded.
    """
    attrs = {
        "agentdb.tenant_id": op.tenant_id,
        "agentdb.task_id": op.task_id,
        "agentdb.operation.key": op.idempotency_key,
        "agentdb.operation.action": op.action,
    }
    with telemetry.span("agentdb.operation.complete", attrs):
        return await _settle(
            db,
            op,
            UNSETTLED,
            "succeeded",
            lease=lease,
            actor=actor,
            event_type="operation.succeeded",
            provider_reference=provider_reference,
            result=result,
            cost=cost,
        )


async def fail(
    db: _db.Executor,
    op: Operation,
    error: str,
    *,
    provider_reference: str | None = None,
    lease: Lease | None = None,
    actor: str | None = None,
) -> Operation:
    """Record a definite failure (the provider did not perform the effect).

    Its budget holds are released (G19). A later :func:`reserve` of the same
    key and input re-arms it for another attempt.

    Raises:
        as :func:`complete`.
    """
    return await _settle(
        db,
        op,
        UNSETTLED,
        "failed",
        lease=lease,
        actor=actor,
        event_type="operation.failed",
        provider_reference=provider_reference,
        error=error,
    )


async def mark_unknown(
    db: _db.Executor, op: Operation, *, error: str | None = None, lease: Lease | None = None
) -> Operation:
    """Record that the outcome is unknown (timeout, crash): the effect may have happened.

    The operation then needs :func:`reconcile`; :func:`reserve` of its key
    raises :class:`OperationInFlight` until then. Its budget holds stay held
    until it is reconciled (G19): the money may have been spent.

    Raises:
        as :func:`complete`.
    """
    return await _settle(
        db,
        op,
        ("reserved", "in_flight"),
        "unknown",
        lease=lease,
        actor=None,
        event_type="operation.unknown",
        error=error,
    )


async def reconcile(
    db: _db.Executor,
    op: Operation,
    *,
    succeeded: bool,
    provider_reference: str,
    result: Any = None,
    error: str | None = None,
    lease: Lease | None = None,
    actor: str | None = None,
    cost: Cost | None = None,
) -> Operation:
    """Settle an unsettled operation from what the provider says happened (by its reference).

    Its budget holds settle as in :func:`complete` (``cost``) or :func:`fail`.

    Raises:
        ConfigurationError: no ``provider_reference`` given.
        as :func:`complete` otherwise.
    """
    if not provider_reference:
        raise ConfigurationError("reconcile needs the provider's reference for the effect")
    return await _settle(
        db,
        op,
        UNSETTLED,
        "succeeded" if succeeded else "failed",
        lease=lease,
        actor=actor,
        event_type="operation.reconciled",
        provider_reference=provider_reference,
        result=result,
        error=None if succeeded else (error or "reconciled as failed"),
        cost=cost,
    )


async def list_unsettled(
    db: _db.Executor, *, older_than: timedelta = timedelta(0), batch: int = 100
) -> list[Operation]:
    """Operations left reserved, in flight or unknown whose task holds no live lease.

    This is recovery's work list: reconcile each one (by provider reference or
    an idempotent retry), never re-run it blindly (G13).
    """
    rows = await _db.fetch_many(
        db, _Q["operation_list_unsettled"], older_than=older_than, batch=batch
    )
    return [Operation.from_record(r) for r in rows]


# Batched reserve and complete. One statement (one commit) per batch of
# claimed tasks instead of one per operation: a worker is bound by Python
# client CPU per round trip long before Postgres is busy (see ``agentdb
# bench``). Each element keeps the single-row guarantees: the key's unique
# index decides (G3, G4), the caller's lease fences it (G12), and it gets its
# own event (G8).


@dataclass(frozen=True, slots=True)
class ReserveRequest:
    """One element of :func:`reserve_many`: :func:`reserve` by the holder of ``lease``.

    The lease names the tenant and the task the operation belongs to;
    ``trace_id`` / ``span_id`` (G16), when given, are this element's own
    (else the batch's). ``operation_id``: the id a new operation gets (default
    a fresh one) - a caller that lost the answer can look it up to tell its
    own reservation from an earlier attempt's.
    """

    lease: Lease
    idempotency_key: str
    action: str
    input: Any
    trace_id: str | None = None
    span_id: str | None = None
    operation_id: uuid.UUID | None = None

    def ids(self, trace_id: str | None, span_id: str | None) -> tuple[str | None, str | None]:
        """This element's trace and span ids: its own if it has any, else the batch's."""
        if self.trace_id is not None or self.span_id is not None:
            return self.trace_id, self.span_id
        return trace_id, span_id


@dataclass(frozen=True, slots=True)
class Completion:
    """One element of :func:`complete_many`: the arguments of :func:`complete`."""

    operation: Operation
    result: Any = None
    provider_reference: str | None = None
    lease: Lease | None = None
    cost: Cost | None = None


async def _each(step: Awaitable[T]) -> T | AgentDBError:
    """A batch element run alone: its result or its refusal (bad input is raised)."""
    try:
        return await step
    except ConfigurationError:
        raise
    except AgentDBError as exc:
        return exc


def _unique(keys: Iterable[tuple[uuid.UUID, Any]], what: str) -> None:
    seen: set[tuple[uuid.UUID, Any]] = set()
    for key in keys:
        if key in seen:
            raise ConfigurationError(f"{what} {key[1]!r} appears twice in one batch")
        seen.add(key)


async def _reserve_batch(
    db: _db.Executor,
    q: _db.Query,
    batch: list[ReserveRequest],
    digests: list[str],
    actor: str | None,
    trace_id: str | None,
    span_id: str | None,
) -> list[_db.Record]:
    """operation_reserve_many's rows for ``batch``."""
    ids = [req.ids(trace_id, span_id) for req in batch]
    return await _db.fetch_many(
        db,
        q,
        tenant_ids=[req.lease.tenant_id for req in batch],
        ids=[req.operation_id or new_id() for req in batch],
        task_ids=[req.lease.task_id for req in batch],
        idempotency_keys=[req.idempotency_key for req in batch],
        actions=[req.action for req in batch],
        input_hashes=digests,
        lease_owners=[req.lease.owner for req in batch],
        lease_tokens=[req.lease.token for req in batch],
        actor_id=actor,
        trace_ids=[trace for trace, _ in ids],
        span_ids=[span for _, span in ids],
    )


async def _one_by_one(
    db: _db.Executor,
    batch: list[ReserveRequest],
    retry_failed: bool,
    actor: str | None,
    trace_id: str | None,
    span_id: str | None,
) -> list[Reservation | AgentDBError]:
    """Each request through :func:`reserve`, its answer in its slot."""
    results: list[Reservation | AgentDBError] = []
    for r in batch:
        trace, span = r.ids(trace_id, span_id)
        results.append(await _each(reserve(
            db, r.lease.tenant_id, r.lease.task_id, r.idempotency_key, r.action, r.input,
            lease=r.lease, retry_failed=retry_failed, actor=actor, trace_id=trace, span_id=span,
            operation_id=r.operation_id,
        )))  # fmt: skip
    return results


async def reserve_many(
    db: _db.Executor,
    requests: Iterable[ReserveRequest],
    *,
    retry_failed: bool = True,
    actor: str | None = None,
    trace_id: str | None = None,
    span_id: str | None = None,
) -> list[Reservation | AgentDBError]:
    """:func:`reserve` for many keys in one statement; one result per request, in input order.

    For workers holding leases (a claimed batch): each request is reserved
    only while its lease on its task is current, and is answered as
    :func:`reserve` with ``lease`` answers it (``fresh`` true: call the
    provider; false: ``operation.result`` is the stored answer). The
    reservations commit together before any provider is called (G13); use
    :func:`reserve` to reserve without a lease.
    What :func:`reserve` would raise for one request is *returned* in that
    request's slot instead, so one refusal does not undo the batch:

    * :class:`IdempotencyConflict` - the key holds a different action or input;
    * :class:`OperationInFlight` - the key's first attempt has not settled;
    * :class:`LeaseLost` - the request's lease was taken over: nothing reserved;
    * :class:`NotFound` - no such task in that tenant;
    * :class:`StaleVersion` - re-arming a failed operation lost a race.

    Only a request the statement did not answer (a refused lease, a missing
    task, a concurrent reservation of the same key) costs more round trips:
    it goes through :func:`reserve`, which says why (or reruns a lost race).

    Raises:
        ConfigurationError: a key appears twice in the batch, or an input is not JSON data.
        TransientError and unrecognised database errors: nothing was reserved.
    """
    batch = list(requests)
    if not batch:
        return []
    _unique(((r.lease.tenant_id, r.idempotency_key) for r in batch), "idempotency key")
    return await _reserve_many(db, batch, retry_failed, actor, trace_id, span_id)


@twin(_one_by_one)  # Citus cannot lock many tenants' rows in one statement: one by one
async def _reserve_many(
    db: _db.Executor,
    batch: list[ReserveRequest],
    retry_failed: bool,
    actor: str | None,
    trace_id: str | None,
    span_id: str | None,
) -> list[Reservation | AgentDBError]:
    """:func:`reserve_many` in one statement; an element it did not answer goes alone."""
    digests = [input_hash(req.input) for req in batch]
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    q = _Q["operation_reserve_many"]
    try:
        rows = await _reserve_batch(db, q, batch, digests, actor, trace_id, span_id)
    except RateLimited:
        # One element over a rate limit refuses the whole statement: one by
        # one, each element gets its own answer (G19).
        return await _one_by_one(db, batch, retry_failed, actor, trace_id, span_id)
    answered = _db.by_ord(rows, q, len(batch))
    results: list[Reservation | AgentDBError] = []
    for i, (req, digest) in enumerate(zip(batch, digests, strict=True), start=1):
        row = answered.get(i)
        lease = req.lease
        try:
            if row is None:
                # Refused lease, missing task or a concurrent reservation: the
                # single-row path says which (and reruns a lost race).
                trace, span = req.ids(trace_id, span_id)
                again = await reserve(
                    db,
                    lease.tenant_id,
                    lease.task_id,
                    req.idempotency_key,
                    req.action,
                    req.input,
                    lease=lease,
                    retry_failed=retry_failed,
                    actor=actor,
                    trace_id=trace,
                    span_id=span,
                )
                results.append(again)
            elif row["created"]:
                results.append(Reservation(Operation.from_record(row), fresh=True))
            else:
                existing = Operation.from_record(row)
                results.append(
                    await _decide(
                        db,
                        existing,
                        req.action,
                        digest,
                        retry_failed=retry_failed,
                        lease=lease,
                        actor=actor or lease.owner,
                    )
                )
        except ConfigurationError:
            raise
        except AgentDBError as exc:
            # The statement committed: whatever this element's own follow-up
            # says (a lost race, a re-arm over a rate limit, a dropped
            # connection) is this element's, never the batch's.
            results.append(exc)
    return results


async def complete_many(
    db: _db.Executor, completions: Iterable[Completion], *, actor: str | None = None
) -> list[Operation | AgentDBError]:
    """:func:`complete` for many operations in one statement; one result per element, in order.

    Each operation moves to 'succeeded' only if it is still unsettled at the
    ``state_version`` it carries and, with a ``lease``, that lease on its
    task is current; each gets its event. A refused element is not settled
    and nothing is written for it; its slot holds the error :func:`complete`
    would have raised, returned rather than raised so the rest commits:

    * :class:`LeaseLost` - the element's lease was taken over: this outcome was not recorded;
    * :class:`StaleVersion` - the operation moved on (settled by someone else);
    * :class:`NotFound` - no such operation (or task) in its tenant.

    Raises:
        ConfigurationError: an operation appears twice in the batch, or a result is not JSON.
        PayloadTooLarge: a ``result`` is over the cap; nothing was written.
    """
    batch = list(completions)
    if not batch:
        return []
    _unique(((c.operation.tenant_id, c.operation.id) for c in batch), "operation")
    return await _complete_many(db, batch, actor)


async def _complete_one_by_one(
    db: _db.Executor, batch: list[Completion], actor: str | None
) -> list[Operation | AgentDBError]:
    """:func:`complete_many` as one :func:`complete` per element."""
    return [await _each(complete(db, c.operation, result=c.result, lease=c.lease,
                                 provider_reference=c.provider_reference, cost=c.cost))
            for c in batch]  # fmt: skip


@twin(_complete_one_by_one)  # one by one on Citus, as reserve_many
async def _complete_many(
    db: _db.Executor, batch: list[Completion], actor: str | None
) -> list[Operation | AgentDBError]:
    """:func:`complete_many` in one statement, unless an actual cost is given, which the
    statement (it spends every hold whole) cannot carry: then one by one."""
    if any(c.cost for c in batch):
        return await _complete_one_by_one(db, batch, actor)
    q = _Q["operation_complete_many"]
    rows = await _db.fetch_many(
        db,
        q,
        tenant_ids=[c.operation.tenant_id for c in batch],
        ids=[c.operation.id for c in batch],
        expected_versions=[c.operation.state_version for c in batch],
        provider_references=[c.provider_reference for c in batch],
        results=[json_value(c.result, cap=OBJECT_CAP, what="operation result") for c in batch],
        lease_owners=[c.lease.owner if c.lease else None for c in batch],
        lease_tokens=[c.lease.token if c.lease else None for c in batch],
        actor_id=actor,
    )
    answered = _db.by_ord(rows, q, len(batch))
    results: list[Operation | AgentDBError] = []
    for i, c in enumerate(batch, start=1):
        row = answered.get(i)
        if row is None:
            results.append(await _explain.settle(db, c.operation, c.lease, UNSETTLED))
        else:
            results.append(Operation.from_record(row))
    return results
