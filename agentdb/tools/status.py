"""``agentdb status``: the operator's report, as a table or JSON (and ``--watch``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from datetime import timedelta
from typing import Any

from agentdb import _db, migrate
from agentdb.budgets import Budget, RateLimit
from agentdb.errors import ConfigurationError
from agentdb.status import TASK_STATES, Snapshot, TenantStatus, snapshot
from agentdb.tools._common import add_target, dsn_from, run_with_pool

__all__ = ["add_status", "to_json", "to_table"]


def add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="tasks, leases, operations, outbox, inbox, purge backlog")
    add_target(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS (JSON Lines with --json)",
    )
    p.add_argument("--migrations", action="store_true", help="list migrations and whether applied")
    p.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    dsn = dsn_from(args)
    states = migrate.status(dsn, schema=args.schema, pooler=args.pooler)
    if args.migrations:
        _print_migrations(states, as_json=args.json)
        return 0
    if args.watch is not None and args.watch <= 0:
        raise ConfigurationError("--watch needs a positive number of seconds")
    applied = sum(s.applied for s in states)

    async def body(pool: _db.Pool) -> None:
        while True:
            snap = await snapshot(pool)
            if args.json:
                doc = to_json(snap, migrations={"applied": applied, "shipped": len(states)})
                # Watching: JSON Lines, one compact document per refresh.
                text = json.dumps(doc) if args.watch is not None else json.dumps(doc, indent=2)
                print(text, flush=True)
            else:
                header = (
                    f"agentdb status at {snap.at:%Y-%m-%d %H:%M:%S} UTC"
                    f" - schema: {applied} of {len(states)} migrations applied"
                )
                if args.watch is not None:
                    print("\033[2J\033[H", end="")
                print(to_table(snap, header=header), flush=True)
            if args.watch is None:
                return
            await asyncio.sleep(args.watch)

    run_with_pool(dsn, 2, body, schema=args.schema)
    return 0


def _print_migrations(states: list[migrate.MigrationState], *, as_json: bool) -> None:
    if as_json:
        payload = [
            {
                "id": s.id,
                "applied": s.applied,
                "applied_at": s.applied_at.isoformat() if s.applied_at else None,
            }
            for s in states
        ]
        print(json.dumps({"migrations": payload}, indent=2))
        return
    width = max(len(s.id) for s in states)
    for s in states:
        when = f"  {s.applied_at:%Y-%m-%d %H:%M:%S} UTC" if s.applied_at else ""
        print(f"{s.id:<{width}}  {'applied' if s.applied else 'pending'}{when}")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return str(timedelta(seconds=int(seconds)))


_TASK_HEAD = ("tenant", *TASK_STATES, "lease expired")
_DELIVERY_HEAD = ("tenant", "unknown ops", "outbox pending", "oldest", "outbox dead", "inbox")
_CLAIM_HEAD = ("tenant", "due now", "oldest due", "running", "cap", "task type caps")
_TYPE_CAPS = 36  # the task-type caps column is cut at this width


def _caps(t: TenantStatus) -> tuple[str, str]:
    """The tenant-wide cap as running/max, and the task-type caps the same way."""
    whole = t.limits.get("*")
    types = ", ".join(f"{k} {r}/{m}" for k, (r, m) in sorted(t.limits.items()) if k != "*")
    if len(types) > _TYPE_CAPS:
        types = types[: _TYPE_CAPS - 1] + "…"
    return (f"{whole[0]}/{whole[1]}" if whole else "-"), (types or "-")


_LABEL = 32  # a tenant name longer than this is cut: every line stays within 100 columns


def _label(t: TenantStatus) -> str:
    if t.tenant_id is None:
        return t.name
    tag = f" ({str(t.tenant_id)[:8]})"
    name = t.name if len(t.name) + len(tag) <= _LABEL else t.name[: _LABEL - len(tag) - 1] + "…"
    return name + tag


def _grid(head: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(head)]

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return "  ".join(
            v.rjust(w) if i else v.ljust(w)
            for i, (v, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(head), *(line(r) for r in rows)]


def to_table(s: Snapshot, *, header: str = "") -> str:
    """The readable report: tasks, delivery and claiming per tenant (under 100 columns)."""
    tenants = [s.total, *s.tenants]
    tasks = [
        [_label(t), *(str(t.tasks.get(k, 0)) for k in TASK_STATES), str(t.expired_leases)]
        for t in tenants
    ]
    delivery = [
        [
            _label(t),
            str(t.operations.get("unknown", 0)),
            str(t.outbox_pending),
            _age(t.outbox_oldest_pending_seconds),
            str(t.outbox_dead),
            str(t.inbox),
        ]
        for t in tenants
    ]
    claiming = [
        [_label(t), str(t.due), _age(t.oldest_due_seconds), str(t.tasks.get("running", 0)),
         *_caps(t)]
        for t in tenants
    ]  # fmt: skip
    b = s.purge_backlog
    lines = [header] if header else []
    lines += ["tasks", *_grid(_TASK_HEAD, tasks), "", "delivery", *_grid(_DELIVERY_HEAD, delivery)]
    lines += ["", "claiming (G18)", *_grid(_CLAIM_HEAD, claiming)]
    lines += _spending(s)
    lines.append(
        f"purge backlog: {b['event_payloads']} event payloads, {b['events']} events, "
        f"{b['outbox_delivered']} delivered outbox rows, {b['inbox']} inbox rows"
    )
    if (o := s.oldest_transaction) is not None:
        lines.append(
            f"oldest open transaction: {_age(o.seconds)} (pid {o.pid}, {o.login or '?'}, "
            f"{o.application_name or '-'}, {o.state or '?'}) - nothing it may see is cleaned up"
        )
    if s.processes:
        rows = [[p.kind, p.owner, p.node, str(p.sessions)] for p in s.processes]
        lines += ["", "workers and relays", *_grid(_PROCESS_HEAD, rows)]
    return "\n".join(lines)


_PROCESS_HEAD = ("kind", "id", "node", "sessions")


_BUDGET_HEAD = ("tenant", "budget", "window", "spent", "held", "limit", "left")
_RATE_HEAD = ("tenant", "rate limit", "used", "max", "per")


def _spending(s: Snapshot) -> list[str]:
    """Budgets and rate limits (G19); nothing when none is set."""
    spend = [
        [_label(t), b.unit + ("" if b.task_id is None else f" (task {str(b.task_id)[:8]})"),
         b.period, str(b.spent), str(b.held), str(b.limit), str(b.remaining)]
        for t in s.tenants for b in t.budgets
    ]  # fmt: skip
    rates = [
        [label, r.action, str(r.used), str(r.max_calls), str(r.per)]
        for label, limits in (
            *((_label(t), t.rate_limits) for t in s.tenants),
            ("(global)", s.global_rate_limits),
        )
        for r in limits
    ]
    lines: list[str] = []
    if spend:
        lines += ["", "budgets (G19)", *_grid(_BUDGET_HEAD, spend)]
    if rates:
        lines += ["", "rate limits (G19)", *_grid(_RATE_HEAD, rates)]
    return lines


def _budget_json(b: Budget) -> dict[str, Any]:
    return {
        "unit": b.unit, "task_id": str(b.task_id) if b.task_id else None, "period": b.period,
        "spent": b.spent, "held": b.held, "limit": b.limit, "remaining": b.remaining,
    }  # fmt: skip


def _rate_json(r: RateLimit) -> dict[str, Any]:
    return {
        "action": r.action, "used": r.used, "max_calls": r.max_calls,
        "per_seconds": r.per.total_seconds(),
    }  # fmt: skip


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
        "due": t.due,
        "oldest_due_seconds": t.oldest_due_seconds,
        "limits": {k: {"running": r, "max_running": m} for k, (r, m) in sorted(t.limits.items())},
        "budgets": [_budget_json(b) for b in t.budgets],
        "rate_limits": [_rate_json(r) for r in t.rate_limits],
    }


def to_json(s: Snapshot, *, migrations: dict[str, int] | None = None) -> dict[str, Any]:
    """The ``--json`` document (schema version 1)."""
    doc: dict[str, Any] = {
        "version": 1,
        "at": s.at.isoformat(),
        "total": _tenant_json(s.total),
        "tenants": [_tenant_json(t) for t in s.tenants],
        "purge_backlog": dict(s.purge_backlog),
        "global_rate_limits": [_rate_json(r) for r in s.global_rate_limits],
        "oldest_transaction": None
        if s.oldest_transaction is None
        else dataclasses.asdict(s.oldest_transaction),
        "processes": [dataclasses.asdict(p) for p in s.processes],
    }
    if migrations is not None:
        doc["migrations"] = migrations
    return doc
