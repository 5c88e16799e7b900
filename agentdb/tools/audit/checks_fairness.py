"""Check G18: tenants share the workers, and a tenant's concurrency cap is enforced.

What the catalog can show: a due index that leads with the tenant column
(so a claim can walk tenants instead of taking one backlog in time order),
a table of per-tenant caps, and a trigger on the task table that reads that
table and can refuse. The claim statement itself lives in the application,
so fairness is judged by whether the schema makes a per-tenant claim cheap.
"""

from __future__ import annotations

import re

from agentdb.tools.audit.catalog import Table, quote
from agentdb.tools.audit.detect import STATE, WAKE, Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable, single_tenant

__all__ = ["check_g18"]

_CAP_COLUMN = re.compile(r"^(max_running|max_concurrency|concurrency(_limit)?|max_active|limit)$")


def _cap_tables(ctx: Context, tasks: Table) -> list[Table]:
    """Tables other than the task table with the tenant column and a cap-like column."""
    return [
        t
        for t in ctx.cat.tables.values()
        if t.oid != tasks.oid
        and ctx.tc in t.columns
        and any(_CAP_COLUMN.match(c) for c in t.columns)
    ]


def check_g18(ctx: Context) -> Finding:
    """G18: a tenant-leading due index, and caps a trigger on the task table enforces."""
    t = ctx.tasks
    if t is None:
        return not_applicable("G18", "no task table: nothing is claimed")
    alone = single_tenant("G18", ctx.single_tenant, ctx.tc, ctx.tenant_candidate)
    if alone is not None:
        return alone
    if ctx.tc not in t.columns:
        return not_applicable(
            "G18",
            f"{t.name} has no {ctx.tc} column: a single-tenant queue has no one to share with",
        )
    f = Findings()
    wake = t.col(*WAKE)
    state = t.col(*STATE)
    leading = [i for i in t.indexes if i.valid and i.columns and i.columns[0] == ctx.tc]
    due = [i for i in leading if wake is not None and wake.name in i.columns]
    if due:
        f.ok(*(f"index {i.name}" for i in due))
    else:
        cols = ", ".join(t.q(c) for c in (ctx.tc, wake.name if wake else "wake_at"))
        f.bad(
            f"no index on {t.name} leads with {ctx.tc} and its due time: a claim can only take "
            "due work in time order across tenants, so one tenant's backlog delays the others",
            f"CREATE INDEX {quote(t.name + '_tenant_due_idx')} ON {t.display} ({cols});",
        )
    caps = _cap_tables(ctx, t)
    guards = t.guards_reading(caps, "update")
    if caps and guards:
        f.ok(*(f"table {c.name}" for c in caps), *(f"trigger {g.name}" for g in guards))
    elif caps:
        f.bad(
            f"{caps[0].name} holds caps but no trigger on {t.name} reads it: a writer that "
            "skips the application's check runs more tasks than the cap",
            f"CREATE TRIGGER {quote(t.name + '_concurrency_guard')} AFTER UPDATE OF "
            f"{state.qname if state else 'state'} ON {t.display} FOR EACH ROW EXECUTE FUNCTION "
            f"guard_concurrency(); -- lock the {caps[0].name} row, count running rows, RAISE "
            "over the cap",
        )
    else:
        f.bad(
            f"no per-tenant cap on running {t.name} rows: one tenant can take every worker",
            f"CREATE TABLE {quote(t.name + '_limits')} ({quote(ctx.tc)} "
            f"{t.columns[ctx.tc].type} PRIMARY KEY, max_running integer CHECK "
            "(max_running >= 0)); -- and a trigger that refuses a start over the cap",
        )
    return f.finding(
        "G18",
        core_missing=not due and not caps,
        enforced=f"{t.name} is claimed per tenant through a tenant-leading due index, and "
        "a trigger refuses a start over a tenant's cap",
    )
