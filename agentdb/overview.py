"""What an operator looks at, one tenant at a time (the console and ``agentdb`` commands).

Read-only, each statement naming its tenant (G2); run as ``agentdb_operator``
in a transaction scoped to that tenant (:func:`agentdb.tenancy.tenant_scope`)
it sees no other (G15). Rows come back as plain dictionaries of JSON-able
values (ids and times as text), as a page or ``--json`` shows them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentdb import _db, children
from agentdb.budgets import list_budgets

__all__ = [
    "Activity",
    "Timeline",
    "activity",
    "approvals",
    "budgets",
    "outbox",
    "task_list",
    "task_states",
    "timeline",
    "unsettled",
]

_Q = _db.queries(__name__)
_JSON = frozenset({"params", "payload", "result", "asked", "last_result"})


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _row(r: _db.Record) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in r.items():
        if key in _JSON and isinstance(value, str):
            try:
                out[key] = json.loads(value)
            except ValueError:
                out[key] = value
        else:
            out[key] = _plain(value)
    return out


async def task_states(db: _db.Executor, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
    """The tenant's tasks by state: ``state``, ``n``, ``oldest_s`` (seconds in it, the oldest)."""
    return [
        _row(r) for r in await _db.fetch_many(db, _Q["overview_task_states"], tenant_id=tenant_id)
    ]


async def task_list(
    db: _db.Executor, tenant_id: uuid.UUID, *, state: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The tenant's tasks (in ``state``), most recently changed first, with their age."""
    rows = await _db.fetch_many(
        db, _Q["overview_task_list"], tenant_id=tenant_id, state=state, limit=limit
    )
    return [_row(r) for r in rows]


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything recorded about one task: its events, steps, effects, signals, children and
    the messages it sent."""

    events: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    effects: list[dict[str, Any]]
    signals: list[dict[str, Any]]
    children: list[dict[str, Any]]
    messages: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "steps": self.steps,
            "effects": self.effects,
            "signals": self.signals,
            "children": self.children,
            "messages": self.messages,
        }


async def timeline(db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Timeline:
    """Task ``task_id``'s timeline (empty lists: no such task in this tenant, or not visible)."""
    args = {"tenant_id": tenant_id, "task_id": task_id}
    kids = await children.children(db, tenant_id, task_id)
    return Timeline(
        events=[_row(r) for r in await _db.fetch_many(db, _Q["overview_task_events"], **args)],
        steps=[_row(r) for r in await _db.fetch_many(db, _Q["overview_task_steps"], **args)],
        effects=[_row(r) for r in await _db.fetch_many(db, _Q["overview_task_operations"], **args)],
        signals=[_row(r) for r in await _db.fetch_many(db, _Q["overview_task_signals"], **args)],
        children=[
            {
                "id": str(c.task.id),
                "key": c.key,
                "task_type": c.task.task_type,
                "state": c.task.state,
                "result": c.result,
            }
            for c in kids
        ],
        messages=[_row(r) for r in await _db.fetch_many(db, _Q["overview_task_outbox"], **args)],
    )


async def approvals(
    db: _db.Executor, tenant_id: uuid.UUID, *, limit: int = 100
) -> list[dict[str, Any]]:
    """The tenant's tasks asleep on a signal, oldest first: the signal's name
    (``wait_signal``), the waiting ``step``, what an adapter recorded the task
    asks (``asked``: tool and arguments), its ``last_step`` and ``last_result``,
    and its ``lease_holders`` (who may not approve it, G22)."""
    rows = await _db.fetch_many(db, _Q["overview_approvals"], tenant_id=tenant_id, limit=limit)
    return [_row(r) for r in rows]


async def unsettled(
    db: _db.Executor, tenant_id: uuid.UUID, *, limit: int = 100
) -> list[dict[str, Any]]:
    """The tenant's effects left reserved, in flight or unknown, under no live lease (G13)."""
    rows = await _db.fetch_many(db, _Q["overview_unsettled"], tenant_id=tenant_id, limit=limit)
    return [_row(r) for r in rows]


async def outbox(
    db: _db.Executor, tenant_id: uuid.UUID, *, state: str = "dead", limit: int = 100
) -> list[dict[str, Any]]:
    """The tenant's outbox messages in ``state``, newest first."""
    rows = await _db.fetch_many(
        db, _Q["overview_outbox"], tenant_id=tenant_id, state=state, limit=limit
    )
    return [_row(r) for r in rows]


@dataclass(frozen=True, slots=True)
class Activity:
    """One minute of a tenant's last hour: tasks created, tasks finished, and the backlog
    (pending and waiting tasks) at the minute's end, worked back from now."""

    minute: str
    created: int
    finished: int
    backlog: int


async def activity(db: _db.Executor, tenant_id: uuid.UUID, *, minutes: int = 60) -> list[Activity]:
    """The tenant's throughput and backlog per minute over the last ``minutes``, oldest first.

    The backlog is today's count worked back by the minutes' creations and
    finishes (an estimate: a retried task or one created finished counts as
    its events say)."""
    rows = await _db.fetch_many(
        db, _Q["overview_activity"], tenant_id=tenant_id, minutes=max(1, minutes)
    )
    states = {r["state"]: r["n"] for r in await task_states(db, tenant_id)}
    backlog = int(states.get("pending", 0)) + int(states.get("waiting", 0))
    out: list[Activity] = []
    for r in reversed(rows):
        out.append(Activity(r["minute"].isoformat(), r["created"], r["finished"], max(backlog, 0)))
        backlog = backlog - r["created"] + r["finished"]
    out.reverse()
    return out


async def budgets(db: _db.Executor, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
    """The tenant's budgets: unit, period, limit, spent, held (and the task of a task budget)."""
    return [
        {
            "id": str(b.id),
            "task_id": str(b.task_id) if b.task_id else None,
            "unit": b.unit,
            "period": b.period,
            "limit": b.limit,
            "spent": b.spent,
            "held": b.held,
        }
        for b in await list_budgets(db, tenant_id)
    ]
