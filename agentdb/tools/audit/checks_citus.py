"""On a Citus coordinator: what a schema distributed by tenant still needs.

Not a guarantee of its own: each line is a note of the report, said only when
the citus extension is installed. One tenant's rows of every table should
live on one worker (distributed by the tenant column, in the tenants table's
colocation group), so a tenant's write routes to that worker and commits
there; a unique key without the tenant column cannot be distributed; a
trigger that NOTIFYs fires on a worker, where the coordinator's listeners
never hear it, and makes the worker refuse two-phase commit; trigger DDL on a
distributed table needs ``citus.enable_unsafe_triggers``.
"""

from __future__ import annotations

import re

from agentdb.tools.audit.catalog import Table
from agentdb.tools.audit.detect import Context

__all__ = ["citus_notes"]

_NOTIFY = re.compile(r"\b(pg_notify\s*\(|notify\s+\w)", re.IGNORECASE)


def _tenant_tables(ctx: Context) -> list[Table]:
    return [t for t in ctx.cat.tables.values() if ctx.tc in t.columns]


def citus_notes(ctx: Context) -> list[str]:
    """The report's Citus notes; ``[]`` without the citus extension or without tenants."""
    cat = ctx.cat
    if cat.citus is None or ctx.single_tenant:
        return []
    tenants = cat.by_oid(ctx.tenants_oid) if ctx.tenants_oid is not None else None
    home = cat.distributed.get(tenants.oid) if tenants is not None else None
    notes: list[str] = []
    triggered: list[str] = []
    if tenants is not None and home is None:
        notes.append(
            f"Citus {cat.citus}: {tenants.name} is a local table on the coordinator; distribute "
            f"it first: SELECT create_distributed_table('{tenants.display}', "
            f"'{(tenants.pk_columns() or ('id',))[0]}');"
        )
    for t in sorted(_tenant_tables(ctx), key=lambda t: t.name):
        where = cat.distributed.get(t.oid)
        if where is None:
            keys = [
                c.name for c in t.constraints if c.type in ("p", "u") and ctx.tc not in c.columns
            ]
            if keys:
                notes.append(
                    f"Citus: {t.name} cannot be distributed by {ctx.tc} while its unique "
                    f"key(s) {', '.join(keys)} leave {ctx.tc} out: add it to each key first"
                )
            else:
                colocate = f", colocate_with => '{tenants.display}'" if tenants else ""
                notes.append(
                    f"Citus: {t.name} is a local table on the coordinator: every tenant's rows "
                    f"go through one node; SELECT create_distributed_table('{t.display}', "
                    f"'{ctx.tc}'{colocate});"
                )
        elif where[0] == "h" and where[1] != ctx.tc:
            notes.append(
                f"Citus: {t.name} is distributed by {where[1]}, not {ctx.tc}: one tenant's "
                "writes span workers and commit with two-phase commit"
            )
        elif where[0] == "h" and home is not None and where[2] != home[2]:
            other = tenants.name if tenants else "the tenants"
            notes.append(
                f"Citus: {t.name} is not colocated with {other}: a tenant's rows of the two "
                "live on different workers"
            )
        if where is not None:
            loud = [g.name for g in t.triggers if g.enabled and _NOTIFY.search(g.source)]
            if loud:
                notes.append(
                    f"Citus: trigger(s) {', '.join(loud)} on {t.name} NOTIFY from a worker: "
                    "coordinator listeners never hear it and the worker refuses PREPARE "
                    "TRANSACTION; notify from the application or poll"
                )
            if any(g.enabled for g in t.triggers):
                triggered.append(t.name)
    if triggered:
        notes.append(
            f"Citus: {', '.join(triggered)} have triggers: later trigger DDL on them needs "
            "SET LOCAL citus.enable_unsafe_triggers = on in the same transaction"
        )
    return notes
