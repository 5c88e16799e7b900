"""``agentdb tenant delete``: apply the tenant deletion policy (G17), or show what it would do.

``tenant create|list|get`` are the operator's (:mod:`agentdb.tools.operate`)."""

from __future__ import annotations

import argparse
import json
import uuid

from agentdb import _db
from agentdb.errors import ConfigurationError
from agentdb.tenancy import TenantDeletion, delete_tenant
from agentdb.tools._common import add_dsn, dsn_from, run_with_pool
from agentdb.tools.operate import add_tenant_actions

__all__ = ["add_tenant"]


def add_tenant(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tenant", help="tenant administration")
    tenant_sub = p.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    add_tenant_actions(tenant_sub)
    p = tenant_sub.add_parser("delete", help="apply the tenant deletion policy (G17)")
    p.add_argument("tenant_id", help="the tenant's id")
    add_dsn(p, help="postgresql:// URL of the schema owner (default: $DATABASE_URL)")
    p.add_argument("--schema", help="schema agentdb lives in (default: first on the search_path)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_true", help="report what would happen, change nothing"
    )
    mode.add_argument("--yes", action="store_true", help="do it")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_delete)


def _delete(args: argparse.Namespace) -> int:
    dsn = dsn_from(args)
    try:
        tenant_id = uuid.UUID(args.tenant_id)
    except ValueError:
        raise ConfigurationError(f"{args.tenant_id!r} is not a tenant id (a UUID)") from None
    if args.dry_run == args.yes:
        raise ConfigurationError("say --dry-run to see what would happen, or --yes to do it")

    async def body(pool: _db.Pool) -> TenantDeletion:
        return await delete_tenant(pool, tenant_id, dry_run=args.dry_run, actor="agentdb-cli")

    report = run_with_pool(dsn, 1, body, schema=args.schema)
    if args.json:
        print(json.dumps(_as_json(report), indent=2))
        return 0
    verb = "would" if report.dry_run else "did"
    print(f"tenant {tenant_id}: {'dry run' if report.dry_run else 'deletion'}")
    for s in report.steps:
        until = f" until {s.retained_until:%Y-%m-%d}" if s.retained_until else ""
        print(f"  {s.step:>2}. {s.object:<22} {s.action:<28} {s.affected:>6} rows{until}")
        for ref in s.refs:
            print(f"        {ref}")
    if report.complete:
        tail = "the tenant is gone"
    else:
        until = f" until {report.retained_until:%Y-%m-%d}" if report.retained_until else ""
        tail = f"audit events are retained{until}; run again then to finish"
    print(f"{verb}: {tail}")
    return 0


def _as_json(report: TenantDeletion) -> dict[str, object]:
    return {
        "tenant_id": str(report.tenant_id),
        "dry_run": report.dry_run,
        "complete": report.complete,
        "steps": [
            {
                "step": s.step,
                "object": s.object,
                "action": s.action,
                "rows": s.affected,
                "retained_until": s.retained_until.isoformat() if s.retained_until else None,
                "refs": list(s.refs),
            }
            for s in report.steps
        ],
    }
