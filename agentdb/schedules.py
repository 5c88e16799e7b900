"""Schedules: a task on each tick of an interval or a cron rule, at most one per tick (G24).

A schedule belongs to a tenant and names the task to create (type, version,
params). Its rule is an interval (``every``: whole seconds, ticks at the
anchor, anchor + every, ...) or a cron expression (``cron``: minute hour
day-of-month month day-of-week, in UTC; numbers, ``*``, ranges, lists and
steps). Every task a schedule creates carries its schedule and tick, and the
database keeps that pair unique: however many schedulers run - every worker
fires due schedules as it sweeps, and :func:`fire_due` may be called by
anything else - one tick makes one task. It also refuses a tick that is not
the rule's, or not yet due.

After downtime the schedule's ``catch_up`` decides: ``"latest"`` (the
default) fires one task, for the latest tick due, and skips the ones missed
before it (its ``task.created`` event says from which tick); ``"all"`` fires
every missed tick, oldest first, at most 100 per call. A paused schedule
fires nothing, and :func:`resume` moves it to the first tick after now: the
ticks of the pause are never fired.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from agentdb import _db
from agentdb._db.instant import aware
from agentdb._db.jsonb import OBJECT_CAP, document
from agentdb.errors import (
    ConfigurationError,
    IdempotencyConflict,
    InvariantViolation,
    NotFound,
    TransientError,
)
from agentdb.hashing import input_hash
from agentdb.models import Schedule

__all__ = [
    "CATCH_UP",
    "Fired",
    "create",
    "delete",
    "fire_due",
    "get",
    "of_tenant",
    "pause",
    "resume",
]

#: What a schedule does about ticks it missed.
CATCH_UP: Final = ("latest", "all")
_Q = _db.queries(__name__)
_RACE_RERUNS = 3
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Fired:
    """A task a schedule created for one of its ticks."""

    tenant_id: uuid.UUID
    schedule_id: uuid.UUID
    tick: datetime
    task_id: uuid.UUID


async def create(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    name: str,
    task_type: str,
    *,
    every: timedelta | None = None,
    cron: str | None = None,
    params: Mapping[str, Any] | None = None,
    workflow_version: str = "1",
    catch_up: str = "latest",
    start_at: datetime | None = None,
    task_deadline: timedelta | None = None,
) -> Schedule:
    """Create schedule ``name``: a ``task_type`` task on each tick of ``every`` or ``cron``.

    Interval ticks start at ``start_at`` (an aware datetime; default now),
    in whole seconds; cron ticks are the rule's from then on. With
    ``task_deadline`` each task must be over by its tick plus that (G21). A
    retried create of the same name answers with the schedule there
    (``created`` false) - provided the definition is the same.

    Raises:
        ConfigurationError: not exactly one of ``every`` and ``cron``; an unknown
            ``catch_up``; ``start_at`` without a time zone; a cron rule that never fires;
            ``params`` that are not plain JSON data (:mod:`agentdb.hashing`). Nothing
            was created.
        IdempotencyConflict: a schedule of that name has another definition.
        NotFound: ``tenant_id`` names no tenant (``entity`` ``"tenant"``).
        InvariantViolation: a CHECK refused a value, such as an ``every`` with months or
            fractions of a second, or a cron expression agentdb does not read (named).
    """
    if (every is None) == (cron is None):
        raise ConfigurationError("a schedule takes exactly one of every= and cron=")
    if catch_up not in CATCH_UP:
        raise ConfigurationError(f"catch_up must be one of {', '.join(CATCH_UP)}, not {catch_up!r}")
    aware("start_at", start_at)
    body = document(params or {}, cap=OBJECT_CAP, what="schedule params")
    args = {
        "tenant_id": tenant_id, "id": uuid.uuid4(), "name": name, "task_type": task_type,
        "workflow_version": workflow_version, "params": body, "every": every, "cron": cron,
        "catch_up": catch_up, "start_at": start_at, "task_deadline": task_deadline,
    }  # fmt: skip
    # Hashed before the insert: params the hash refuses must leave no schedule behind.
    wanted = _definition(args, params)
    for _ in range(_RACE_RERUNS):
        row = await _db.fetch_optional(db, _Q["schedule_create"], **args)
        if row is not None:
            break
    else:
        raise TransientError("a concurrent create of the same schedule is still settling")
    schedule = Schedule.from_record(row, created=row["created"])
    stored = _definition(_asdict(schedule), schedule.params)
    if not schedule.created and wanted != stored:
        raise IdempotencyConflict(
            f"schedule {name!r} exists with another definition",
            tenant_id=tenant_id, key=name, stored_hash=stored, given_hash=wanted,
        )  # fmt: skip
    return schedule


def _asdict(s: Schedule) -> dict[str, Any]:
    return {
        "task_type": s.task_type, "workflow_version": s.workflow_version, "every": s.every,
        "cron": s.cron, "catch_up": s.catch_up, "task_deadline": s.task_deadline,
    }  # fmt: skip


def _definition(args: Mapping[str, Any], params: Mapping[str, Any] | None) -> str:
    """What a schedule does, hashed; its anchor and state are not part of it."""
    every, deadline = args["every"], args["task_deadline"]
    return input_hash({
        "task_type": args["task_type"], "workflow_version": args["workflow_version"],
        "params": dict(params or {}), "cron": args["cron"], "catch_up": args["catch_up"],
        "every": None if every is None else every.total_seconds(),
        "task_deadline": None if deadline is None else deadline.total_seconds(),
    })  # fmt: skip


async def get(db: _db.Executor, tenant_id: uuid.UUID, name: str) -> Schedule:
    """Return schedule ``name``.

    Raises:
        NotFound: no schedule of that name in this tenant.
    """
    row = await _db.fetch_optional(db, _Q["schedule_get"], tenant_id=tenant_id, name=name)
    if row is None:
        raise _missing(tenant_id, name)
    return Schedule.from_record(row)


def _missing(tenant_id: uuid.UUID, name: str) -> NotFound:
    return NotFound(f"agentdb: schedule {name!r} not found", entity="schedule", tenant_id=tenant_id,
                    id=uuid.UUID(int=0))  # fmt: skip


async def of_tenant(db: _db.Executor, tenant_id: uuid.UUID) -> list[Schedule]:
    """The tenant's schedules, by name."""
    rows = await _db.fetch_many(db, _Q["schedule_list"], tenant_id=tenant_id)
    return [Schedule.from_record(r) for r in rows]


async def pause(db: _db.Executor, tenant_id: uuid.UUID, name: str) -> Schedule:
    """Stop schedule ``name`` firing until :func:`resume`.

    Raises:
        NotFound: no schedule of that name in this tenant.
    """
    return await _set_paused(db, tenant_id, name, paused=True)


async def resume(db: _db.Executor, tenant_id: uuid.UUID, name: str) -> Schedule:
    """Let schedule ``name`` fire again, from the first tick after now if its next has passed.

    Raises:
        NotFound: no schedule of that name in this tenant.
    """
    return await _set_paused(db, tenant_id, name, paused=False)


async def _set_paused(
    db: _db.Executor, tenant_id: uuid.UUID, name: str, *, paused: bool
) -> Schedule:
    row = await _db.fetch_optional(
        db, _Q["schedule_pause"], tenant_id=tenant_id, name=name, paused=paused
    )
    if row is None:
        raise _missing(tenant_id, name)
    return Schedule.from_record(row)


async def delete(db: _db.Executor, tenant_id: uuid.UUID, name: str) -> bool:
    """Delete schedule ``name``; False if there was none. The tasks it made stay.

    Run it as the schema owner: the runtime role pauses schedules but, as with every
    tenant table, deletes nothing (G15).

    Raises:
        asyncpg.InsufficientPrivilegeError: the role may not delete (SQLSTATE 42501).
    """
    gone = await _db.fetch_optional(db, _Q["schedule_delete"], tenant_id=tenant_id, name=name)
    return gone is not None


async def fire_due(db: _db.Executor, *, batch: int = 100) -> list[Fired]:
    """Fire up to ``batch`` due schedules, each in its own transaction; return the tasks made.

    Safe to run from any number of processes at once: a schedule one of them
    holds is skipped by the others, and a tick makes one task whoever fires it.
    A schedule whose task the database refuses (an ``InvariantViolation``) is
    logged and skipped, so it cannot hold up the others.

    Raises:
        AgentDBError: a mapped database error other than those.
    """
    fired: list[Fired] = []
    for due in await _db.fetch_many(db, _Q["schedule_due"], batch=batch):
        try:
            rows = await _db.fetch_many(
                db, _Q["schedule_fire"], tenant_id=due["tenant_id"], schedule_id=due["id"]
            )
        except InvariantViolation as exc:
            # One schedule whose task the database refuses must not hold up the ones due
            # after it: it is said, and tried again next time.
            log.warning("schedule %s of tenant %s not fired: %s", due["id"], due["tenant_id"], exc)
            continue
        fired += [
            Fired(due["tenant_id"], due["id"], r["fired_tick"], r["fired_task"]) for r in rows
        ]
    return fired
