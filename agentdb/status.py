"""What an operator needs to know, per tenant and overall - read-only, for a health endpoint.

Tasks by state, leases expired but not reclaimed (a worker died), tasks due
now and the wait of the oldest, running tasks against each concurrency cap
(G18), operations in unknown state (reconcile them), outbox pending / age of
the oldest pending message / dead messages, inbox size, budgets (used / held
/ limit) and rate limits (used in the window / max) (G19), the purge
backlog, and the oldest open transaction that holds back cleanup. ``agentdb status``
renders a :class:`Snapshot` (:mod:`agentdb.tools.status`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agentdb import _db, budgets
from agentdb._citus import routing
from agentdb.budgets import Budget, RateLimit
from agentdb.retention import DEFAULT_AGES

__all__ = ["TASK_STATES", "OpenTransaction", "Process", "Snapshot", "TenantStatus", "snapshot"]

#: The task states, in the order a report lists them (agent_tasks_state_valid).
TASK_STATES = ("pending", "waiting", "running", "succeeded", "failed", "dead", "cancelled")
_Q = _db.queries(__name__)
_BACKLOG = ("event_payloads", "events", "outbox_delivered", "inbox")


@dataclass
class TenantStatus:
    tenant_id: uuid.UUID | None
    name: str
    tasks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TASK_STATES, 0))
    expired_leases: int = 0
    operations: dict[str, int] = field(
        default_factory=lambda: {"reserved": 0, "in_flight": 0, "unknown": 0}
    )
    outbox_pending: int = 0
    outbox_oldest_pending_seconds: float | None = None
    outbox_dead: int = 0
    inbox: int = 0
    #: Tasks due now, and how long the oldest of them has waited (G18).
    due: int = 0
    oldest_due_seconds: float | None = None
    #: Concurrency caps (G18): task type ('*' for all) -> (running, max_running).
    limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Budgets and rate limits (G19), with their books and counts now.
    budgets: list[Budget] = field(default_factory=list)
    rate_limits: list[RateLimit] = field(default_factory=list)

    def add(self, other: TenantStatus) -> None:
        for k, v in other.tasks.items():
            self.tasks[k] = self.tasks.get(k, 0) + v
        for k, v in other.operations.items():
            self.operations[k] = self.operations.get(k, 0) + v
        self.expired_leases += other.expired_leases
        self.outbox_pending += other.outbox_pending
        self.outbox_dead += other.outbox_dead
        self.inbox += other.inbox
        self.due += other.due
        self.outbox_oldest_pending_seconds = _oldest(
            self.outbox_oldest_pending_seconds, other.outbox_oldest_pending_seconds
        )
        self.oldest_due_seconds = _oldest(self.oldest_due_seconds, other.oldest_due_seconds)


def _oldest(a: float | None, b: float | None) -> float | None:
    ages = [x for x in (a, b) if x is not None]
    return max(ages) if ages else None


@dataclass(frozen=True)
class OpenTransaction:
    """The oldest transaction of another session that keeps row versions from being removed."""

    pid: int
    login: str | None
    application_name: str | None
    #: pg_stat_activity's state: 'idle in transaction' is the forgotten kind.
    state: str | None
    seconds: float


@dataclass(frozen=True)
class Process:
    """A worker or relay connected now, and the database node its sessions are on."""

    kind: str  # 'worker' or 'relay'
    owner: str  # its lease owner name (worker_id, relay_id)
    node: str  # host:port of the server (on Citus: the coordinator or a worker node)
    sessions: int


@dataclass
class Snapshot:
    at: datetime
    tenants: list[TenantStatus]
    total: TenantStatus
    purge_backlog: dict[str, int]
    #: Rate limits across tenants (G19; none on Citus).
    global_rate_limits: list[RateLimit] = field(default_factory=list)
    #: None when no other session (that this role may see) has a transaction open.
    oldest_transaction: OpenTransaction | None = None
    #: The workers and relays connected now (that this role may see), by name.
    processes: list[Process] = field(default_factory=list)


async def _processes(db: _db.Executor) -> list[Process]:
    """The workers and relays connected now; on Citus, to any node of the cluster."""
    query = "status_processes_citus" if await routing.distributed(db) else "status_processes"
    out = []
    for r in await _db.fetch_many(db, _Q[query]):
        _, kind, owner = str(r["application_name"]).split(" ", 2)
        out.append(Process(kind, owner, f"{r['node_host']}:{r['node_port']}", r["sessions"]))
    return out


async def snapshot(db: _db.Executor) -> Snapshot:
    """Read the current status (read-only; see ``queries/status.sql`` for what each costs)."""
    names = {r["id"]: r["name"] for r in await _db.fetch_many(db, _Q["status_tenants"])}
    per: dict[uuid.UUID, TenantStatus] = {}

    def of(tid: uuid.UUID) -> TenantStatus:
        if tid not in per:
            per[tid] = TenantStatus(tid, names.get(tid, "?"))
        return per[tid]

    for r in await _db.fetch_many(db, _Q["status_tasks"]):
        of(r["tenant_id"]).tasks[r["state"]] = r["n"]
    for r in await _db.fetch_many(db, _Q["status_expired_leases"]):
        of(r["tenant_id"]).expired_leases = r["n"]
    for r in await _db.fetch_many(db, _Q["status_unsettled_operations"]):
        of(r["tenant_id"]).operations[r["state"]] = r["n"]
    for r in await _db.fetch_many(db, _Q["status_outbox"]):
        t = of(r["tenant_id"])
        t.outbox_pending += r["pending"]
        t.outbox_dead += r["dead"]
        if r["oldest"] is not None:
            t.outbox_oldest_pending_seconds = float(r["oldest"])
    for r in await _db.fetch_many(db, _Q["status_inbox"]):
        of(r["tenant_id"]).inbox = r["n"]
    for r in await _db.fetch_many(db, _Q["status_due"]):
        t = of(r["tenant_id"])
        t.due, t.oldest_due_seconds = r["due"], float(r["oldest"])
    for r in await _db.fetch_many(db, _Q["status_limits"]):
        of(r["tenant_id"]).limits[r["task_type"]] = (r["running"], r["max_running"])
    for b in await budgets.list_budgets(db):
        of(b.tenant_id).budgets.append(b)
    shared: list[RateLimit] = []
    for rl in await budgets.list_rate_limits(db):
        if rl.tenant_id is None:
            shared.append(rl)
        else:
            of(rl.tenant_id).rate_limits.append(rl)

    backlog = await _db.fetch_one(
        db,
        _Q["status_purge_backlog"],
        outbox_delivered=DEFAULT_AGES["outbox_delivered"],
        inbox=DEFAULT_AGES["inbox"],
    )
    old = await _db.fetch_optional(db, _Q["status_oldest_transaction"])
    processes = await _processes(db)
    total = TenantStatus(None, "ALL")
    tenants = sorted(per.values(), key=lambda t: (t.name, str(t.tenant_id)))
    for t in tenants:
        total.add(t)
    return Snapshot(
        datetime.now(UTC),
        tenants,
        total,
        {k: int(backlog[k]) for k in _BACKLOG},
        shared,
        None
        if old is None
        else OpenTransaction(
            old["pid"], old["login"], old["application_name"], old["state"], float(old["seconds"])
        ),
        processes,
    )
