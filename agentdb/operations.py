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

Every helper here runs one statement and commits on its own when given a
pool; none of them holds a transaction across the provider call.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from agentdb import _exec, telemetry
from agentdb._json import OBJECT_CAP, document
from agentdb.errors import (
    AgentDBError,
    ConfigurationError,
    IdempotencyConflict,
    LeaseLost,
    NotFound,
    OperationInFlight,
    StaleVersion,
)
from agentdb.hashing import input_hash
from agentdb.models import Lease, Operation, Reservation
from agentdb.tasks import explain_stale_task

__all__ = [
    "complete",
    "fail",
    "get",
    "list_unsettled",
    "mark_unknown",
    "reconcile",
    "reserve",
    "start",
]

_Q = _exec.QUERIES
_UNSETTLED = ("reserved", "in_flight", "unknown")


async def get(db: _exec.Executor, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> Operation:
    """Return one operation.

    Raises:
        NotFound: no such operation in this tenant.
    """

    async def missing() -> AgentDBError:
        return NotFound(
            f"operation {operation_id} not found",
            entity="operation",
            tenant_id=tenant_id,
            id=operation_id,
        )

    row = await _exec.fetch_one(db, _Q["operation_get"], tenant_id, operation_id, on_zero=missing)
    return Operation.from_record(row)


async def reserve(
    db: _exec.Executor,
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
) -> Reservation:
    """Reserve ``idempotency_key`` for this ``action`` and ``input`` before calling the provider.

    The input is hashed canonically (:mod:`agentdb.hashing`) and compared with
    the stored hash under the key's unique index:

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

    Raises:
        IdempotencyConflict, OperationInFlight: as above.
        LeaseLost: ``lease`` was taken over.
        TenantMismatch: the task is not in this tenant.
        ConfigurationError: ``input`` is not JSON data.
    """
    digest = input_hash(input)
    actor = actor or (lease.owner if lease else "agentdb")
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    args = (
        tenant_id,
        uuid.uuid4(),
        task_id,
        idempotency_key,
        action,
        digest,
        actor,
        lease.owner if lease else None,
        lease.token if lease else None,
        trace_id,
        span_id,
    )

    async def zero() -> AgentDBError:
        if lease is not None:
            why = await explain_stale_task(db, tenant_id, task_id, None, lease)
            if isinstance(why, LeaseLost | NotFound):
                return why
        return _exec.Rerun("a concurrent reservation of this key is still settling")

    attrs = {
        "agentdb.tenant_id": tenant_id,
        "agentdb.task_id": task_id,
        "agentdb.operation.key": idempotency_key,
        "agentdb.operation.action": action,
    }
    with telemetry.span("agentdb.operation.reserve", attrs):
        row = await _exec.fetch_one(db, _Q["operation_reserve"], *args, on_zero=zero, reruns=2)
    op = Operation.from_record(row)
    if row["created"]:
        return Reservation(op, fresh=True)
    if op.input_hash != digest or op.action != action:
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} was used for a different "
            f"{'action' if op.action != action else 'input'}; refusing to reuse its result",
            tenant_id=tenant_id,
            key=idempotency_key,
            stored_hash=op.input_hash,
            given_hash=digest,
        )
    if op.state == "succeeded":
        return Reservation(op, fresh=False)
    if op.state == "failed":
        if not retry_failed:
            return Reservation(op, fresh=False)
        rearmed = await _settle(
            db,
            op,
            ("failed",),
            "reserved",
            lease=lease,
            actor=actor,
            event_type="operation.retried",
        )
        return Reservation(rearmed, fresh=True)
    raise OperationInFlight(
        f"operation {op.id} for key {idempotency_key!r} is {op.state}; "
        "its first attempt has not settled - reconcile it, do not call the provider again",
        tenant_id=tenant_id,
        key=idempotency_key,
        operation_id=op.id,
        state=op.state,
    )


async def _settle(
    db: _exec.Executor,
    op: Operation,
    from_states: tuple[str, ...],
    to_state: str,
    *,
    lease: Lease | None,
    actor: str | None,
    event_type: str,
    provider_reference: str | None = None,
    result: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> Operation:
    body = document(result, cap=OBJECT_CAP, what="operation result")

    async def stale() -> AgentDBError:
        if lease is not None:
            why = await explain_stale_task(db, op.tenant_id, op.task_id, None, lease)
            if isinstance(why, LeaseLost | NotFound):
                return why
        rows = await _exec.fetch_many(db, _Q["operation_get"], op.tenant_id, op.id)
        if not rows:
            return NotFound(
                f"operation {op.id} not found", entity="operation", tenant_id=op.tenant_id, id=op.id
            )
        now = rows[0]
        return StaleVersion(
            f"operation {op.id} is {now['state']} at state_version {now['state_version']}; "
            f"expected one of {', '.join(from_states)} at {op.state_version}",
            entity="operation",
            tenant_id=op.tenant_id,
            id=op.id,
            expected=op.state_version,
            actual=now["state_version"],
            actual_state=now["state"],
        )

    row = await _exec.fetch_one(
        db,
        _Q["operation_settle"],
        op.tenant_id,
        op.id,
        op.state_version,
        list(from_states),
        to_state,
        provider_reference,
        body,
        error,
        actor or (lease.owner if lease else "agentdb"),
        lease.owner if lease else None,
        lease.token if lease else None,
        event_type,
        on_zero=stale,
    )
    return Operation.from_record(row)


async def start(db: _exec.Executor, op: Operation, *, lease: Lease | None = None) -> Operation:
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
    db: _exec.Executor,
    op: Operation,
    *,
    result: Mapping[str, Any] | None = None,
    provider_reference: str | None = None,
    lease: Lease | None = None,
) -> Operation:
    """Record success. ``result`` is a bounded fragment (≤ 64 KiB), not the whole response (G9).

    Raises:
        StaleVersion: the operation moved on (already settled by someone else).
        LeaseLost: ``lease`` was taken over; this outcome was not recorded.
        PayloadTooLarge: ``result`` is over the cap.
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
            _UNSETTLED,
            "succeeded",
            lease=lease,
            actor=None,
            event_type="operation.succeeded",
            provider_reference=provider_reference,
            result=result,
        )


async def fail(
    db: _exec.Executor,
    op: Operation,
    error: str,
    *,
    provider_reference: str | None = None,
    lease: Lease | None = None,
) -> Operation:
    """Record a definite failure (the provider did not perform the effect).

    A later :func:`reserve` of the same key and input re-arms it for another attempt.

    Raises:
        as :func:`complete`.
    """
    return await _settle(
        db,
        op,
        _UNSETTLED,
        "failed",
        lease=lease,
        actor=None,
        event_type="operation.failed",
        provider_reference=provider_reference,
        error=error[:4000],
    )


async def mark_unknown(
    db: _exec.Executor, op: Operation, *, error: str | None = None, lease: Lease | None = None
) -> Operation:
    """Record that the outcome is unknown (timeout, crash): the effect may have happened.

    The operation then needs :func:`reconcile`; :func:`reserve` of its key
    raises :class:`OperationInFlight` until then.

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
        error=error[:4000] if error else None,
    )


async def reconcile(
    db: _exec.Executor,
    op: Operation,
    *,
    succeeded: bool,
    provider_reference: str,
    result: Mapping[str, Any] | None = None,
    error: str | None = None,
    lease: Lease | None = None,
) -> Operation:
    """Settle an unsettled operation from what the provider says happened (by its reference).

    Raises:
        ConfigurationError: no ``provider_reference`` given.
        as :func:`complete` otherwise.
    """
    if not provider_reference:
        raise ConfigurationError("reconcile needs the provider's reference for the effect")
    return await _settle(
        db,
        op,
        _UNSETTLED,
        "succeeded" if succeeded else "failed",
        lease=lease,
        actor=None,
        event_type="operation.reconciled",
        provider_reference=provider_reference,
        result=result,
        error=None if succeeded else (error or "reconciled as failed")[:4000],
    )


async def list_unsettled(
    db: _exec.Executor, *, older_than: timedelta = timedelta(0), batch: int = 100
) -> list[Operation]:
    """Operations left reserved, in flight or unknown whose task holds no live lease.

    This is recovery's work list: reconcile each one (by provider reference or
    an idempotent retry), never re-run it blindly (G13).
    """
    rows = await _exec.fetch_many(db, _Q["operation_list_unsettled"], older_than, batch)
    return [Operation.from_record(r) for r in rows]
