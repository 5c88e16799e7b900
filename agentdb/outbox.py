"""Outbox: messages that commit with the business transaction, delivered by a relay (G10, G11).

:func:`enqueue` runs on the caller's connection inside the caller's
transaction. The relay side - :func:`claim`, publish (outside any
transaction), :func:`mark_delivered` / :func:`mark_failed` - may publish a
message twice (a crash after publishing, before marking); consumers dedupe on
the stable message id with :mod:`agentdb.inbox`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentdb import _exec, telemetry
from agentdb._json import OBJECT_CAP, document
from agentdb.errors import AgentDBError, ConfigurationError, LeaseLost, NotFound
from agentdb.models import OutboxMessage

__all__ = ["Delivery", "Failure", "claim", "enqueue", "get", "mark_delivered", "mark_failed"]

_Q = _exec.QUERIES


async def enqueue(
    conn: _exec.Conn,
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
        TenantMismatch: the tenant or task does not exist (in this tenant).
    """
    body = document(payload or {}, cap=OBJECT_CAP, what=f"outbox payload for {topic}")
    mid = message_id or uuid.uuid4()
    trace_id, span_id = telemetry.ids(trace_id, span_id)

    async def never() -> AgentDBError:
        return AgentDBError("outbox_enqueue returned no row")

    row = await _exec.fetch_one(
        conn, _Q["outbox_enqueue"], tenant_id, mid, task_id, topic, body, max_attempts,
        trace_id, span_id, on_zero=never,
    )  # fmt: skip
    return uuid.UUID(str(row["id"]))


async def claim(
    db: _exec.Executor,
    relay: str,
    *,
    batch: int = 100,
    visibility: timedelta = timedelta(seconds=30),
) -> list[OutboxMessage]:
    """Lease up to ``batch`` due messages to ``relay`` for ``visibility``.

    Raises:
        ConfigurationError: ``batch`` is not positive.
    """
    if batch < 1:
        raise ConfigurationError("batch must be at least 1")
    rows = await _exec.fetch_many(db, _Q["outbox_claim"], relay, batch, visibility)
    return [OutboxMessage.from_record(r) for r in rows]


async def mark_delivered(db: _exec.Executor, messages: Sequence[OutboxMessage]) -> set[uuid.UUID]:
    """Mark claimed messages delivered, in one statement; return the ids marked.

    An id missing from the result was no longer held by this relay (its
    visibility ran out and another relay claimed it): that relay will publish
    it again and the consumer's inbox absorbs the duplicate.
    """
    if not messages:
        return set()
    rows = await _exec.fetch_many(
        db,
        _Q["outbox_mark_delivered"],
        [m.tenant_id for m in messages],
        [m.id for m in messages],
        [m.lease_token for m in messages],
    )
    return {r["id"] for r in rows}


@dataclass(frozen=True, slots=True)
class Failure:
    """State after a failed publish: 'pending' (due at ``next_attempt_at``) or 'dead'."""

    state: str
    attempts: int
    next_attempt_at: datetime


async def mark_failed(
    db: _exec.Executor, message: OutboxMessage, error: str, *, backoff: timedelta
) -> Failure:
    """Record a failed publish: due again after ``backoff``, or dead after its last attempt.

    Raises:
        LeaseLost: this relay no longer holds the message.
    """

    async def lost() -> AgentDBError:
        return LeaseLost(
            f"outbox message {message.id} is no longer held by this relay",
            entity="outbox",
            tenant_id=message.tenant_id,
            id=message.id,
            owner="relay",
            token=message.lease_token,
            current_owner=None,
            current_token=None,
        )

    row = await _exec.fetch_one(
        db, _Q["outbox_mark_failed"], message.tenant_id, message.id, message.lease_token,
        backoff, error[:4000], on_zero=lost,
    )  # fmt: skip
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


async def get(db: _exec.Executor, tenant_id: uuid.UUID, message_id: uuid.UUID) -> Delivery:
    """Return a message's delivery state.

    Raises:
        NotFound: no such message in this tenant.
    """

    async def missing() -> AgentDBError:
        return NotFound(
            f"outbox message {message_id} not found",
            entity="outbox",
            tenant_id=tenant_id,
            id=message_id,
        )

    r = await _exec.fetch_one(db, _Q["outbox_get"], tenant_id, message_id, on_zero=missing)
    return Delivery(
        r["id"], r["tenant_id"], r["topic"], r["state"], r["attempts"], r["max_attempts"],
        r["next_attempt_at"], r["delivered_at"], r["last_error"],
    )  # fmt: skip
