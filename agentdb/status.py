"""``agentdb status``: what an operator needs to know, per tenant and overall.

Tasks by state, leases expired but not reclaimed (a worker died), operations
in unknown state (reconcile them), outbox pending / age of the oldest pending
message / dead messages, inbox size, and the purge backlog.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agentdb import _exec
from agentdb.errors import AgentDBError
from agentdb.retention import DEFAULT_AGES

__all__ = ["Snapshot", "TenantStatus", "snapshot", "to_json", "to_table"]

TASK_STATES = ("pending", "waiting", "running", "succeeded", "failed", "dead", "cancelled")
_Q = _exec.QUERIES
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

    def add(self, other: TenantStatus) -> None:
        for k, v in other.tasks.items():
            self.tasks[k] = self.tasks.get(k, 0) + v
        for k, v in other.operations.items():
            self.operations[k] = self.operations.get(k, 0) + v
        self.expired_leases += other.expired_leases
        self.outbox_pending += other.outbox_pending
        self.outbox_dead += other.outbox_dead
        self.inbox += other.inbox
        ages = [
            a
            for a in (self.outbox_oldest_pending_seconds, other.outbox_oldest_pending_seconds)
            if a is not None
        ]
        self.outbox_oldest_pending_seconds = max(ages) if ages else None


@dataclass
class Snapshot:
    at: datetime
    tenants: list[TenantStatus]
    total: TenantStatus
    purge_backlog: dict[str, int]


async def snapshot(db: _exec.Executor) -> Snapshot:
    """Read the current status (read-only; every query is index-served)."""
    names = {r["id"]: r["name"] for r in await _exec.fetch_many(db, _Q["status_tenants"])}
    per: dict[uuid.UUID, TenantStatus] = {}

    def of(tid: uuid.UUID) -> TenantStatus:
        if tid not in per:
            per[tid] = TenantStatus(tid, names.get(tid, "?"))
        return per[tid]

    for r in await _exec.fetch_many(db, _Q["status_tasks"]):
        of(r["tenant_id"]).tasks[r["state"]] = r["n"]
    for r in await _exec.fetch_many(db, _Q["status_expired_leases"]):
        of(r["tenant_id"]).expired_leases = r["n"]
    for r in await _exec.fetch_many(db, _Q["status_unsettled_operations"]):
        of(r["tenant_id"]).operations[r["state"]] = r["n"]
    for r in await _exec.fetch_many(db, _Q["status_outbox"]):
        t = of(r["tenant_id"])
        t.outbox_pending += r["pending"]
        t.outbox_dead += r["dead"]
        if r["oldest"] is not None:
            t.outbox_oldest_pending_seconds = float(r["oldest"])
    for r in await _exec.fetch_many(db, _Q["status_inbox"]):
        of(r["tenant_id"]).inbox = r["n"]

    async def never() -> AgentDBError:
        return AgentDBError("status_purge_backlog returned no row")

    backlog = await _exec.fetch_one(
        db, _Q["status_purge_backlog"], DEFAULT_AGES["outbox_delivered"], DEFAULT_AGES["inbox"],
        on_zero=never,
    )  # fmt: skip
    total = TenantStatus(None, "ALL")
    tenants = sorted(per.values(), key=lambda t: (t.name, str(t.tenant_id)))
    for t in tenants:
        total.add(t)
    return Snapshot(datetime.now(UTC), tenants, total, {k: int(backlog[k]) for k in _BACKLOG})


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return str(timedelta(seconds=int(seconds)))


def to_table(s: Snapshot, *, header: str = "") -> str:
    """The readable report."""
    cols = ["tenant", *TASK_STATES, "expired leases", "unknown ops", "outbox pending",
            "oldest pending", "outbox dead", "inbox"]  # fmt: skip
    rows: list[list[str]] = []
    for t in [s.total, *s.tenants]:
        label = t.name if t.tenant_id is None else f"{t.name} ({str(t.tenant_id)[:8]})"
        rows.append([
            label, *(str(t.tasks.get(k, 0)) for k in TASK_STATES), str(t.expired_leases),
            str(t.operations.get("unknown", 0)), str(t.outbox_pending),
            _age(t.outbox_oldest_pending_seconds), str(t.outbox_dead), str(t.inbox),
        ])  # fmt: skip
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [header] if header else []
    lines.append(
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        )
    )
    for r in rows:
        lines.append(
            "  ".join(
                v.rjust(w) if i else v.ljust(w)
                for i, (v, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    b = s.purge_backlog
    lines.append(
        f"purge backlog: {b['event_payloads']} event payloads, {b['events']} events, "
        f"{b['outbox_delivered']} delivered outbox rows, {b['inbox']} inbox rows"
    )
    return "\n".join(lines)


def _tenant_json(t: TenantStatus) -> dict[str, Any]:
    return {
        "tenant_id": str(t.tenant_id) if t.tenant_id else None,
        "name": t.name,
        "tasks": dict(t.tasks),
        "expired_leases": t.expired_leases,
        "operations_unsettled": dict(t.operations),
        "outbox": {
            "pending": t.outbox_pending,
            "oldest_pending_seconds": t.outbox_oldest_pending_seconds,
            "dead": t.outbox_dead,
        },
        "inbox": t.inbox,
    }


def to_json(s: Snapshot, *, migrations: dict[str, int] | None = None) -> dict[str, Any]:
    """The ``--json`` document (schema version 1)."""
    doc: dict[str, Any] = {
        "version": 1,
        "at": s.at.isoformat(),
        "total": _tenant_json(s.total),
        "tenants": [_tenant_json(t) for t in s.tenants],
        "purge_backlog": dict(s.purge_backlog),
    }
    if migrations is not None:
        doc["migrations"] = migrations
    return doc
