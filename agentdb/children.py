"""Child tasks: fan-out under a parent, and a fan-in that wakes it exactly once (G23).

A child is a task created with ``parent=`` and a ``child_key`` (:func:`spawn`):
in its parent's tenant (a composite foreign key), once per key (a retried
fan-out answers with the children it created), never for a finished parent.
The parent then waits for all of its children, or a quorum
(:func:`wait_for`, or a handler's ``Wait(children=...)``): the database wakes
it - to 'pending', event ``task.children_done`` - when the last child it
waits for finishes, exactly once, however many finish at the same moment;
a wait that begins after they finished is due at once. :func:`children`
reads them back with their results.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentdb import _db, tasks
from agentdb.errors import ConfigurationError
from agentdb.models import Lease, Task

__all__ = ["Child", "children", "count", "spawn", "wait_for", "wanted"]

_Q = _db.queries(__name__)


@dataclass(frozen=True, slots=True)
class Child:
    """A child task, its key, and - once it finished - its result (the payload of its
    finishing event: ``Succeed(payload=...)``, redacted, up to 8 KiB)."""

    task: Task
    key: str | None
    result: dict[str, Any] | None


async def spawn(
    db: _db.Executor,
    parent: Task,
    task_type: str,
    key: str,
    *,
    params: Mapping[str, Any] | None = None,
    **create: Any,
) -> Task:
    """Create child ``key`` of ``parent`` (``tasks.create`` with ``parent``/``child_key``).

    A second call with the same key returns the first child (``created``
    false); different ``params`` under it raise, as a dedupe key does (G4).
    ``create`` takes :func:`agentdb.tasks.create`'s other options.

    Raises:
        TaskFinished: the parent has finished.
        DeadlineExceeded: the parent passed its deadline.
        IdempotencyConflict: ``key`` created a child with other params.
        as :func:`agentdb.tasks.create` otherwise.
    """
    return await tasks.create(
        db, parent.tenant_id, task_type, params=params, parent=parent.id, child_key=key, **create
    )


async def children(db: _db.Executor, tenant_id: uuid.UUID, parent_id: uuid.UUID) -> list[Child]:
    """Task ``parent_id``'s children in creation order, with their results so far."""
    rows = await _db.fetch_many(db, _Q["child_list"], tenant_id=tenant_id, parent_id=parent_id)
    return [
        Child(
            Task.from_record(r),
            r["child_key"],
            None if r["result"] is None else json.loads(r["result"]),
        )
        for r in rows
    ]


async def count(db: _db.Executor, tenant_id: uuid.UUID, parent_id: uuid.UUID) -> int:
    """How many children task ``parent_id`` has."""
    row = await _db.fetch_one(db, _Q["child_count"], tenant_id=tenant_id, parent_id=parent_id)
    return int(row["n"])


async def wanted(db: _db.Executor, task: Task, finished: int | None) -> int:
    """How many children a wait for ``finished`` of them (None: all) waits for.

    Raises:
        ConfigurationError: the task has no children, or fewer than ``finished``.
    """
    have = await count(db, task.tenant_id, task.id)
    want = have if finished is None else finished
    if not 1 <= want <= have:
        raise ConfigurationError(
            f"task {task.id} has {have} children: it cannot wait for {want} of them"
        )
    return want


async def wait_for(
    db: _db.Executor,
    task: Task,
    *,
    finished: int | None = None,
    lease: Lease | None = None,
    until: datetime | None = None,
    step: tasks.Step = tasks.KEEP,
) -> Task:
    """Put ``task`` to sleep until ``finished`` of its children have finished (default: all
    it has now), or ``until`` (a timeout). The last of them wakes it (G23).

    Raises:
        ConfigurationError: the task has no children, or ``finished`` is not between 1 and
            their number.
        as :func:`agentdb.tasks.transition` otherwise.
    """
    want = await wanted(db, task, finished)
    return await tasks.transition(
        db,
        task.tenant_id,
        task.id,
        expected_version=task.state_version,
        to_state="waiting",
        wake_at=until,
        lease=lease,
        step=step,
        wait_children=want,
    )
