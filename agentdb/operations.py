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
from datetime import timedelta
from typing import Any, TypeVar

from agentdb import _db, _explain, _routed, budgets, schema, telemetry
from agentdb._db.jsonb import OBJECT_CAP, TEXT_CAP
from agentdb._db.jsonb import value as json_value
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
                                     actor, trace_id, span_id, lease, costed)  # fmt: skip
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
) -> _db.Record:
    """The reserve statement's row, rerun while it loses a race to a concurrent reservation."""
    units, amounts = costed["units"], costed["amounts"]
    cost_doc = None if units is None else json.dumps(dict(zip(units, amounts or [], strict=True)))
    for _ in range(_RACE_RERUNS):
        params = {
            "tenant_id": tenant_id,
            "id": uuid.uuid4(),
            "task_id": task_id,
            "idempotency_key": idempotency_key,
            "action": action,
            "input_hash": digest,
            "actor_id": actor,
            "trace_id": trace_id,
            "span_id": span_id,
            **_lease_args(lease),
        }
        if await schema.distributed(db):
            row = await _routed.reserve(db, {**params, **costed})
        else:
            row = await _db.fetch_optional(
                db, _Q["operation_reserve"], **params, **costed, cost=cost_doc
            )
        if row is not None:
            return row
        if lease is not None:
            why = await _explain.task_write(db, tenant_id, task_id, None, lease)
            if isinstance(why, LeaseLost | NotFound):
                raise why
    raise TransientError("a concurrent reservation of this key is still settling")


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
    if await schema.distributed(db):
        row = await _routed.settle(db, params)
    else:
        row = await _db.fetch_optional(db, _Q["operation_settle"], **params)
    if row is None:
        raise await _explain.settle(db, op, lease, from_states)
    return Operation.from_record(row)


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
            actor=None,
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
        actor=None,
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
        actor=None,
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


# The batch helpers live in agentdb.batch (their own statements); they are
# part of this module's API. Imported last: agentdb.batch calls back into it.
from agentdb.batch import (  # noqa: E402
    Completion,
    ReserveRequest,
    complete_many,
    reserve_many,
)
