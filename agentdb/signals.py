"""Signals and approvals: facts sent to a task, delivered once and in order (G22).

A signal is recorded by the database in the task's own order (``seq``, 1,
2, ...), written to the audit trail (event ``task.signalled``, or
``task.approved`` / ``task.rejected`` for an approval, actor the sender) and,
when the task is waiting for that name (:func:`agentdb.tasks.wait_for_signal`,
or a handler's ``Wait(signal=...)``), wakes it in the same transaction. The
task reads what it has not read yet (:func:`unread`, ``Job.signals()``), and
its wait moves its cursor past what it read: a signal read is never read
again, and none is skipped.

The database refuses a signal to a finished task (:class:`TaskFinished`) or
to one past its deadline (:class:`DeadlineExceeded`), an approval by the
task's past or present lease holder (:class:`SignalRuleViolation`), any
signal outside READ COMMITTED (:class:`SignalIsolationViolation`), any approval from
the ``agentdb_agent`` role (row-level security), and a signal to another
tenant's task (:class:`NotFound` here, the composite foreign key beneath).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

from agentdb import _db, _explain
from agentdb._db.jsonb import OBJECT_CAP, document
from agentdb._ids import new_id
from agentdb.errors import ConfigurationError, IdempotencyConflict, TenantMismatch, TransientError
from agentdb.hashing import input_hash
from agentdb.models import Signal

__all__ = ["DECISIONS", "approve", "received", "signal", "unread"]

#: What an approval decides.
DECISIONS: Final = ("approved", "rejected")
_Q = _db.queries(__name__)
# A send loses a race when a concurrent send of the same key commits between
# its look-up and its insert: the next look-up sees it.
_RACE_RERUNS = 3


async def signal(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    name: str,
    payload: Mapping[str, Any] | None = None,
    *,
    dedupe_key: str | None = None,
    sender: str = "agentdb",
) -> Signal:
    """Send signal ``name`` with ``payload`` to a task; return it with its ``seq``.

    With ``dedupe_key``, a retried send is answered with the signal the first
    one recorded (``created`` false) - provided it says the same thing (name,
    payload, sender); anything else under the same key raises (G4).

    Raises:
        NotFound: no such task in this tenant.
        TaskFinished: the task has finished; it takes no more signals.
        DeadlineExceeded: the task passed its deadline.
        IdempotencyConflict: ``dedupe_key`` recorded a different signal.
        PayloadTooLarge / ConfigurationError: ``payload`` is over 64 KiB / not JSON data.
        SignalIsolationViolation: run in a REPEATABLE READ or SERIALIZABLE transaction.
        InvariantViolation: a name or sender out of bounds (the CHECK is named).
    """
    return await _send(db, tenant_id, task_id, name, payload, "signal", None, sender, dedupe_key)


async def approve(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    *,
    approver: str,
    decision: str = "approved",
    comment: str | None = None,
    name: str = "approval",
    dedupe_key: str | None = None,
) -> Signal:
    """Record ``approver``'s ``decision`` ("approved" or "rejected") on a task, as signal ``name``.

    An approval is a signal (delivered, ordered and deduplicated the same way)
    with the approver as sender, in the audit trail as ``task.approved`` or
    ``task.rejected``. The database refuses it from anyone who holds or held
    the task's lease (``approver`` against its claim events), and from the
    ``agentdb_agent`` role altogether: an agent does not approve its own work.
    ``approver`` is what the caller says: two services that connect as one
    role are told apart only by what they pass here.

    Raises:
        ConfigurationError: ``decision`` is not one of :data:`DECISIONS`.
        SignalRuleViolation: ``approver`` holds or held the task's lease.
        as :func:`signal` otherwise.
    """
    if decision not in DECISIONS:
        raise ConfigurationError(
            f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}"
        )
    payload = {} if comment is None else {"comment": comment}
    return await _send(db, tenant_id, task_id, name, payload, "approval", decision, approver,
                       dedupe_key)  # fmt: skip


async def received(
    db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID, *, after: int = 0
) -> list[Signal]:
    """A task's signals after ``seq`` ``after``, in order - from 0, all it was ever sent."""
    rows = await _db.fetch_many(
        db, _Q["signal_list"], tenant_id=tenant_id, task_id=task_id, after=after
    )
    return [Signal.from_record(r) for r in rows]


async def unread(db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[Signal]:
    """The signals a task has not read yet (after its cursor), in order.

    Reading moves nothing: the task's next wait (``signals_read=``) does.
    """
    rows = await _db.fetch_many(db, _Q["signal_unread"], tenant_id=tenant_id, task_id=task_id)
    return [Signal.from_record(r) for r in rows]


async def _send(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    name: str,
    payload: Mapping[str, Any] | None,
    kind: str,
    decision: str | None,
    sender: str,
    dedupe_key: str | None,
) -> Signal:
    body = document(payload or {}, cap=OBJECT_CAP, what=f"payload of signal {name!r}")
    digest = None
    if dedupe_key is not None:
        digest = input_hash(
            {"name": name, "kind": kind, "decision": decision, "sender": sender,
             "payload": dict(payload or {})}
        )  # fmt: skip
    key = {"tenant_id": tenant_id, "task_id": task_id, "dedupe_key": dedupe_key}
    for _ in range(_RACE_RERUNS):
        # A replay is answered before the insert, whose triggers would refuse
        # it once the task has finished: the first send's answer stands.
        row = None
        if dedupe_key is not None:
            row = await _db.fetch_optional(db, _Q["signal_by_key"], **key)
        if row is not None:
            found = Signal.from_record(row)
            if found.input_hash != digest:
                raise IdempotencyConflict(
                    f"dedupe key {dedupe_key!r} recorded a different signal for task {task_id}",
                    tenant_id=tenant_id,
                    key=dedupe_key or "",
                    stored_hash=found.input_hash or "",
                    given_hash=digest or "",
                )
            return found
        try:
            row = await _db.fetch_optional(
                db, _Q["signal_insert"], **key, id=new_id(), name=name, kind=kind,
                decision=decision, payload=body, sender=sender, input_hash=digest,
            )  # fmt: skip
        except TenantMismatch as exc:
            if exc.constraint == "agent_signals_task_fkey":
                raise _explain.not_found("task", tenant_id, task_id) from exc
            raise
        if row is not None:
            return Signal.from_record(row, created=True)
    raise TransientError("a concurrent send of the same dedupe key is still settling")
