"""Leases: claim due tasks, renew while working, release (G12).

A lease is (owner, token). Claiming takes a new, larger token; every write a
holder makes names its token, so a worker whose lease expired and was taken
over changes nothing - it gets :class:`~agentdb.errors.LeaseLost` instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentdb import _db, _explain, telemetry
from agentdb._citus import routed
from agentdb._citus.routing import twin
from agentdb._db.instant import aware
from agentdb._db.jsonb import TEXT_CAP
from agentdb.errors import ConfigurationError
from agentdb.models import Lease, Task

__all__ = ["Release", "bury_exhausted", "claim", "expire_deadlines", "held", "release", "renew"]

_Q = _db.queries(__name__)
# The bounds of a task's own lease_ttl (CHECK agent_tasks_lease_ttl_valid), which an
# override replaces: shorter, a holder loses its task mid-run; longer, a crashed
# holder's task waits days. At 0 or less the lease would be over before it began.
_TTL_MIN, _TTL_MAX = timedelta(seconds=1), timedelta(days=1)


def _no_string(task_types: object) -> None:
    """A string is a sequence of one-letter task types: refused, never claimed by."""
    if isinstance(task_types, str):
        raise ConfigurationError(
            f"task_types is a list of task types, not the string {task_types!r}: "
            f"pass [{task_types!r}]"
        )


def _ttl(lease_ttl: timedelta | None) -> None:
    if lease_ttl is not None and not _TTL_MIN <= lease_ttl <= _TTL_MAX:
        raise ConfigurationError(f"lease_ttl must be between 1 second and 1 day, not {lease_ttl}")


async def claim(
    db: _db.Executor,
    owner: str,
    *,
    batch: int = 1,
    lease_ttl: timedelta | None = None,
    task_types: Sequence[str] | None = None,
    after_tenant: uuid.UUID | None = None,
) -> list[Task]:
    """Lease up to ``batch`` due tasks to ``owner``; return them, each with its lease.

    Due: pending or waiting with ``wake_at`` passed, or running with an expired
    lease (taken over: the old holder is fenced out). ``lease_ttl`` overrides
    each task's own ``lease_ttl``. Each claim counts an attempt and writes an
    event.

    Fair between tenants (G18): the batch is shared round-robin among the
    tenants with due work, walking them from the one after ``after_tenant``
    and never beyond a tenant's concurrency limits. Pass the ``tenant_id`` of
    the last task of the previous claim (tasks come back in the order the
    batch took them) and successive claims rotate through the tenants; the
    :class:`~agentdb.worker.Worker` does.

    Raises:
        ConfigurationError: ``batch`` is not positive; ``task_types`` is a
            string (a list of task types is meant: ``["send_email"]``); ``lease_ttl``
            is outside 1 second - 1 day.
        ConcurrencyLimitExceeded: another writer moved one of a capped
            tenant's tasks to running outside the claim at the same moment;
            nothing was claimed: claim again. (On Citus, where each tenant is
            claimed in a transaction of its own, that tenant gives nothing
            instead and the others' tasks are returned.)
    """
    if batch < 1:
        raise ConfigurationError("batch must be at least 1")
    _no_string(task_types)
    _ttl(lease_ttl)
    types = list(task_types) if task_types is not None else None
    with telemetry.span(
        "agentdb.task.claim", {"agentdb.lease.owner": owner, "agentdb.batch.size": batch}
    ):
        rows = await _claim(
            db, owner, batch=batch, lease_ttl=lease_ttl, task_types=types,
            after_tenant=after_tenant,
        )  # fmt: skip
    return [Task.from_record(r) for r in rows]


@twin(routed.claim)
async def _claim(
    db: _db.Executor,
    owner: str,
    *,
    batch: int,
    lease_ttl: timedelta | None,
    task_types: list[str] | None,
    after_tenant: uuid.UUID | None,
) -> list[_db.Record]:
    """The claim's rows: one statement for every tenant (on Citus, tenant by tenant)."""
    args = {
        "lease_owner": owner,
        "batch": batch,
        "lease_ttl": lease_ttl,
        "task_types": task_types,
        "after_tenant": after_tenant,
    }
    rows = await _db.fetch_many(db, _Q["lease_claim"], **args)
    if not rows:
        # Under contention every candidate the walk found may have been
        # locked by other claimers at that instant (SKIP LOCKED hands
        # this one nothing while work remains): look once more.
        rows = await _db.fetch_many(db, _Q["lease_claim"], **args)
    return rows


async def renew(db: _db.Executor, lease: Lease, *, lease_ttl: timedelta | None = None) -> Lease:
    """Extend ``lease`` by ``lease_ttl`` (default: the task's own) from now.

    Raises:
        LeaseLost: another worker took the task over, or it left 'running';
            stop working on it - nothing you write will land.
        NotFound: no such task.
        ConfigurationError: ``lease_ttl`` is outside 1 second - 1 day.
    """
    _ttl(lease_ttl)
    row = await _db.fetch_optional(
        db,
        _Q["lease_renew"],
        tenant_id=lease.tenant_id,
        id=lease.task_id,
        lease_owner=lease.owner,
        lease_token=lease.token,
        lease_ttl=lease_ttl,
    )
    if row is None:
        raise await _explain.task_write(db, lease.tenant_id, lease.task_id, None, lease)
    return Lease(lease.tenant_id, lease.task_id, lease.owner, lease.token, row["lease_expires_at"])


async def held(
    db: _db.Executor, owner: str, tasks: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> dict[uuid.UUID, int]:
    """Of ``tasks`` (tenant id, task id), those ``owner`` still holds, with each one's lease
    token: a task missing, or under another token, was cancelled (G20), swept past its
    deadline (G21) or taken over (G12)."""
    if not tasks:
        return {}
    rows = await _db.fetch_many(
        db, _Q["lease_held"], tenant_ids=[t for t, _ in tasks], ids=[i for _, i in tasks],
        lease_owner=owner,
    )  # fmt: skip
    return {r["id"]: r["lease_token"] for r in rows}


@dataclass(frozen=True, slots=True)
class Release:
    """Where a released task went: ``state`` is 'pending' (due at ``wake_at``) or 'dead'."""

    state: str
    state_version: int
    wake_at: datetime
    attempts: int


async def release(
    db: _db.Executor,
    lease: Lease,
    *,
    wake_at: datetime | None = None,
    refund_attempt: bool = False,
    error: str | None = None,
    event_type: str = "task.released",
) -> Release:
    """Give the task back: pending again (due at ``wake_at``, default now).

    A task that has used all its attempts goes to 'dead' instead - unless
    ``refund_attempt`` (a graceful shutdown: this attempt did not really run),
    which also gives the attempt back.

    Raises:
        LeaseLost: the lease was already taken over; nothing changed.
        NotFound: no such task.
        ConfigurationError: ``wake_at`` has no time zone (asyncpg would read it
            in this machine's local time).
    """
    aware("wake_at", wake_at)

    params = {
        "tenant_id": lease.tenant_id,
        "id": lease.task_id,
        "lease_owner": lease.owner,
        "lease_token": lease.token,
        "wake_at": wake_at,
        "refund_attempt": refund_attempt,
        "last_error": error[:TEXT_CAP] if error is not None else None,
        "event_type": event_type,
    }
    row = await _release(db, params)
    if row is None:
        raise await _explain.task_write(db, lease.tenant_id, lease.task_id, None, lease)
    return Release(row["state"], row["state_version"], row["wake_at"], row["attempts"])


@twin(routed.release)
async def _release(db: _db.Executor, params: dict[str, Any]) -> _db.Record | None:
    """The release and its event in one statement (on Citus: the UPDATE, then the event)."""
    return await _db.fetch_optional(db, _Q["lease_release"], **params)


async def bury_exhausted(
    db: _db.Executor, *, actor: str = "agentdb", batch: int = 100
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Move tasks that used up their attempts (and hold no live lease) to 'dead'.

    Returns the (tenant_id, task_id) pairs buried.
    """
    return [(r["tenant_id"], r["id"]) for r in await _bury(db, actor, batch)]


@twin(routed.bury)
async def _bury(db: _db.Executor, actor: str, batch: int) -> list[_db.Record]:
    return await _db.fetch_many(db, _Q["lease_bury_exhausted"], actor_id=actor, batch=batch)


async def expire_deadlines(
    db: _db.Executor, *, actor: str = "agentdb", batch: int = 100
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Move unfinished tasks whose deadline passed to 'dead', each with its
    ``task.deadline_passed`` event (G21). A running task's lease goes in the same
    write: its holder's next write raises :class:`~agentdb.errors.PastDeadline`.

    Returns the (tenant_id, task_id) pairs moved (at most ``batch``).

    Raises:
        AgentDBError: a mapped database error.
    """
    return [(r["tenant_id"], r["id"]) for r in await _expire(db, actor, batch)]


@twin(routed.expire_deadlines)
async def _expire(db: _db.Executor, actor: str, batch: int) -> list[_db.Record]:
    return await _db.fetch_many(db, _Q["lease_expire_deadlines"], actor_id=actor, batch=batch)
