"""Check G19: spend budgets and rate limits the database refuses to exceed at reserve.

What the catalog can show: a budget table (a limit beside what is spent or
held) whose CHECK ties the two, so no writer can take it past its limit; and
a rate-limit table (a maximum count per window) that a row trigger on the
operation table reads and that can refuse. Whether the application holds
the estimate in the same statement as the reservation is its own business;
what the schema makes impossible is what is reported.
"""

from __future__ import annotations

import re

from agentdb.tools.audit import fixes
from agentdb.tools.audit.catalog import Table, quote
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, not_applicable

__all__ = ["check_g19"]

_LIMIT = re.compile(r"^(limit|limit_amount|budget|max_amount|max_spend|quota|cap|allowance)$")
_SPENT = re.compile(r"^(spent|used|consumed|held|reserved|spend)$")
_RATE = re.compile(r"^(max_calls|max_requests|rate|rate_limit|calls_per|requests_per|max_per)")
_WINDOW = re.compile(r"^(per|window|interval|period|window_seconds|per_seconds)$")


def _budget_tables(ctx: Context) -> list[Table]:
    return [
        t
        for t in ctx.cat.tables.values()
        if any(_LIMIT.match(c) for c in t.columns)
        and any(_SPENT.match(c) for c in t.columns)
        and not any(_RATE.match(c) for c in t.columns)
    ]


def _rate_tables(ctx: Context) -> list[Table]:
    return [
        t
        for t in ctx.cat.tables.values()
        if any(_RATE.match(c) for c in t.columns) and any(_WINDOW.match(c) for c in t.columns)
    ]


def _caps_spending(definition: str, spent: str, limit: str) -> bool:
    """Whether a CHECK's text bounds ``spent`` (alone or in a sum) by ``limit``."""
    s, lim = re.escape(spent), re.escape(limit)
    between = r"(?:(?!\b(?:AND|OR)\b)[^<>=])*"  # one comparison: no AND / OR in between
    return (
        re.search(rf"\b{s}\b{between}<=?\s*\(*\s*{lim}\b", definition, re.I) is not None
        or re.search(rf"\b{lim}\b\s*\)*\s*>=?{between}\b{s}\b", definition, re.I) is not None
    )


def _limit_checks(t: Table) -> list[str]:
    """CHECKs that keep a spent/held column at or under a limit column."""
    return [
        c.name
        for c in t.of("c")
        if any(
            _caps_spending(c.definition, x, y)
            for x in c.columns if _SPENT.match(x)
            for y in c.columns if _LIMIT.match(y)
        )
    ]  # fmt: skip


def check_g19(ctx: Context) -> Finding:
    """G19: a budget CHECK (spent + held <= limit) and rate limits a trigger enforces."""
    ops = ctx.ops
    if ops is None:
        return not_applicable("G19", "no operation table: nothing is reserved to count or cost")
    f = Findings()
    budgets = _budget_tables(ctx)
    checked = [(t, _limit_checks(t)) for t in budgets]
    if any(names for _, names in checked):
        f.ok(*(f"check {n}" for _, names in checked for n in names))
    elif budgets:
        t = budgets[0]
        limit = next(c for c in t.columns if _LIMIT.match(c))
        spent = [c for c in t.columns if _SPENT.match(c)]
        total = " + ".join(t.q(c) for c in spent)
        f.bad(
            f"{t.name} keeps budgets but no CHECK ties {', '.join(spent)} to {limit}: any "
            "writer can spend past the limit",
            f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_within_limit')} "
            f"CHECK ({total} <= {t.q(limit)});",
        )
    else:
        tc = ctx.tc if not ctx.single_tenant and ctx.tc in ops.columns else None
        key = f"{quote(tc)} {ops.columns[tc].type} NOT NULL, " if tc else ""
        pk = f"{quote(tc)}, unit" if tc else "unit"
        f.bad(
            f"no budget table: nothing in the database stops a runaway loop from spending "
            f"past a limit when {ops.name} rows are reserved",
            f"CREATE TABLE {fixes.name(ctx, ops.name + '_budgets')} ({key}unit text NOT NULL, "
            "limit_amount bigint NOT NULL, spent bigint NOT NULL DEFAULT 0, held bigint NOT NULL "
            f"DEFAULT 0, PRIMARY KEY ({pk}), CHECK (spent + held <= limit_amount)); -- hold the "
            "estimate in the reserve statement, settle on completion",
        )
    rates = _rate_tables(ctx)
    guards = ops.guards_reading(rates, "insert")
    if rates and guards:
        f.ok(*(f"table {r.name}" for r in rates), *(f"trigger {g.name}" for g in guards))
    elif rates:
        f.bad(
            f"{rates[0].name} holds rate limits but no trigger on {ops.name} reads it: a "
            "writer that skips the application's check calls the provider over the limit",
            f"CREATE TRIGGER {quote(ops.name + '_rate_limit')} AFTER INSERT ON {ops.display} "
            "FOR EACH ROW EXECUTE FUNCTION count_call(); -- count the call in its window, RAISE "
            "over the limit",
        )
    else:
        f.bad(
            f"no rate-limit table: {ops.name} rows can be reserved at any rate, whatever the "
            "provider allows",
            f"CREATE TABLE {fixes.name(ctx, ops.name + '_rate_limits')} (action text PRIMARY KEY, "
            "max_calls integer NOT NULL CHECK (max_calls >= 0), per interval NOT NULL, "
            "window_start timestamptz NOT NULL DEFAULT '-infinity', used integer NOT NULL "
            "DEFAULT 0, CHECK (used <= max_calls)); -- and a trigger on "
            f"{ops.name} that counts each reservation",
        )
    return f.finding(
        "G19",
        core_missing=not any(names for _, names in checked) and not guards,
        enforced=f"a CHECK keeps every budget's spent and held within its limit, and a "
        f"trigger on {ops.name} refuses a reservation over its rate limit",
    )
