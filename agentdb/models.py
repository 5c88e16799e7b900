"""Rows as frozen dataclasses. Built from statement results; never written back directly.

Rows live here; a result that belongs to one call (``leases.Release``,
``outbox.Failure``, ``tenancy.TenantDeletion``, ...) lives next to the function
that returns it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from agentdb._ids import new_id

__all__ = ["Lease", "Message", "Operation", "OutboxMessage", "Reservation", "Signal", "Task"]


_T = TypeVar("_T")


class Row(Protocol):
    """What a statement returns per row (an asyncpg Record)."""

    def __getitem__(self, key: str, /) -> Any: ...


def _json(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        # jsonb holds integers of any length; Python refuses to read one over
        # 4,300 digits (sys.get_int_max_str_digits). One such row, written by
        # SQL of someone's own, must not fail every row read with it (a relay's
        # whole claimed batch): it reads as an exact Decimal instead.
        return json.loads(value, parse_int=Decimal)


_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def _build(cls: type[_T], r: Row, json_fields: tuple[str, ...], **extra: Any) -> _T:
    """Build a row dataclass from a record: same names, jsonb columns decoded."""
    names = _FIELDS.get(cls)
    if names is None:  # dataclasses.fields() is slow enough to matter per row
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    values = {
        name: _json(r[name]) if name in json_fields else r[name]
        for name in names
        if name not in extra
    }
    return cls(**values, **extra)


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's temporary ownership of a task (G12). ``token`` is the fence."""

    tenant_id: uuid.UUID
    task_id: uuid.UUID
    owner: str
    token: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Task:
    """One row of ``agent_tasks``.

    ``created`` is true only on the :func:`agentdb.tasks.create` call that
    inserted the row (false when a dedupe key returned an existing task).
    """

    id: uuid.UUID
    tenant_id: uuid.UUID
    task_type: str
    workflow_version: str
    state: str
    state_version: int
    current_step: str | None
    wake_at: datetime | None
    dedupe_key: str | None
    input_hash: str | None
    params: dict[str, Any]
    attempts: int
    max_attempts: int
    last_error: str | None
    lease_ttl: timedelta
    lease_owner: str | None
    lease_token: int
    lease_acquired_at: datetime | None
    lease_expires_at: datetime | None
    #: after it, nothing keeps the task alive (G21): not claimed, not finished; swept to dead.
    deadline_at: datetime | None
    trace_id: str | None
    span_id: str | None
    created_at: datetime
    updated_at: datetime
    created: bool = False

    @classmethod
    def from_record(cls, r: Row, *, created: bool = False) -> Task:
        return _build(cls, r, ("params",), created=created)

    @property
    def lease(self) -> Lease | None:
        """The lease on this row as read, or ``None`` when the task is not running."""
        if self.lease_owner is None or self.lease_expires_at is None:
            return None
        return Lease(
            self.tenant_id, self.id, self.lease_owner, self.lease_token, self.lease_expires_at
        )


@dataclass(frozen=True, slots=True)
class Operation:
    """One row of ``agent_operations``."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    task_id: uuid.UUID
    idempotency_key: str
    action: str
    input_hash: str
    state: str
    state_version: int
    provider_reference: str | None
    result: Any
    error: str | None
    attempts: int
    trace_id: str | None
    span_id: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_record(cls, r: Row) -> Operation:
        return _build(cls, r, ("result",))


@dataclass(frozen=True, slots=True)
class Reservation:
    """What :func:`agentdb.operations.reserve` decided.

    ``fresh`` is true when this caller now holds the reservation and must
    call the provider (then ``complete`` / ``fail``); false when the key's
    earlier attempt already succeeded (or failed, with ``retry_failed=False``)
    and ``operation.result`` / ``operation.error`` is the answer - do not call
    the provider again.
    """

    operation: Operation
    fresh: bool


@dataclass(frozen=True, slots=True)
class Message:
    """An outbox message to write together with a state change."""

    topic: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    id: uuid.UUID = field(default_factory=new_id)


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A message claimed by a relay. ``id`` is the stable message id (G11)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    task_id: uuid.UUID | None
    topic: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_token: int
    trace_id: str | None
    span_id: str | None
    created_at: datetime

    @classmethod
    def from_record(cls, r: Row) -> OutboxMessage:
        return _build(cls, r, ("payload",))


@dataclass(frozen=True, slots=True)
class Signal:
    """One row of ``agent_signals`` (G22): a signal, or an approval with its ``decision``.

    ``seq`` is its place in the task's order (1, 2, ...), given by the
    database. ``created`` is false when a dedupe key answered with a signal
    recorded earlier.
    """

    id: uuid.UUID
    tenant_id: uuid.UUID
    task_id: uuid.UUID
    seq: int
    name: str
    kind: str
    decision: str | None
    payload: dict[str, Any]
    sender: str
    dedupe_key: str | None
    input_hash: str | None
    created_at: datetime
    created: bool = False

    @classmethod
    def from_record(cls, r: Row, *, created: bool = False) -> Signal:
        return _build(cls, r, ("payload",), created=created)


@dataclass(frozen=True, slots=True)
class Schedule:
    """One row of ``agent_schedules`` (G24): a task to create on each tick of a rule.

    ``every`` (an interval) or ``cron`` (five fields, UTC) is the rule;
    ``next_tick_at`` the first tick not fired yet. ``created`` is false when
    :func:`agentdb.schedules.create` answered with the schedule of that name.
    """

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    task_type: str
    workflow_version: str
    params: dict[str, Any]
    every: timedelta | None
    cron: str | None
    anchor: datetime
    catch_up: str
    task_deadline: timedelta | None
    paused: bool
    next_tick_at: datetime
    last_tick_at: datetime | None
    created_at: datetime
    updated_at: datetime
    created: bool = False

    @classmethod
    def from_record(cls, r: Row, *, created: bool = False) -> Schedule:
        return _build(cls, r, ("params",), created=created)
