"""Why a guarded write matched no row: the typed error, read only on the failure path.

A fenced statement that touches nothing says nothing about why. These
helpers read the row again and name the reason - :class:`NotFound`,
:class:`LeaseLost` (:class:`Cancelled` when a cancel took the lease) or
:class:`StaleVersion` - so the happy path pays no extra round trip.
"""

from __future__ import annotations

import uuid

from agentdb import _db
from agentdb.errors import (
    AgentDBError,
    Cancelled,
    DeadlineExceeded,
    LeaseLost,
    NotFound,
    OutboxLeaseLost,
    PastDeadline,
    StaleVersion,
)
from agentdb.models import Lease, Operation, OutboxMessage

__all__ = ["not_found", "outbox_mark", "settle", "task_write"]

_Q = _db.queries(__name__)


def not_found(entity: str, tenant_id: uuid.UUID, id: uuid.UUID) -> NotFound:
    """The error for a row that is not in this tenant."""
    # The prefix the guard triggers' messages carry: every agentdb error says whose it is.
    return NotFound(f"agentdb: {entity} {id} not found", entity=entity, tenant_id=tenant_id, id=id)


async def task_write(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    expected: int | None,
    lease: Lease | None,
) -> AgentDBError:
    """Say why a write to a task matched no row: gone, lease lost, or version moved on."""
    now = await _db.fetch_optional(db, _Q["explain_task"], tenant_id=tenant_id, id=task_id)
    if now is None:
        return not_found("task", tenant_id, task_id)
    if lease is not None and (
        now["state"] != "running"
        or now["lease_owner"] != lease.owner
        or now["lease_token"] != lease.token
    ):
        # A cancel (G20) and the deadline sweep (G21) drop the lease in their own
        # write and keep its token: the holder they took it from is told why (and
        # may record what it learned). A holder taken over before that - a newer
        # token - only lost its lease (G12).
        ours = now["lease_token"] == lease.token
        lost = (
            Cancelled
            if ours and now["state"] == "cancelled"
            else PastDeadline
            if ours and now["swept"]
            else LeaseLost
        )
        return lost(
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
    if (
        now["late"]
        and now["state"] in ("pending", "waiting", "running")
        and expected in (None, now["state_version"])
    ):
        return DeadlineExceeded(
            f"task {task_id} passed its deadline; it can only be moved to dead or cancelled",
            constraint="agent_tasks_deadline_guard",
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


async def settle(
    db: _db.Executor, op: Operation, lease: Lease | None, from_states: tuple[str, ...]
) -> AgentDBError:
    """Say why a settle of ``op`` matched no row: the task's lease first, then the operation."""
    if lease is not None:
        why = await task_write(db, op.tenant_id, op.task_id, None, lease)
        if isinstance(why, LeaseLost | NotFound):
            return why
    now = await _db.fetch_optional(db, _Q["explain_operation"], tenant_id=op.tenant_id, id=op.id)
    if now is None:
        return not_found("operation", op.tenant_id, op.id)
    return StaleVersion(
        f"operation {op.id} is {now['state']} at state_version {now['state_version']}; "
        f"expected one of {', '.join(from_states)} at {op.state_version}",
        entity="operation",
        tenant_id=op.tenant_id,
        id=op.id,
        expected=op.state_version,
        actual=now["state_version"],
        actual_state=now["state"],
    )


async def outbox_mark(db: _db.Executor, message: OutboxMessage) -> AgentDBError:
    """Say why marking a claimed message matched no row: gone, or no longer this relay's."""
    now = await _db.fetch_optional(
        db, _Q["explain_outbox"], tenant_id=message.tenant_id, id=message.id
    )
    if now is None:
        return not_found("outbox", message.tenant_id, message.id)
    return OutboxLeaseLost(
        f"outbox message {message.id} is no longer held by {message.lease_owner} "
        f"(token {message.lease_token}; now: {now['state']}, owner {now['lease_owner']}, "
        f"token {now['lease_token']})",
        entity="outbox",
        tenant_id=message.tenant_id,
        id=message.id,
        owner=message.lease_owner or "",
        token=message.lease_token,
        current_owner=now["lease_owner"],
        current_token=now["lease_token"],
    )
