"""Tasks: create, read and move them through their lifecycle (G1, G3, G4, G6, G7, G8).

Every write is one statement: the state change, its audit event and any
outbox messages commit together or not at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from agentdb import _exec, telemetry
from agentdb._json import EVENT_PAYLOAD_CAP, OBJECT_CAP, document
from agentdb.errors import (
    AgentDBError,
    ConfigurationError,
    IdempotencyConflict,
    LeaseLost,
    NotFound,
    StaleVersion,
)
from agentdb.hashing import input_hash
from agentdb.models import Lease, Message, Task
from agentdb.redaction import redact

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_ATTEMPTS",
    "complete_many",
    "create",
    "get",
    "transition",
    "wait_until",
    "wake",
]

DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_LEASE_TTL = timedelta(minutes=5)
_Q = _exec.QUERIES
_UNSET: Any = object()


async def create(
    db: _exec.Executor,
    tenant_id: uuid.UUID,
    task_type: str,
    *,
    params: Mapping[str, Any] | None = None,
    workflow_version: str = "1",
    dedupe_key: str | None = None,
    wake_at: datetime | None = None,
    waiting: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    trace_id: str | None = None,
    span_id: str | None = None,
    actor: str = "agentdb",
    task_id: uuid.UUID | None = None,
) -> Task:
    """Create a task (pending, or ``waiting`` until ``wake_at``) and its creation event.

    With ``dedupe_key``, a retried request is answered with the task the first
    one created (``task.created`` is then false) - provided it carries the same
    ``params``; different params under the same key raise (G4).

    Raises:
        IdempotencyConflict: ``dedupe_key`` was already used with other params.
        PayloadTooLarge: ``params`` is over 64 KiB.
        ConfigurationError: ``params`` is not JSON data.
        TenantMismatch: ``tenant_id`` names no tenant.
        InvariantViolation: another CHECK refused a value (named in the error).
    """
    body = document(params or {}, cap=OBJECT_CAP, what="task params")
    digest = input_hash(dict(params or {})) if dedupe_key is not None else None
    new_id = task_id or uuid.uuid4()
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    args = (
        tenant_id, new_id, task_type, workflow_version, "waiting" if waiting else "pending",
        body, dedupe_key, digest, wake_at, max_attempts, lease_ttl, trace_id, span_id, actor,
    )  # fmt: skip

    async def race() -> AgentDBError:
        return _exec.Rerun("a concurrent create of the same dedupe key is still settling")

    row = await _exec.fetch_one(db, _Q["task_create"], *args, on_zero=race, reruns=2)
    task = Task.from_record(row, created=row["created"])
    if not task.created and task.input_hash != digest:
        raise IdempotencyConflict(
            f"dedupe key {dedupe_key!r} was used for a task with different params",
            tenant_id=tenant_id,
            key=dedupe_key or "",
            stored_hash=task.input_hash or "",
            given_hash=digest or "",
        )
    return task


async def get(db: _exec.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task:
    """Return one task.

    Raises:
        NotFound: no such task in this tenant.
    """

    async def missing() -> AgentDBError:
        return NotFound(f"task {task_id} not found", entity="task", tenant_id=tenant_id, id=task_id)

    return Task.from_record(
        await _exec.fetch_one(db, _Q["task_get"], tenant_id, task_id, on_zero=missing)
    )


async def explain_stale_task(
    db: _exec.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    expected: int | None,
    lease: Lease | None,
) -> AgentDBError:
    """Say why a write to a task matched no row (runs only on that failure path)."""
    rows = await _exec.fetch_many(db, _Q["lease_check"], tenant_id, task_id)
    if not rows:
        return NotFound(f"task {task_id} not found", entity="task", tenant_id=tenant_id, id=task_id)
    now = rows[0]
    if lease is not None and (
        now["state"] != "running"
        or now["lease_owner"] != lease.owner
        or now["lease_token"] != lease.token
    ):
        return LeaseLost(
            f"lease {lease.token} of {lease.owner} on task {task_id} is gone "
            f"(now: {now['state']}, owner {now['lease_owner']}, token {now['lease_token']})",
            entity="task",
            tenant_id=tenant_id,
            id=task_id,
            owner=lease.owner,
            token=lease.token,
            current_owner=now["lease_owner"],
            current_token=now["lease_token"],
        )
    return StaleVersion(
        f"task {task_id} is at state_version {now['state_version']}, not {expected}",
        entity="task",
        tenant_id=tenant_id,
        id=task_id,
        expected=expected if expected is not None else -1,
        actual=now["state_version"],
        actual_state=now["state"],
    )


async def transition(
    db: _exec.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    *,
    expected_version: int,
    to_state: str,
    step: str | None = _UNSET,
    wake_at: datetime | None = None,
    error: str | None = None,
    lease: Lease | None = None,
    event_type: str | None = None,
    actor: str | None = None,
    payload: Mapping[str, Any] | None = None,
    outbox: Iterable[Message] = (),
    trace_id: str | None = None,
    span_id: str | None = None,
) -> Task:
    """Move a task to ``to_state`` if it is still at ``expected_version`` - one round trip.

    Writes the audit event (``event_type``, default ``task.<to_state>``;
    ``payload`` redacted by :mod:`agentdb.redaction`) and the ``outbox``
    messages in the same statement. Trace ids default to the current
    OpenTelemetry span's, else the task's. A lease holder passes its
    ``lease``: the write then also requires that lease to be current (G12).
    ``to_state`` may equal the current state to record progress (``step``).
    The event's actor is ``actor``, else the lease owner, else ``"agentdb"``.

    Raises:
        StaleVersion: another writer moved the task on; reload it.
        LeaseLost: ``lease`` was taken over; stop working on the task.
        NotFound: no such task in this tenant.
        InvalidTransition: ``to_state`` is not reachable from the current state.
        PayloadTooLarge / SecretInPayload: the event payload was refused (G9).
    """
    messages = list(outbox)
    event_body = document(redact(payload or {}), cap=EVENT_PAYLOAD_CAP, what="event payload")
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    bodies = [
        document(m.payload, cap=OBJECT_CAP, what=f"outbox payload for {m.topic}") for m in messages
    ]

    async def stale() -> AgentDBError:
        return await explain_stale_task(db, tenant_id, task_id, expected_version, lease)

    row = await _exec.fetch_one(
        db,
        _Q["task_transition"],
        tenant_id,
        task_id,
        expected_version,
        to_state,
        step is not _UNSET,
        None if step is _UNSET else step,
        wake_at,
        error,
        lease.owner if lease else None,
        lease.token if lease else None,
        event_type or f"task.{to_state}",
        actor or (lease.owner if lease else "agentdb"),
        event_body,
        [m.id for m in messages],
        [m.topic for m in messages],
        bodies,
        trace_id,
        span_id,
        on_zero=stale,
    )
    return Task.from_record(row)


async def wait_until(
    db: _exec.Executor,
    task: Task,
    wake_at: datetime,
    *,
    lease: Lease | None = None,
    step: str | None = _UNSET,
) -> Task:
    """Put a task to sleep until ``wake_at`` (state ``waiting``); a claim picks it up then.

    Raises:
        as :func:`transition`.
    """
    return await transition(
        db, task.tenant_id, task.id, expected_version=task.state_version, to_state="waiting",
        wake_at=wake_at, lease=lease, step=step,
    )  # fmt: skip


async def wake(db: _exec.Executor, task: Task) -> Task:
    """Make a waiting task due now (state ``pending``).

    Raises:
        as :func:`transition`.
    """
    return await transition(
        db, task.tenant_id, task.id, expected_version=task.state_version, to_state="pending"
    )


# Batched completion. A worker that finishes tasks one statement at a time is
# bound by Python client CPU (round trips), not by Postgres; finishing a whole
# claimed batch in one statement and one commit is what lets it keep up with
# queues that batch their acknowledgements (see ``agentdb bench``).

_FINISHED_STATES = ("succeeded", "failed", "cancelled", "dead")


async def complete_many(
    db: _exec.Executor,
    claimed: Iterable[Task],
    *,
    to_state: str = "succeeded",
    error: str | None = None,
    event_type: str | None = None,
    actor: str | None = None,
    payload: Mapping[str, Any] | None = None,
    outbox: Mapping[uuid.UUID, Iterable[Message]] | None = None,
) -> list[Task | AgentDBError]:
    """Finish many claimed tasks in one statement; return one result per task, in input order.

    Each task is fenced as in :func:`transition` with its lease: it moves from
    'running' to ``to_state`` only if it is still at the ``state_version`` it
    carries and still under the lease (owner + token) it was claimed with. For
    every task finished, its event (``event_type``, default
    ``task.<to_state>``, actor ``actor`` else the lease owner, ``payload``
    redacted and shared by the batch) and its ``outbox[task.id]`` messages are
    written in the same statement; the lease is dropped.

    A refused task is not finished and nothing is written for it - no state
    change, no event, none of its outbox messages. Its slot in the result
    holds the typed error :func:`transition` would have raised, *returned*
    rather than raised so the rest of the batch still commits; only on that
    path is the row read again to say why:

    * :class:`LeaseLost` - the lease was taken over (another worker reclaimed
      the task after it expired) or the task left 'running': drop the work;
    * :class:`StaleVersion` - another writer moved the task on under this lease;
    * :class:`NotFound` - no such task in its tenant.

    Returns:
        for each task of ``claimed``, the finished :class:`Task` or the error
        saying why it was refused - never a silent gap.

    Raises:
        ConfigurationError: a task holds no lease (it was not claimed), a task
            appears twice, ``to_state`` is not a finished state, or ``outbox``
            names a task that is not in ``claimed``.
        InvalidTransition, PayloadTooLarge, SecretInPayload: the statement was
            refused as a whole; nothing was written for any task.
    """
    # Imported here so this appended section needs no change to the module header.
    if to_state not in _FINISHED_STATES:
        raise ConfigurationError(
            f"complete_many finishes tasks: to_state must be one of {', '.join(_FINISHED_STATES)}"
        )
    batch = list(claimed)
    if not batch:
        return []
    held: list[Lease] = []
    position: dict[uuid.UUID, int] = {}
    for i, task in enumerate(batch, start=1):
        lease = task.lease
        if lease is None:
            raise ConfigurationError(f"task {task.id} holds no lease; claim it before finishing it")
        if task.id in position:
            raise ConfigurationError(f"task {task.id} appears twice in one complete_many call")
        position[task.id] = i
        held.append(lease)
    ords: list[int] = []
    ids: list[uuid.UUID] = []
    topics: list[str] = []
    bodies: list[str | None] = []
    for task_id, messages in (outbox or {}).items():
        pos = position.get(task_id)
        if pos is None:
            raise ConfigurationError(f"outbox names task {task_id}, which is not in the batch")
        for m in messages:
            ords.append(pos)
            ids.append(m.id)
            topics.append(m.topic)
            bodies.append(document(m.payload, cap=OBJECT_CAP, what=f"outbox payload for {m.topic}"))
    event_body = document(redact(payload or {}), cap=EVENT_PAYLOAD_CAP, what="event payload")
    rows = await _exec.fetch_many(
        db,
        _Q["task_complete_many"],
        [t.tenant_id for t in batch],
        [t.id for t in batch],
        [t.state_version for t in batch],
        [lease.owner for lease in held],
        [lease.token for lease in held],
        to_state,
        error,
        event_type or f"task.{to_state}",
        actor,
        event_body,
        ords,
        ids,
        topics,
        bodies,
    )
    done = {r["ord"]: Task.from_record(r) for r in rows}
    results: list[Task | AgentDBError] = []
    for i, (task, lease) in enumerate(zip(batch, held, strict=True), start=1):
        finished = done.get(i)
        if finished is None:
            results.append(
                await explain_stale_task(db, task.tenant_id, task.id, task.state_version, lease)
            )
        else:
            results.append(finished)
    return results
