"""Batched reserve and complete: one statement (one commit) for many operations.

Part of :mod:`agentdb.operations` (which re-exports everything here); kept
apart because its statements are its own (``queries/batch.sql``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentdb import _db, _explain, schema, telemetry
from agentdb._db.jsonb import OBJECT_CAP
from agentdb._db.jsonb import value as json_value
from agentdb.budgets import Cost
from agentdb.errors import (
    AgentDBError,
    ConfigurationError,
    RateLimited,
)
from agentdb.hashing import input_hash
from agentdb.models import Lease, Operation, Reservation

__all__ = ["Completion", "ReserveRequest", "complete_many", "reserve_many"]

_Q = _db.queries(__name__)
T = TypeVar("T")

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
        ids=[req.operation_id or uuid.uuid4() for req in batch],
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
    """Each request through :func:`~agentdb.operations.reserve`, its answer in its slot."""
    results: list[Reservation | AgentDBError] = []
    for r in batch:
        trace, span = r.ids(trace_id, span_id)
        results.append(await _each(operations.reserve(
            db, r.lease.tenant_id, r.lease.task_id, r.idempotency_key, r.action, r.input,
            lease=r.lease, retry_failed=retry_failed, actor=actor, trace_id=trace, span_id=span,
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
    if await schema.distributed(db):
        # Citus cannot lock many tenants' rows in one statement: one by one.
        return await _one_by_one(db, batch, retry_failed, actor, trace_id, span_id)
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
                again = await operations.reserve(
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
                    await operations._decide(
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
    # One by one on Citus, as in reserve_many; and when an actual cost is
    # given, which the batch statement (it spends every hold whole) cannot carry.
    if await schema.distributed(db) or any(c.cost for c in batch):
        return [await _each(operations.complete(db, c.operation, result=c.result, lease=c.lease,
                                     provider_reference=c.provider_reference, cost=c.cost))
                for c in batch]  # fmt: skip
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
            results.append(await _explain.settle(db, c.operation, c.lease, operations.UNSETTLED))
        else:
            results.append(Operation.from_record(row))
    return results


# Last: agentdb.operations imports this module at its end (see there).
from agentdb import operations  # noqa: E402
