"""Outbox: messages that commit with the business transaction, delivered by a relay (G10, G11).

:func:`enqueue` runs on the caller's connection inside the caller's
transaction. The relay side - :func:`claim`, publish (outside any
transaction), :func:`mark_delivered` / :func:`mark_failed` - may publish a
message twice (a crash after publishing, before marking); consumers dedupe on
the stable message id with :mod:`agentdb.inbox`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentdb import _db, _explain, telemetry
from agentdb._citus import routed
from agentdb._citus.routing import twin
from agentdb._db.jsonb import OBJECT_CAP, TEXT_CAP, document
from agentdb._ids import new_id
from agentdb.errors import ConfigurationError, InvalidTransition
from agentdb.models import OutboxMessage

__all__ = [
    "Delivery",
    "Failure",
    "claim",
    "deliver_and_claim",
    "enqueue",
    "get",
    "mark_delivered",
    "mark_failed",
    "retry",
]

_Q = _db.queries(__name__)
log = logging.getLogger(__name__)


async def enqueue(
    conn: _db.Conn,
    tenant_id: uuid.UUID,
    topic: str,
    payload: Mapping[str, Any] | None = None,
    *,
    task_id: uuid.UUID | None = None,
    message_id: uuid.UUID | None = None,
    max_attempts: int = 20,
    trace_id: str | None = None,
    span_id: str | None = None,
) -> uuid.UUID:
    """Write a message in the caller's transaction; return its stable id.

    Pass the connection your business writes use, inside their transaction:
    the message then exists if and only if they commit.

    Raises:
        PayloadTooLarge: ``payload`` is over 64 KiB.
        DuplicateKey: ``message_id`` was already used in this tenant.
        NotFound: the tenant does not exist (``entity`` ``"tenant"``).
        TenantMismatch: the task does not exist in this tenant.
    """
    body = document(payload or {}, cap=OBJECT_CAP, what=f"outbox payload for {topic}")
    mid = message_id or new_id()
    trace_id, span_id = telemetry.ids(trace_id, span_id)

    row = await _db.fetch_one(
        conn,
        _Q["outbox_enqueue"],
        tenant_id=tenant_id,
        id=mid,
        task_id=task_id,
        topic=topic,
        payload=body,
        max_attempts=max_attempts,
        trace_id=trace_id,
        span_id=span_id,
    )
    return uuid.UUID(str(row["id"]))


async def claim(
    db: _db.Executor,
    relay: str,
    *,
    batch: int = 100,
    visibility: timedelta = timedelta(seconds=30),
    after_tenant: uuid.UUID | None = None,
) -> list[OutboxMessage]:
    """Lease up to ``batch`` due messages to ``relay`` for ``visibility``.

    On a Citus schema messages are claimed tenant by tenant, starting after
    ``after_tenant`` (pass the tenant of the last message of the previous
    claim to rotate); on plain Postgres the oldest due messages come first
    and ``after_tenant`` is not needed.

    A due message that already used its ``max_attempts`` is not claimed but
    buried as 'dead' (logged): its last claim's outcome was never recorded -
    its relay stopped mid-publish, as a poison message makes it do every
    time. The batch is then shorter.

    Raises:
        ConfigurationError: ``batch`` or ``visibility`` is not positive.
    """
    claimed, _ = await _claim(db, relay, batch, visibility, after_tenant)
    return claimed


async def _claim(
    db: _db.Executor,
    relay: str,
    batch: int,
    visibility: timedelta,
    after_tenant: uuid.UUID | None,
) -> tuple[list[OutboxMessage], int]:
    """:func:`claim`, and how many due messages it buried. Raises what it raises."""
    if batch < 1:
        raise ConfigurationError("batch must be at least 1")
    if visibility <= timedelta(0):
        # A lease that has already run out: another relay could claim the
        # message at once and publish it a second time alongside this one.
        raise ConfigurationError(f"visibility must be positive, not {visibility}")
    rows = await _claim_rows(
        db, relay, batch=batch, visibility=visibility, after_tenant=after_tenant
    )
    return _bury(rows)


@twin(routed.outbox_claim)
async def _claim_rows(
    db: _db.Executor,
    owner: str,
    *,
    batch: int,
    visibility: timedelta,
    after_tenant: uuid.UUID | None,
) -> list[_db.Record]:
    """Due messages of every tenant in one statement (on Citus: tenant by tenant, from
    the one after ``after_tenant``; here the statement needs no walk)."""
    return await _db.fetch_many(
        db, _Q["outbox_claim"], lease_owner=owner, batch=batch, visibility=visibility
    )


def _bury(rows: Sequence[_db.Record]) -> tuple[list[OutboxMessage], int]:
    """The claimed messages among ``rows``, and how many were buried (each logged)."""
    claimed: list[OutboxMessage] = []
    for r in rows:
        if not r["buried"]:
            claimed.append(OutboxMessage.from_record(r))
            continue
        log.error(
            "message %s (%s) is dead: no outcome recorded for attempt %d of %d"
            " (its relay stopped or lost the claim mid-publish)",
            r["id"], r["topic"], r["attempts"], r["max_attempts"],
        )  # fmt: skip
    return claimed, len(rows) - len(claimed)


async def mark_delivered(db: _db.Executor, messages: Sequence[OutboxMessage]) -> set[uuid.UUID]:
    """Mark claimed messages delivered, in one statement; return the ids marked.

    An id missing from the result was no longer held by this relay (its
    visibility ran out and another relay claimed it): that relay will publish
    it again and the consumer's inbox absorbs the duplicate.
    """
    if not messages:
        return set()
    rows = await _delivered(
        db,
        [m.tenant_id for m in messages],
        [m.id for m in messages],
        [m.lease_token for m in messages],
    )
    return {r["id"] for r in rows}


@twin(routed.outbox_delivered)
async def _delivered(
    db: _db.Executor,
    tenant_ids: Sequence[uuid.UUID],
    ids: Sequence[uuid.UUID],
    tokens: Sequence[int],
) -> list[_db.Record]:
    """Every message still held by its lease token, marked in one statement (on Citus:
    one statement per tenant)."""
    return await _db.fetch_many(
        db, _Q["outbox_mark_delivered"], tenant_ids=tenant_ids, ids=ids, lease_tokens=tokens
    )


async def deliver_and_claim(
    db: _db.Executor,
    relay: str,
    delivered: Sequence[OutboxMessage],
    *,
    batch: int = 100,
    visibility: timedelta = timedelta(seconds=30),
    after_tenant: uuid.UUID | None = None,
) -> tuple[set[uuid.UUID], list[OutboxMessage]]:
    """:func:`mark_delivered` then :func:`claim`, in one statement on plain Postgres.

    For a relay under load: the batch it published is marked and the next
    one leased in one round trip and one commit. Each mark is fenced by its
    lease token as :func:`mark_delivered`'s; the claim is :func:`claim`'s
    (burying what used its attempts) and never takes a message being marked.
    On a Citus schema the two run one after the other (each routed tenant by
    tenant).

    Returns:
        the ids marked (see :func:`mark_delivered`), and the messages claimed.

    Raises:
        ConfigurationError: ``batch`` or ``visibility`` is not positive.
    """
    marked, claimed, _ = await _deliver_and_claim(
        db, relay, delivered, batch, visibility, after_tenant
    )
    return marked, claimed


async def _deliver_and_claim(
    db: _db.Executor,
    relay: str,
    delivered: Sequence[OutboxMessage],
    batch: int,
    visibility: timedelta,
    after_tenant: uuid.UUID | None,
) -> tuple[set[uuid.UUID], list[OutboxMessage], int]:
    """:func:`deliver_and_claim`, and how many due messages it buried. Raises what it
    raises."""
    if batch < 1:
        raise ConfigurationError("batch must be at least 1")
    if visibility <= timedelta(0):
        # As for claim: a lease over at once lets another relay publish the message too.
        raise ConfigurationError(f"visibility must be positive, not {visibility}")
    return await _deliver_and_claim_rows(db, relay, delivered, batch, visibility, after_tenant)


async def _deliver_then_claim(
    db: _db.Executor,
    relay: str,
    delivered: Sequence[OutboxMessage],
    batch: int,
    visibility: timedelta,
    after_tenant: uuid.UUID | None,
) -> tuple[set[uuid.UUID], list[OutboxMessage], int]:
    """Mark, then claim: on Citus each is per tenant, so there is no one statement."""
    marked = await mark_delivered(db, delivered)
    claimed, buried = await _claim(db, relay, batch, visibility, after_tenant)
    return marked, claimed, buried


@twin(_deliver_then_claim)
async def _deliver_and_claim_rows(
    db: _db.Executor,
    relay: str,
    delivered: Sequence[OutboxMessage],
    batch: int,
    visibility: timedelta,
    after_tenant: uuid.UUID | None,
) -> tuple[set[uuid.UUID], list[OutboxMessage], int]:
    """Mark and claim in one statement (``after_tenant`` only walks on Citus)."""
    rows = await _db.fetch_many(
        db,
        _Q["outbox_deliver_and_claim"],
        lease_owner=relay,
        batch=batch,
        visibility=visibility,
        tenant_ids=[m.tenant_id for m in delivered],
        ids=[m.id for m in delivered],
        lease_tokens=[m.lease_token for m in delivered],
    )
    claimed, buried = _bury([r for r in rows if not r["delivered"]])
    return {r["id"] for r in rows if r["delivered"]}, claimed, buried


@dataclass(frozen=True, slots=True)
class Failure:
    """State after a failed publish: 'pending' (due at ``next_attempt_at``) or 'dead'."""

    state: str
    attempts: int
    next_attempt_at: datetime


async def mark_failed(
    db: _db.Executor, message: OutboxMessage, error: str, *, backoff: timedelta
) -> Failure:
    """Record a failed publish: due again after ``backoff``, or dead after its last attempt.

    Raises:
        OutboxLeaseLost: this relay no longer holds the message (a :class:`LeaseLost`).
    """

    row = await _db.fetch_optional(
        db,
        _Q["outbox_mark_failed"],
        tenant_id=message.tenant_id,
        id=message.id,
        lease_token=message.lease_token,
        backoff=backoff,
        last_error=error[:TEXT_CAP],
    )
    if row is None:
        raise await _explain.outbox_mark(db, message)
    return Failure(row["state"], row["attempts"], row["next_attempt_at"])


@dataclass(frozen=True, slots=True)
class Delivery:
    """The delivery state of one message (G10): queryable, not only in logs."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    topic: str
    state: str
    attempts: int
    max_attempts: int
    next_attempt_at: datetime
    delivered_at: datetime | None
    last_error: str | None

    @classmethod
    def from_record(cls, r: _db.Record) -> Delivery:
        return cls(
            id=r["id"],
            tenant_id=r["tenant_id"],
            topic=r["topic"],
            state=r["state"],
            attempts=r["attempts"],
            max_attempts=r["max_attempts"],
            next_attempt_at=r["next_attempt_at"],
            delivered_at=r["delivered_at"],
            last_error=r["last_error"],
        )


async def get(db: _db.Executor, tenant_id: uuid.UUID, message_id: uuid.UUID) -> Delivery:
    """Return a message's delivery state.

    Raises:
        NotFound: no such message in this tenant.
    """

    r = await _db.fetch_optional(db, _Q["outbox_get"], tenant_id=tenant_id, id=message_id)
    if r is None:
        raise _explain.not_found("outbox", tenant_id, message_id)
    return Delivery.from_record(r)


async def retry(
    db: _db.Executor, tenant_id: uuid.UUID, message_id: uuid.UUID, *, actor: str
) -> Delivery:
    """Put a dead message back to pending, due now, its attempts given back (an operator's
    retry); a message that names a task gets an ``outbox.retried`` event on it naming ``actor``.

    Raises:
        NotFound: no such message in this tenant.
        InvalidTransition: the message is not dead.
    """
    r = await _retry(db, tenant_id, message_id, actor)
    if r is None:
        now = await get(db, tenant_id, message_id)  # NotFound when it is not there
        raise InvalidTransition(f"message {message_id} is {now.state}: only a dead one is retried")
    return Delivery.from_record(r)


@twin(routed.outbox_retry)
async def _retry(
    db: _db.Executor, tenant_id: uuid.UUID, message_id: uuid.UUID, actor: str
) -> _db.Record | None:
    """The retry's write and its event; ``None``: outbox_retry's zero rows."""
    return await _db.fetch_optional(
        db, _Q["outbox_retry"], tenant_id=tenant_id, id=message_id, actor_id=actor
    )
