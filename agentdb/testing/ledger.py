"""Assertions that read agentdb's ledger: tasks, operations, events, outbox, inbox.

Each one reads the rows it judges, returns them when the assertion holds, and
otherwise raises :class:`LedgerAssertion` (an ``AssertionError``) whose message
shows the rows that are actually there - not only "expected 1, got 0".
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentdb import _db
from agentdb.models import Operation, Task

__all__ = [
    "LedgerAssertion",
    "assert_events",
    "assert_inbox",
    "assert_operation",
    "assert_outbox",
    "assert_tasks",
]

Row = dict[str, Any]

_TASKS = (
    "SELECT * FROM agent_tasks WHERE ($1::text IS NULL OR task_type = $1)"
    " AND ($2::uuid IS NULL OR tenant_id = $2) ORDER BY created_at, id"
)
_OPERATIONS = (
    "SELECT * FROM agent_operations WHERE ($1::uuid IS NULL OR tenant_id = $1)"
    " ORDER BY created_at, id"
)
_EVENTS = (
    "SELECT id, event_type, from_state, to_state, operation_id, actor_id, payload::text AS payload"
    " FROM agent_events WHERE task_id = $1 ORDER BY id"
)
_OUTBOX = (
    "SELECT id, tenant_id, task_id, topic, state, attempts, payload::text AS payload"
    " FROM agent_outbox WHERE ($1::uuid IS NULL OR tenant_id = $1) ORDER BY created_at, id"
)
_INBOX = (
    "SELECT tenant_id, consumer, message_id, processed_at FROM agent_inbox"
    " WHERE ($1::uuid IS NULL OR tenant_id = $1) ORDER BY processed_at, message_id"
)


class LedgerAssertion(AssertionError):
    """The ledger does not hold what the test expected; the message shows what it holds."""


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "  (no rows)"
    cells = [[str(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(columns))]
    lines += ["  " + "  ".join(v.ljust(widths[i]) for i, v in enumerate(row)) for row in cells]
    return "\n".join(lines)


def _fail(what: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> LedgerAssertion:
    return LedgerAssertion(f"{what}; the ledger holds:\n{_table(rows, columns)}")


def _count_ok(found: int, count: int | None) -> bool:
    return found >= 1 if count is None else found == count


def _expected(count: int | None) -> str:
    return "at least one" if count is None else f"exactly {count}"


async def assert_tasks(
    db: _db.Executor,
    state: str,
    *,
    count: int | None = None,
    task_type: str | None = None,
    tenant: uuid.UUID | None = None,
) -> list[Task]:
    """The tasks (of ``task_type``, of ``tenant``) in ``state``: ``count`` of them, or at least one.

    Raises:
        LedgerAssertion: another number; the message lists every task of that
            type and tenant, with its state, attempts and last error.
    """
    rows = await db.fetch(_TASKS, task_type, tenant)
    everything = [Task.from_record(r) for r in rows]
    found = [t for t in everything if t.state == state]
    if not _count_ok(len(found), count):
        scope = f" of type {task_type!r}" if task_type else ""
        raise _fail(
            f"expected {_expected(count)} task(s){scope} in state {state!r}, found {len(found)}",
            [vars_of(t) for t in everything],
            ("id", "task_type", "state", "attempts", "current_step", "last_error"),
        )
    return found


async def assert_operation(
    db: _db.Executor,
    idempotency_key: str,
    *,
    outcome: str = "succeeded",
    tenant: uuid.UUID | None = None,
) -> Operation:
    """The one operation of ``idempotency_key`` (in ``tenant``), in state ``outcome``.

    Raises:
        LedgerAssertion: no such operation, more than one (in several tenants), or
            another state; the message lists every operation (of the tenant).
    """
    everything = [Operation.from_record(r) for r in await db.fetch(_OPERATIONS, tenant)]
    found = [o for o in everything if o.idempotency_key == idempotency_key]
    if len(found) != 1 or found[0].state != outcome:
        states = ", ".join(o.state for o in found) or "none"
        raise _fail(
            f"expected one operation with key {idempotency_key!r} in state {outcome!r},"
            f" found: {states}",
            [vars_of(o) for o in everything],
            ("idempotency_key", "action", "state", "attempts", "provider_reference", "error"),
        )
    return found[0]


async def assert_events(
    db: _db.Executor, task_id: uuid.UUID, types: Sequence[str] | None = None
) -> list[Row]:
    """The task's audit events (its operations' included), oldest first; exactly ``types``
    in that order when given, else at least one.

    Raises:
        LedgerAssertion: other events; the message lists them.
    """
    rows = [dict(r) for r in await db.fetch(_EVENTS, task_id)]
    got = [r["event_type"] for r in rows]
    if (types is not None and got != list(types)) or (types is None and not rows):
        want = "at least one event" if types is None else f"events {list(types)}"
        raise _fail(
            f"expected {want} for task {task_id}, got {got}",
            rows,
            ("event_type", "from_state", "to_state", "operation_id", "actor_id", "payload"),
        )
    return rows


async def assert_outbox(
    db: _db.Executor,
    topic: str,
    *,
    count: int | None = None,
    state: str | None = None,
    payload: Mapping[str, Any] | None = None,
    tenant: uuid.UUID | None = None,
) -> list[Row]:
    """Outbox messages on ``topic`` (in ``state``, whose payload contains ``payload``):
    ``count`` of them, or at least one. Payloads come back decoded.

    Raises:
        LedgerAssertion: another number; the message lists every outbox message.
    """
    rows = [dict(r) for r in await db.fetch(_OUTBOX, tenant)]
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    found = [
        r
        for r in rows
        if r["topic"] == topic
        and (state is None or r["state"] == state)
        and (payload is None or payload.items() <= r["payload"].items())
    ]
    if not _count_ok(len(found), count):
        what = f"on topic {topic!r}" + (f" in state {state!r}" if state else "")
        what += f" with payload {dict(payload)}" if payload is not None else ""
        raise _fail(
            f"expected {_expected(count)} outbox message(s) {what}, found {len(found)}",
            rows,
            ("id", "topic", "state", "attempts", "payload"),
        )
    return found


async def assert_inbox(
    db: _db.Executor,
    consumer: str,
    *,
    count: int | None = None,
    message_ids: Sequence[uuid.UUID] | None = None,
    tenant: uuid.UUID | None = None,
) -> list[Row]:
    """What ``consumer`` recorded in the inbox: ``count`` messages (or at least one), and
    exactly ``message_ids`` when given.

    Raises:
        LedgerAssertion: otherwise; the message lists every inbox row.
    """
    rows = [dict(r) for r in await db.fetch(_INBOX, tenant)]
    found = [r for r in rows if r["consumer"] == consumer]
    ids_ok = message_ids is None or {r["message_id"] for r in found} == set(message_ids)
    if not _count_ok(len(found), count) or not ids_ok:
        want = (
            _expected(count) if message_ids is None else f"messages {sorted(map(str, message_ids))}"
        )
        raise _fail(
            f"expected {want} in the inbox of consumer {consumer!r}, found {len(found)}",
            rows,
            ("consumer", "message_id", "tenant_id", "processed_at"),
        )
    return found


def vars_of(row: Task | Operation) -> Row:
    """A row dataclass as a dict (they have slots, so no ``__dict__``)."""
    return {name: getattr(row, name) for name in row.__dataclass_fields__}
