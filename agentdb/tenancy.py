"""Tenant scope for sessions that run as the ``agentdb_agent`` role (G15).

Pinned login roles (rows in ``agent_principals``) need nothing from here:
their tenant follows the login. An unpinned session - trusted code that holds
a pooled connection and acts for one tenant at a time - opens a scope per
transaction; the setting is transaction-local, so it can never leak to the
next user of the connection.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

from agentdb import _db, _explain
from agentdb._citus import routed
from agentdb._citus.routing import twin
from agentdb.errors import ConfigurationError, IdempotencyConflict, TransientError

__all__ = [
    "ALL_TYPES",
    "ConcurrencyLimit",
    "DeletionStep",
    "Tenant",
    "TenantDeletion",
    "concurrency_limits",
    "create_tenant",
    "delete_tenant",
    "list_tenants",
    "set_concurrency_limit",
    "tenant_by_name",
    "tenant_scope",
]

#: The ``task_type`` of a cap that counts every task of the tenant.
ALL_TYPES = "*"

_Q = _db.queries(__name__)
_INT4_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant: its id, its name (unique, ``agent_tenants_name_key``) and its state."""

    id: uuid.UUID
    name: str
    state: str
    created_at: datetime

    @classmethod
    def from_record(cls, r: _db.Record) -> Tenant:
        return cls(uuid.UUID(str(r["id"])), r["name"], r["state"], r["created_at"])


# A create loses a race when a concurrent create of the same name commits
# after its snapshot: a new statement sees it.
_RACE_RERUNS = 3


async def create_tenant(
    db: _db.Executor, name: str, *, tenant_id: uuid.UUID | None = None
) -> uuid.UUID:
    """Register a tenant and return its id; a name that is taken answers with its tenant.

    Names are unique (``agent_tenants_name_key``), so a retried create - or
    two racing - make one tenant.

    Raises:
        DuplicateKey: ``tenant_id`` is taken (by a tenant of another name).
        IdempotencyConflict: ``name`` is taken by a tenant other than ``tenant_id``.
        InvariantViolation: ``name`` is empty or over 200 characters.
    """
    for _ in range(_RACE_RERUNS):
        row = await _create(db, tenant_id or uuid.uuid4(), name)
        if row is None:
            continue  # the name committed after this statement's snapshot: look again
        found = uuid.UUID(str(row["id"]))
        if tenant_id is not None and found != tenant_id:
            raise IdempotencyConflict(
                f"tenant name {name!r} belongs to tenant {found}, not {tenant_id}",
                tenant_id=found,
                key=name,
                stored_hash=str(found),
                given_hash=str(tenant_id),
            )
        return found
    raise TransientError(f"tenant {name!r} kept racing with another create")


@twin(routed.tenant_create)
async def _create(db: _db.Executor, tenant_id: uuid.UUID, name: str) -> _db.Record | None:
    return await _db.fetch_optional(db, _Q["tenant_create"], id=tenant_id, name=name)


async def tenant_by_name(db: _db.Executor, name: str) -> Tenant | None:
    """The tenant called ``name``, or ``None`` (none has it, or the caller may not see it)."""
    row = await _db.fetch_optional(db, _Q["tenant_by_name"], name=name)
    return None if row is None else Tenant.from_record(row)


async def list_tenants(db: _db.Executor, *, limit: int = 1000) -> list[Tenant]:
    """The tenants the caller may see, by name (at most ``limit``)."""
    rows = await _db.fetch_many(db, _Q["tenant_list"], limit=limit)
    return [Tenant.from_record(r) for r in rows]


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """One cap of a tenant (G18): at most ``max_running`` of its ``task_type`` tasks
    run at once (:data:`ALL_TYPES`: of all its tasks; ``None``: no cap), and how
    many run now."""

    task_type: str
    max_running: int | None
    running: int


async def set_concurrency_limit(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    max_running: int | None,
    *,
    task_type: str = ALL_TYPES,
) -> None:
    """Cap how many of the tenant's tasks (or of one ``task_type``) run at once (G18).

    ``None`` lifts the cap; ``0`` pauses the tenant (or the type). Workers
    never claim past a cap, and the database refuses any other write that
    would start a task beyond it (:class:`~agentdb.errors.ConcurrencyLimitExceeded`).
    Lowering a cap stops new starts; tasks already running finish normally.

    Raises:
        ConfigurationError: ``max_running`` is negative or not an integer, or
            ``task_type`` is empty or over 200 characters.
        NotFound: there is no such tenant (``entity`` ``"tenant"``).
    """
    if max_running is not None and (
        isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 0
    ):
        raise ConfigurationError(f"max_running must be a whole number >= 0, not {max_running!r}")
    if max_running is not None and max_running > _INT4_MAX:
        raise ConfigurationError(f"max_running must be at most {_INT4_MAX}")
    if not isinstance(task_type, str) or not 1 <= len(task_type) <= 200:
        raise ConfigurationError("task_type must be 1 to 200 characters")
    await _db.fetch_one(
        db,
        _Q["tenant_limit_set"],
        tenant_id=tenant_id,
        task_type=task_type,
        max_running=max_running,
    )


async def concurrency_limits(db: _db.Executor, tenant_id: uuid.UUID) -> list[ConcurrencyLimit]:
    """The tenant's caps (G18), each with how many of its tasks run now; ``[]``: unlimited."""
    rows = await _db.fetch_many(db, _Q["tenant_limits"], tenant_id=tenant_id)
    return [ConcurrencyLimit(r["task_type"], r["max_running"], r["running"]) for r in rows]


@asynccontextmanager
async def tenant_scope(db: _db.Executor, tenant_id: uuid.UUID) -> AsyncIterator[_db.Conn]:
    """Open a transaction scoped to ``tenant_id`` and yield its connection.

    Raises:
        Exception: whatever the block raises (the transaction is rolled back).
    """
    async with _db.transaction(db) as conn:
        await _db.fetch_one(conn, _Q["tenant_scope_set"], tenant_id=tenant_id)
        yield conn


@dataclass(frozen=True, slots=True)
class DeletionStep:
    """One step of the tenant deletion policy and the rows it touched (or would touch)."""

    step: int
    object: str
    action: str
    affected: int
    retained_until: datetime | None
    refs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TenantDeletion:
    """What :func:`delete_tenant` did, or with ``dry_run`` would do, per table (G17)."""

    tenant_id: uuid.UUID
    dry_run: bool
    steps: tuple[DeletionStep, ...]

    def _refs(self, obj: str) -> tuple[str, ...]:
        return next((s.refs for s in self.steps if s.object == obj), ())

    @property
    def artifact_uris(self) -> tuple[str, ...]:
        """Blob URIs of the deleted artifacts: purge them from storage."""
        return self._refs("agent_artifacts")

    @property
    def credential_refs(self) -> tuple[str, ...]:
        """Secret-manager references of the deleted credentials: revoke them there."""
        return self._refs("agent_credential_refs")

    @property
    def complete(self) -> bool:
        """True when the tenant row itself is (or would be) gone."""
        return any(
            s.object == "agent_tenants" and s.action == "delete" and s.affected for s in self.steps
        )

    @property
    def retained_until(self) -> datetime | None:
        """When the audit skeleton kept for this tenant expires (run again then)."""
        return next((s.retained_until for s in self.steps if s.action == "retain for audit"), None)


async def delete_tenant(
    db: _db.Executor, tenant_id: uuid.UUID, *, dry_run: bool, actor: str = "agentdb"
) -> TenantDeletion:
    """Apply the tenant deletion policy (see ``sql/migrations/0011.retention.sql`` and the README).

    With ``dry_run`` nothing changes; every step reports the rows it would
    touch, counted with the predicate it acts on. Run it again after the
    audit retention has passed to finish the deletion; a run with nothing
    left to do changes nothing.

    Raises:
        NotFound: no such tenant.
        asyncpg.InsufficientPrivilegeError: the caller is not the schema owner (SQLSTATE
            42501; agentdb does not wrap privilege errors: they are the DBA's to read).
    """
    rows = await _db.fetch_many(
        db, _Q["tenant_delete"], tenant_id=tenant_id, dry_run=dry_run, actor_id=actor
    )
    if not rows:
        raise _explain.not_found("tenant", tenant_id, tenant_id)
    steps = tuple(
        DeletionStep(
            r["step"],
            r["object"],
            r["action"],
            r["affected"],
            r["retained_until"],
            tuple(r["refs"] or ()),
        )
        for r in rows
    )
    return TenantDeletion(tenant_id, dry_run, steps)
