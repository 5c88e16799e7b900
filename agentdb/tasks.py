"""Tasks: create, read and move them through their lifecycle (G1, G3, G4, G6, G7, G8).

Signals and approvals to a task (G22) are :mod:`agentdb.signals`'s;
:func:`signal` and :func:`approve` are here too, beside the waits they end.

Every write is one statement: the state change, its audit event and any
outbox messages commit together or not at all.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from agentdb import _db, _explain, telemetry
from agentdb._citus import routed
from agentdb._citus.routing import distributed, twin
from agentdb._db.instant import aware
from agentdb._db.jsonb import EVENT_PAYLOAD_CAP, OBJECT_CAP, TEXT_CAP, document
from agentdb._db.wake import commits_alone, wake_listeners
from agentdb._ids import new_id
from agentdb.errors import (
    AgentDBError,
    ConfigurationError,
    DeadlineExceeded,
    IdempotencyConflict,
    InvalidTransition,
    LeaseLost,
    NotFound,
    StaleVersion,
    TransientError,
)
from agentdb.hashing import input_hash
from agentdb.models import Lease, Message, Task
from agentdb.redaction import redact
from agentdb.signals import approve, signal

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_ATTEMPTS",
    "FINISHED_STATES",
    "KEEP",
    "Step",
    "approve",
    "cancel",
    "complete_many",
    "count_unhandled",
    "create",
    "finish_many",
    "get",
    "retry",
    "signal",
    "transition",
    "wait_for_signal",
    "wait_until",
    "wake",
]

DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_LEASE_TTL = timedelta(minutes=5)
#: The states a task ends in (the claim path never picks them up again).
FINISHED_STATES: Final = ("succeeded", "failed", "cancelled", "dead")
_Q = _db.queries(__name__)
# A cancel re-reads the task when another writer moved it on in between; a
# task that keeps changing (a step per millisecond) is still cancelled within
# a few tries, and one that never stops is reported rather than chased.
_CANCEL_RERUNS = 20
# task_create and operation_reserve lose a race when a concurrent insert of
# the same key commits after their snapshot: a new statement sees it.
_RACE_RERUNS = 3


class _Keep(enum.Enum):
    KEEP = "keep"


#: ``step=KEEP`` (the default) leaves ``current_step`` as it is.
KEEP: Final = _Keep.KEEP
#: What a ``step=`` argument takes: a step name, ``None`` (clear it) or :data:`KEEP`.
Step = str | Literal[_Keep.KEEP] | None


async def create(
    db: _db.Executor,
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
    deadline: datetime | None = None,
    parent: uuid.UUID | None = None,
    child_key: str | None = None,
) -> Task:
    """Create a task (pending, or ``waiting`` until ``wake_at``) and its creation event.

    With ``parent`` and ``child_key``, a child of task ``parent`` (same tenant,
    G23; see :mod:`agentdb.children`): a retried creation of the same key
    answers with the first child, as a dedupe key does (the key is the
    child's dedupe key, so the two are not given together).

    With ``deadline`` (an aware datetime), the task must be over by then (G21):
    afterwards no claim takes it and the database refuses every write that
    would keep it alive; the sweep (:func:`agentdb.leases.expire_deadlines`,
    run by every worker) moves it to ``dead`` with a ``task.deadline_passed``
    event, dropping the lease of a worker still running it. A request answered
    from its dedupe key gets the first task as it is, deadline included.

    With ``dedupe_key``, a retried request is answered with the task the first
    one created (``task.created`` is then false) - provided it carries the same
    ``params`` and ``task_type``; another type or other params under the same key
    raise (G4).

    Raises:
        IdempotencyConflict: ``dedupe_key`` was already used for another task
            type or with other params.
        PayloadTooLarge: ``params`` is over 64 KiB.
        ConfigurationError: ``params`` is not JSON data, ``deadline`` or ``wake_at`` has no
            time zone, or ``child_key`` comes without ``parent`` or with ``dedupe_key``.
        NotFound: ``tenant_id`` names no tenant (``entity`` ``"tenant"``).
        TenantMismatch: ``parent`` names no task of the tenant.
        TaskFinished: ``parent`` has finished; it takes no new child.
        DeadlineExceeded: ``parent`` passed its deadline; it takes no new child.
        InvariantViolation: another CHECK refused a value (named in the error), such as a
            ``dedupe_key`` starting ``child/`` (reserved for child keys).
    """
    aware("deadline", deadline)
    aware("wake_at", wake_at)
    if child_key is not None:
        if parent is None or dedupe_key is not None:
            raise ConfigurationError("child_key needs parent= and stands in for dedupe_key")
        dedupe_key = f"child/{parent}/{child_key}"
    body = document(params or {}, cap=OBJECT_CAP, what="task params")
    digest = input_hash(dict(params or {})) if dedupe_key is not None else None
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    made = task_id or new_id()
    params = {
        "tenant_id": tenant_id, "id": made, "task_type": task_type,
        "workflow_version": workflow_version, "state": "waiting" if waiting else "pending",
        "params": body, "dedupe_key": dedupe_key, "input_hash": digest, "wake_at": wake_at,
        "max_attempts": max_attempts, "lease_ttl": lease_ttl, "trace_id": trace_id,
        "span_id": span_id, "actor_id": actor, "deadline_at": deadline, "parent_id": parent,
        "child_key": child_key,
        # Its own transaction: no NOTIFY inside it (it would serialise the commit
        # with every other notifier's); the listeners are woken after it instead.
        "wake_after": commits_alone(db),
    }  # fmt: skip
    for _ in range(_RACE_RERUNS):
        row = await _create(db, params)
        if row is not None:
            break
    else:
        raise TransientError("a concurrent create of the same dedupe key is still settling")
    task = Task.from_record(row, created=row["created"])
    # On Citus no trigger notifies (its writes run on the workers), and neither does this.
    if task.created and params["wake_after"] and not await distributed(db):
        await wake_listeners(db, _Q["task_wake_listeners"], "agentdb_tasks")
    if not task.created and (task.input_hash != digest or task.task_type != task_type):
        what = "params" if task.task_type == task_type else f"type ({task.task_type!r})"
        raise IdempotencyConflict(
            f"dedupe key {dedupe_key!r} was used for a task with different {what}",
            tenant_id=tenant_id,
            key=dedupe_key or "",
            stored_hash=task.input_hash or "",
            given_hash=digest or "",
        )
    return task


@twin(routed.create_task)
async def _create(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """The task and its event in one statement, or the key's holder (on Citus: the
    INSERT, then the event)."""
    return await _db.fetch_optional(db, _Q["task_create"], **params)


async def get(db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task:
    """Return one task.

    Raises:
        NotFound: no such task in this tenant.
    """
    row = await _db.fetch_optional(db, _Q["task_get"], tenant_id=tenant_id, id=task_id)
    if row is None:
        raise _explain.not_found("task", tenant_id, task_id)
    return Task.from_record(row)


async def count_unhandled(db: _db.Executor, task_types: Iterable[str]) -> list[tuple[str, int]]:
    """Due tasks whose type is not in ``task_types``, counted per type.

    A worker with only these handlers never claims them; it says so instead
    of letting them wait in silence.

    Raises:
        ConfigurationError: ``task_types`` is a string, not a list of task types.
    """
    if isinstance(task_types, str):
        raise ConfigurationError(f"task_types is a list of task types, not {task_types!r}")
    rows = await _db.fetch_many(db, _Q["task_count_unhandled"], task_types=sorted(task_types))
    return [(r["task_type"], r["n"]) for r in rows]


async def transition(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    *,
    expected_version: int,
    to_state: str,
    step: str | Literal[_Keep.KEEP] | None = KEEP,
    wake_at: datetime | None = None,
    error: str | None = None,
    lease: Lease | None = None,
    event_type: str | None = None,
    actor: str | None = None,
    payload: Mapping[str, Any] | None = None,
    outbox: Iterable[Message] = (),
    trace_id: str | None = None,
    span_id: str | None = None,
    wait_signal: str | None = None,
    signals_read: int | None = None,
    wait_children: int | None = None,
) -> Task:
    """Move a task to ``to_state`` if it is still at ``expected_version`` - one round trip.

    Writes the audit event (``event_type``, default ``task.<to_state>``;
    ``payload`` redacted by :mod:`agentdb.redaction`) and the ``outbox``
    messages in the same statement. Trace ids default to the current
    OpenTelemetry span's, else the task's. A lease holder passes its
    ``lease``: the write then also requires that lease to be current (G12).
    ``to_state`` may equal the current state to record progress (``step``;
    ``KEEP`` leaves it, ``None`` clears it). ``error`` is cut to the 4,000
    characters the column holds. The event's actor is ``actor``, else the
    lease owner, else ``"agentdb"``. A move to 'waiting' may name the signal
    it waits for (``wait_signal``, G22: its arrival wakes the task; any other
    move forgets it); ``signals_read`` moves the task's signal cursor up to
    that ``seq`` (None leaves it). A move to 'waiting' with ``wait_children``
    waits for that many of the task's children to finish (G23).

    Raises:
        SignalRuleViolation: ``signals_read`` goes back, or past the last signal.
        StaleVersion: another writer moved the task on; reload it.
        LeaseLost: ``lease`` was taken over; stop working on the task.
        NotFound: no such task in this tenant.
        InvalidTransition: ``to_state`` is not reachable from the current state.
        ConfigurationError: ``wake_at`` has no time zone (asyncpg would read it in
            this machine's local time), or ``payload`` is not JSON data.
        PayloadTooLarge / SecretInPayload: the event payload was refused (G9).
    """
    aware("wake_at", wake_at)
    messages = list(outbox)
    event_body = document(redact(payload or {}), cap=EVENT_PAYLOAD_CAP, what="event payload")
    trace_id, span_id = telemetry.ids(trace_id, span_id)
    bodies = [
        # None is an empty payload, as outbox.enqueue takes it (not a NOT NULL violation).
        document(
            {} if m.payload is None else m.payload,
            cap=OBJECT_CAP,
            what=f"outbox payload for {m.topic}",
        )
        for m in messages
    ]
    update = {
        "tenant_id": tenant_id,
        "id": task_id,
        "expected_version": expected_version,
        "to_state": to_state,
        "set_step": step is not KEEP,
        "current_step": None if step is KEEP else step,
        "wake_at": wake_at,
        "last_error": error[:TEXT_CAP] if error is not None else None,
        "lease_owner": lease.owner if lease else None,
        "lease_token": lease.token if lease else None,
        "wait_signal": wait_signal,
        "signal_cursor": signals_read,
        "wait_children": wait_children,
    }
    event = {
        "event_type": event_type or f"task.{to_state}",
        "actor_id": actor or (lease.owner if lease else "agentdb"),
        "payload": event_body,
    }
    row = await _transition(
        db,
        update,
        {**event, "trace_id": trace_id, "span_id": span_id},
        [
            {"id": m.id, "topic": m.topic, "payload": b}
            for m, b in zip(messages, bodies, strict=True)
        ],
    )
    if row is None:
        raise await _explain.task_write(db, tenant_id, task_id, expected_version, lease)
    return Task.from_record(row)


@twin(routed.transition)
async def _transition(
    db: _db.Executor,
    update: dict[str, Any],
    event: dict[str, Any],
    messages: Sequence[dict[str, Any]],
) -> _db.Record | None:
    """The transition, its event and its outbox messages in one statement (on Citus: the
    UPDATE, then the rest). ``None``: the UPDATE matched nothing."""
    return await _db.fetch_optional(
        db,
        _Q["task_transition"],
        **update,
        **event,
        outbox_ids=[m["id"] for m in messages],
        outbox_topics=[m["topic"] for m in messages],
        outbox_payloads=[m["payload"] for m in messages],
    )


async def wait_until(
    db: _db.Executor,
    task: Task,
    wake_at: datetime,
    *,
    lease: Lease | None = None,
    step: str | Literal[_Keep.KEEP] | None = KEEP,
) -> Task:
    """Put a task to sleep until ``wake_at`` (state ``waiting``); a claim picks it up then.

    Raises:
        as :func:`transition`.
    """
    return await transition(
        db,
        task.tenant_id,
        task.id,
        expected_version=task.state_version,
        to_state="waiting",
        wake_at=wake_at,
        lease=lease,
        step=step,
    )


async def wait_for_signal(
    db: _db.Executor,
    task: Task,
    name: str,
    *,
    until: datetime | None = None,
    signals_read: int | None = None,
    lease: Lease | None = None,
    step: str | Literal[_Keep.KEEP] | None = KEEP,
) -> Task:
    """Put a task to sleep until signal ``name`` arrives (or ``until``, a timeout), G22.

    The signal's own transaction wakes the task (state ``pending``, event
    ``task.woken``); one that arrived before this wait and is still unread
    (after ``signals_read``, else the task's cursor) makes the task due at
    once - a signal never slips between deciding to wait and waiting.

    Raises:
        as :func:`transition`.
    """
    return await transition(
        db,
        task.tenant_id,
        task.id,
        expected_version=task.state_version,
        to_state="waiting",
        wake_at=until,
        lease=lease,
        step=step,
        wait_signal=name,
        signals_read=signals_read,
    )


async def wake(db: _db.Executor, task: Task) -> Task:
    """Make a waiting task due now (state ``pending``).

    Raises:
        as :func:`transition`; :class:`~agentdb.errors.DeadlineExceeded` past its deadline.
    """
    return await transition(
        db, task.tenant_id, task.id, expected_version=task.state_version, to_state="pending"
    )


async def cancel(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    *,
    reason: str | None = None,
    actor: str | None = None,
) -> Task:
    """Cancel a task, whatever it is doing: pending, waiting or running (G20).

    One versioned write with its event (``task.cancelled``: the reason, the
    state it left, the lease holder it took the task from). A running task's
    lease goes in the same write, so the holder's next renew, reserve, settle
    or finish is refused with :class:`~agentdb.errors.Cancelled` (the worker
    then cancels the handler), and the database refuses any operation
    reserved for it afterwards, by any writer (AG012). Operations reserved
    before stay in the ledger as they are, to be reconciled: a cancel never
    makes an effect disappear. ``reason`` becomes the task's ``last_error``.

    Returns the task as it is now: ``cancelled`` (by this call, or an earlier
    one: cancelling twice is harmless), or the state it finished in before
    the cancel arrived - a cancel never undoes a finish.

    Raises:
        NotFound: no such task in this tenant.
        TransientError: the task kept changing under every one of 20 tries.
        PayloadTooLarge / SecretInPayload: the event was refused (G9).
    """
    for _ in range(_CANCEL_RERUNS):
        task = await get(db, tenant_id, task_id)
        if task.state in FINISHED_STATES:
            return task
        try:
            return await transition(
                db,
                tenant_id,
                task_id,
                expected_version=task.state_version,
                to_state="cancelled",
                error=f"cancelled: {reason}" if reason else "cancelled",
                event_type="task.cancelled",
                actor=actor or "agentdb",
                payload={
                    "reason": reason,
                    "from_state": task.state,
                    "lease_owner": task.lease_owner,
                },
            )
        except StaleVersion:
            continue  # moved on in between (a step, a finish, a claim): look again
    raise TransientError(f"task {task_id} kept changing while it was being cancelled")


#: The states an operator's :func:`retry` takes a task back from.
RETRYABLE_STATES: Final = ("failed", "dead")


async def retry(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    *,
    actor: str,
    reason: str | None = None,
) -> Task:
    """Put a failed or dead task back to pending, due now, its attempts given back.

    One versioned write with its event (``task.retried``: ``actor``, the
    state it left, the attempts it had used, ``reason``). Its ledger stays:
    a durable handler re-entered from the top answers the steps and effects
    it recorded from the record (G25) and runs on from where it stopped.

    Raises:
        NotFound: no such task in this tenant.
        InvalidTransition: the task is not failed or dead (cancelled and
            succeeded are final; a pending, waiting or running one is not stuck).
        DeadlineExceeded: the task is past its deadline (G21).
        TransientError: the task kept changing under every one of 20 tries.
    """
    for _ in range(_CANCEL_RERUNS):
        task = await get(db, tenant_id, task_id)
        if task.state not in RETRYABLE_STATES:
            raise InvalidTransition(
                f"task {task_id} is {task.state}: only a failed or dead task is retried"
            )
        if task.deadline_at is not None and task.deadline_at <= await _db_now(db):
            raise DeadlineExceeded(f"task {task_id} is past its deadline; it cannot run again")
        row = await _retry(
            db, tenant_id, task_id, task.state_version, actor, redact({"reason": reason})
        )
        if row is not None:
            return Task.from_record(row)
    raise TransientError(f"task {task_id} kept changing while it was being retried")


@twin(routed.task_retry)
async def _retry(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    expected_version: int,
    actor: str,
    payload: dict[str, Any],
) -> _db.Record | None:
    """The retry's write and its event; ``None``: task_retry's zero rows."""
    return await _db.fetch_optional(
        db, _Q["task_retry"], tenant_id=tenant_id, id=task_id, expected_version=expected_version,
        actor_id=actor, payload=document(payload, cap=EVENT_PAYLOAD_CAP, what="reason"),
    )  # fmt: skip


async def _db_now(db: _db.Executor) -> datetime:
    row = await _db.fetch_one(db, _Q["task_now"])
    now: datetime = row["now"]
    return now


# Batched finishing. A worker that finishes tasks one statement at a time is
# bound by Python client CPU (round trips), not by Postgres; finishing a whole
# claimed batch in one statement and one commit is what lets it keep up with
# queues that batch their acknowledgements (see ``agentdb bench``).


async def finish_many(
    db: _db.Executor,
    claimed: Iterable[Task],
    *,
    to_state: str = "succeeded",
    error: str | None = None,
    event_type: str | None = None,
    actor: str | None = None,
    payload: Mapping[str, Any] | None = None,
    outbox: Mapping[uuid.UUID, Iterable[Message]] | None = None,
    payloads: Mapping[uuid.UUID, Mapping[str, Any]] | None = None,
) -> list[Task | AgentDBError]:
    """Finish many claimed tasks in one statement; return one result per task, in input order.

    Each task is fenced as in :func:`transition` with its lease: it moves from
    'running' to ``to_state`` only if it is still at the ``state_version`` it
    carries and still under the lease (owner + token) it was claimed with. For
    every task finished, its event (``event_type``, default
    ``task.<to_state>``, actor ``actor`` else the lease owner, ``payload``
    redacted; ``payloads[task.id]`` if given, else ``payload``, shared by the
    batch) and its ``outbox[task.id]`` messages are written in the same
    statement; the lease is dropped.

    A refused task is not finished and nothing is written for it - no state
    change, no event, none of its outbox messages. Its slot in the result
    holds the typed error :func:`transition` would have raised, *returned*
    rather than raised so the rest of the batch still commits; only on that
    path is the row read again to say why:

    * :class:`LeaseLost` - the lease was taken over (another worker reclaimed
      the task after it expired) or the task left 'running': drop the work;
    * :class:`StaleVersion` - another writer moved the task on under this lease;
    * :class:`NotFound` - no such task in its tenant;
    * :class:`DeadlineExceeded` - the task passed its deadline (G21): it only ends now.

    Returns:
        for each task of ``claimed``, the finished :class:`Task` or the error
        saying why it was refused - never a silent gap.

    Raises:
        ConfigurationError: a task holds no lease (it was not claimed), a task
            appears twice, ``to_state`` is not a finished state, or ``outbox``
            or ``payloads`` names a task that is not in ``claimed``.
        InvalidTransition, PayloadTooLarge, SecretInPayload: the statement was
            refused as a whole; nothing was written for any task.
    """
    if to_state not in FINISHED_STATES:
        raise ConfigurationError(
            f"finish_many finishes tasks: to_state must be one of {', '.join(FINISHED_STATES)}"
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
            raise ConfigurationError(f"task {task.id} appears twice in one finish_many call")
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
            body = {} if m.payload is None else m.payload  # as in transition
            bodies.append(document(body, cap=OBJECT_CAP, what=f"outbox payload for {m.topic}"))
    own: dict[uuid.UUID, Mapping[str, Any]] = dict(payloads or {})
    if stray := own.keys() - position.keys():
        raise ConfigurationError(f"payloads names task {min(stray)}, which is not in the batch")
    return await _finish(
        db, _Finishing(batch, held, to_state, error, event_type, actor, payload, own,
                       outbox or {}, ords, ids, topics, bodies),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Finishing:
    """What :func:`finish_many` was asked, checked: the tasks, their leases, the outcome."""

    batch: list[Task]
    held: list[Lease]
    to_state: str
    error: str | None
    event_type: str | None
    actor: str | None
    payload: Mapping[str, Any] | None
    own: dict[uuid.UUID, Mapping[str, Any]]
    outbox: Mapping[uuid.UUID, Iterable[Message]]
    # The outbox messages as the statement takes them: the task's place in the batch,
    # the message's id, topic and encoded payload.
    ords: list[int]
    ids: list[uuid.UUID]
    topics: list[str]
    bodies: list[str | None]


async def _finish_one_by_one(db: _db.Executor, f: _Finishing) -> list[Task | AgentDBError]:
    """:func:`finish_many` on Citus, which would commit a many-tenant statement with
    two-phase commit: one :func:`transition` per task."""
    results: list[Task | AgentDBError] = []
    for task, lease in zip(f.batch, f.held, strict=True):
        try:
            results.append(
                await transition(
                    db, task.tenant_id, task.id, expected_version=task.state_version,
                    to_state=f.to_state, error=f.error, lease=lease, event_type=f.event_type,
                    actor=f.actor, payload=f.own.get(task.id, f.payload),
                    outbox=f.outbox.get(task.id, ()),
                )
            )  # fmt: skip
        except (StaleVersion, LeaseLost, NotFound, DeadlineExceeded) as exc:
            results.append(exc)
    return results


@twin(_finish_one_by_one)
async def _finish(db: _db.Executor, f: _Finishing) -> list[Task | AgentDBError]:
    """:func:`finish_many` in one statement; a refused task's slot says why."""
    event_body = document(redact(f.payload or {}), cap=EVENT_PAYLOAD_CAP, what="event payload")
    event_bodies = [
        document(redact(f.own[t.id]), cap=EVENT_PAYLOAD_CAP, what="event payload")
        if t.id in f.own
        else None
        for t in f.batch
    ]
    q = _Q["task_finish_many"]
    rows = await _db.fetch_many(
        db,
        q,
        tenant_ids=[t.tenant_id for t in f.batch],
        ids=[t.id for t in f.batch],
        expected_versions=[t.state_version for t in f.batch],
        lease_owners=[lease.owner for lease in f.held],
        lease_tokens=[lease.token for lease in f.held],
        to_state=f.to_state,
        last_error=f.error[:TEXT_CAP] if f.error is not None else None,
        event_type=f.event_type or f"task.{f.to_state}",
        actor_id=f.actor,
        payload=event_body,
        outbox_ords=f.ords,
        outbox_ids=f.ids,
        outbox_topics=f.topics,
        outbox_payloads=f.bodies,
        payloads=event_bodies,
    )
    done = {n: Task.from_record(r) for n, r in _db.by_ord(rows, q, len(f.batch)).items()}
    results: list[Task | AgentDBError] = []
    for i, (task, lease) in enumerate(zip(f.batch, f.held, strict=True), start=1):
        finished = done.get(i)
        if finished is None:
            results.append(
                await _explain.task_write(db, task.tenant_id, task.id, task.state_version, lease)
            )
        else:
            results.append(finished)
    return results


#: The 0.1 name of :func:`finish_many`.
complete_many = finish_many
