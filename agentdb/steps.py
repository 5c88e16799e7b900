"""Steps: what a durable handler recorded, read back at once, each written once (G25).

A handler that uses :class:`agentdb.worker.Job`'s straight-line API
(``job.step``, ``job.effect``, ``job.wait_for_signal``, ``job.sleep``,
``job.run_children``) is re-entered from the top after every wait and every
crash. What its earlier runs did is here: :func:`ledger` reads all of it -
its steps and its operations (the effects) - in one statement, and each new
step is one write under the task's lease (:func:`record`,
:func:`finish`, :func:`take_signal`). The database refuses a step written
without the current lease, a second record of a name, a change to a
recorded step (a wait is finished once) and a signal taken twice
(``agent_steps_guard``, AG018; ``agent_steps_pkey``;
``agent_steps_signal_key``).

These are the statements; the rules a handler meets (replay, conflicts,
when a step's function runs again) are :mod:`agentdb.worker.durable`'s.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agentdb import _db, _explain
from agentdb.errors import (
    DeadlineExceeded,
    LeaseLost,
    NotFound,
    StepRuleViolation,
    TaskFinished,
    TransientError,
)
from agentdb.models import Lease, Signal

__all__ = [
    "KINDS",
    "Effect",
    "Ledger",
    "Step",
    "Taken",
    "finish",
    "get",
    "ledger",
    "record",
    "take_signal",
]

_Q = _db.queries(__name__)

#: What an agent_steps row records (agent_steps_kind_valid).
KINDS = ("step", "signal", "sleep", "children")


@dataclass(frozen=True, slots=True)
class Step:
    """One recorded step: its kind, whether it is still ``waiting``, the hash of its arguments,
    its result (JSON), when a sleep ends or a wait times out, and the signal a wait took."""

    name: str
    kind: str
    state: str
    input_hash: str
    result: Any
    wake_at: datetime | None
    #: the database's clock says ``wake_at`` has passed.
    due: bool
    signal: Signal | None = None


@dataclass(frozen=True, slots=True)
class Effect:
    """What the ledger holds for an operation of the task: enough to replay a settled effect."""

    key: str
    action: str
    state: str
    input_hash: str
    result: Any


@dataclass
class Ledger:
    """A task's recorded steps by name and its operations by idempotency key."""

    steps: dict[str, Step] = field(default_factory=dict)
    effects: dict[str, Effect] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Taken:
    """What :func:`take_signal` answered: the step as recorded (``None``: no signal of that
    name is there to take), and the task's last signal seq."""

    step: Step | None
    last_seq: int


def _json(value: Any) -> Any:
    return None if value is None else json.loads(value)


def _signal(r: _db.Record, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Signal | None:
    if r["signal_id"] is None:
        return None
    return Signal(
        id=r["signal_id"],
        tenant_id=tenant_id,
        task_id=task_id,
        seq=r["signal_seq"],
        name=r["signal_name"],
        kind=r["signal_kind"],
        decision=r["decision"],
        payload=_json(r["signal_payload"]) or {},
        sender=r["sender"],
        dedupe_key=r["signal_dedupe_key"],
        input_hash=r["signal_input_hash"],
        created_at=r["signal_created_at"],
    )


def _step(r: _db.Record, signal: Signal | None = None, *, due: bool | None = None) -> Step:
    """The step of a row; ``due`` when the statement could not read the clock (Citus refuses
    now() in a RETURNING list) and the caller knows it."""
    return Step(
        r["name"],
        r["kind"],
        r["state"],
        r["input_hash"],
        _json(r["result"]),
        r["wake_at"],
        bool(r["due"]) if due is None else due,
        signal,
    )


async def ledger(db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Ledger:
    """Everything task ``task_id``'s handler recorded: its steps and its operations, one read."""
    found = Ledger()
    for r in await _db.fetch_many(db, _Q["step_ledger"], tenant_id=tenant_id, task_id=task_id):
        if r["source"] == "step":
            found.steps[r["name"]] = _step(r, _signal(r, tenant_id, task_id))
        else:
            found.effects[r["name"]] = Effect(
                r["name"], r["action"], r["state"], r["input_hash"], _json(r["result"])
            )
    return found


async def _refused(
    db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID, name: str, lease: Lease
) -> Step:
    """Why a fenced step write wrote nothing: the lease's fate (raised), else the step as it
    is recorded already - an earlier write whose answer was lost, or a wait finished.

    Raises:
        LeaseLost (Cancelled, PastDeadline), NotFound, DeadlineExceeded: the lease is gone.
        TransientError: the lease is current and the step is not there (a write that
            lost a race it cannot lose while the lease is held: try again).
    """
    why = await _explain.task_write(db, tenant_id, task_id, None, lease)
    if isinstance(why, LeaseLost | NotFound | DeadlineExceeded):
        raise why
    found = await get(db, tenant_id, task_id, name)
    if found is None:
        raise TransientError(f"step {name!r} of task {task_id} was neither written nor found")
    return found


async def get(db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID, name: str) -> Step | None:
    """Step ``name`` of task ``task_id`` as recorded (with the signal a wait took), or None."""
    row = await _db.fetch_optional(
        db, _Q["step_get"], tenant_id=tenant_id, task_id=task_id, name=name
    )
    return None if row is None else _step(row, _signal(row, tenant_id, task_id))


async def record(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    name: str,
    *,
    kind: str,
    input_hash: str,
    result: str | None,
    lease: Lease,
    waiting: bool = False,
    wait: timedelta | None = None,
) -> Step:
    """Record step ``name`` under ``lease``: done with ``result`` (JSON text), or ``waiting``
    (``wait``: a sleep's length or a wait's timeout, ended by the database's clock).

    A step the task has recorded already comes back as it is (the caller compares its hash).

    Raises:
        LeaseLost: the lease is not the task's current one (``Cancelled``, ``PastDeadline``).
        DeadlineExceeded: the task passed its deadline.
        PayloadTooLarge, SecretInPayload: ``result`` was refused (G9).
    """
    params = {
        "tenant_id": tenant_id,
        "task_id": task_id,
        "name": name,
        "kind": kind,
        "state": "waiting" if waiting else "done",
        "input_hash": input_hash,
        "result": result,
        "signal_seq": None,
        "wait": wait,
        "lease_owner": lease.owner,
        "lease_token": lease.token,
    }
    try:
        row = await _db.fetch_optional(db, _Q["step_insert"], **params)
    except (StepRuleViolation, TaskFinished, DeadlineExceeded):
        # The fence and the guard read the task under different locks: a lease that
        # went between them is told as the fence would have told it.
        row = None
    if row is not None:
        # wake_at is the insert's now() + wait: due at once only for a wait of nothing.
        return _step(row, due=wait is not None and wait <= timedelta(0))
    return await _refused(db, tenant_id, task_id, name, lease)


async def finish(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    name: str,
    *,
    result: str | None,
    lease: Lease,
) -> Step:
    """Finish waiting step ``name`` with ``result`` (JSON text), once, under ``lease``.

    A step that is finished already comes back as it was recorded.

    Raises:
        as :func:`record`.
    """
    try:
        row = await _db.fetch_optional(
            db, _Q["step_finish"], tenant_id=tenant_id, task_id=task_id, name=name,
            result=result, lease_owner=lease.owner, lease_token=lease.token,
        )  # fmt: skip
    except (StepRuleViolation, TaskFinished, DeadlineExceeded):
        row = None
    if row is not None:
        return _step(row, due=True)
    return await _refused(db, tenant_id, task_id, name, lease)


async def take_signal(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    name: str,
    signal_name: str,
    *,
    input_hash: str,
    lease: Lease,
) -> Taken:
    """Wait step ``name`` takes the first signal named ``signal_name`` no step of the task
    has taken, in the task's order, and is recorded done with it (G22, G25).

    Raises:
        as :func:`record`.
    """
    try:
        row = await _db.fetch_one(
            db, _Q["step_take_signal"], tenant_id=tenant_id, task_id=task_id, name=name,
            signal_name=signal_name, input_hash=input_hash, lease_owner=lease.owner,
            lease_token=lease.token,
        )  # fmt: skip
    except (StepRuleViolation, TaskFinished, DeadlineExceeded):
        row = None
    if row is None or not row["leased"]:
        found = await _refused(db, tenant_id, task_id, name, lease)
        return Taken(found if found.state == "done" else None, 0)
    signal = _signal(row, tenant_id, task_id)
    if signal is None:
        # Nothing to take - unless an earlier take of this step, whose answer was
        # lost with its connection, took it: the step says so.
        again = await get(db, tenant_id, task_id, name)
        done = again if again is not None and again.state == "done" else None
        return Taken(done, int(row["last_seq"]))
    step = Step(name, "signal", "done", input_hash, None, None, False, signal)
    return Taken(step, int(row["last_seq"]))
