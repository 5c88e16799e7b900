"""Checks G6-G9: how state may move, and what the audit trail keeps.

Each check reads the :class:`~agentdb.tools.audit.detect.Context` and
returns one finding; none of them touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentdb.tools.audit import columns, fixes
from agentdb.tools.audit.catalog import Column, Table, quote
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings

__all__ = ["check_g6", "check_g7", "check_g8", "check_g9"]

# Most specific first: the first one a table has is the one judged.
_RETENTION = (
    "retain_until",
    "retention_until",
    "payload_expires_at",
    "expires_at",
    "purge_after",
    "delete_after",
)


def check_g6(ctx: Context) -> Finding:
    """G6: a BEFORE UPDATE trigger refuses state moves that are not allowed edges."""
    f = Findings()
    guarded = 0
    stateful = [(k, t) for k, t in ctx.stateful() if columns.state(t) is not None]
    for kind, t in stateful:
        state = columns.state(t)
        assert state is not None
        # A trigger limited to UPDATE OF other columns never sees a state change.
        guards = [
            g
            for g in t.update_guards(state.name, every_row=True)
            if not g.columns or state.name in g.columns
        ]
        if guards:
            guarded += 1
            f.ok(*(f"trigger {g.name}" for g in guards))
        else:
            f.bad(
                f"no trigger guards {t.name}.{state.name}: any UPDATE may move it "
                f"anywhere (e.g. {_example_move(t, state, kind)})",
                fixes.transition_guard(ctx, t, state, kind),
            )
    if not stateful:
        tasks = ctx.tasks
        f.bad(
            "no table with a lifecycle state to guard (see G1, G5)",
            None
            if tasks is None
            else fixes.state_column(ctx, tasks, "tasks")
            + "\n"
            + fixes.transition_guard(ctx, tasks, None, "tasks"),
        )
    return f.finding(
        "G6",
        core_missing=guarded == 0,
        enforced="a BEFORE UPDATE trigger refuses moves that are not allowed edges on "
        + ", ".join(t.name for _, t in stateful),
    )


def _example_move(t: Table, state: Column, kind: str) -> str:
    """A move out of a final state, in the column's own states."""
    values = fixes.state_values(t, state, kind)
    final = [v for v in values if v.lower() in columns.FINAL_STATES]
    start = [v for v in values if v.lower() not in columns.FINAL_STATES]
    if final and start:
        return f"{final[0]} -> {start[0]}"
    return "a finished row back to its first state"


def check_g7(ctx: Context) -> Finding:
    """G7: a BEFORE UPDATE trigger makes every write move the version by one."""
    f = Findings()
    core = True
    for t in (ctx.tasks, ctx.ops):
        if t is None:
            continue
        v = columns.version(t)
        if v is None:
            f.bad(
                f"{t.name} has no version column: a stale worker overwrites newer state",
                fixes.version_guard(ctx, t, None),
            )
            continue
        if t is ctx.tasks:
            core = False
        f.ok(f"column {t.name}.{v.name}")
        f.ok(*(f"check {c.name}" for c in t.checks_on(v.name) if c.columns == (v.name,)))
        guards = t.update_guards(v.name, every_row=True)
        if guards:
            f.ok(*(f"trigger {g.name}" for g in guards))
        else:
            f.bad(
                f"nothing moves {t.name}.{v.name} on every write: only writers that "
                f"remember '{v.name} = {v.name} + 1' are fenced",
                fixes.version_guard(ctx, t, v),
            )
    if ctx.tasks is None:
        f.bad("no task table (see G1)")
    return f.finding(
        "G7",
        core_missing=core,
        enforced="a BEFORE UPDATE trigger requires the version to move by +1 on "
        + ", ".join(t.name for t in (ctx.tasks, ctx.ops) if t is not None),
    )


def check_g8(ctx: Context) -> Finding:
    """G8: the event table is append-only and every state change writes an event.

    Events written by a trigger in the state change's transaction but open to
    UPDATE and DELETE hold half of it: partial.
    """
    f = Findings()
    ev = ctx.events
    if ev is None:
        base, create = fixes.events_table(ctx)
        fix = [create]
        tasks = ctx.tasks
        if tasks is not None:
            new_ev = _placeholder(ctx, base)
            link = fixes.event_link(ctx, tasks, new_ev, new_events=True)
            fix.append(fixes.append_only(ctx, new_ev, ("UPDATE", "DELETE", "TRUNCATE")))
            if link:
                fix.append(link)
        f.bad(
            "no event table (event/audit/log/history in the name, with an event type, actor, "
            "status or task reference); --map events=TABLE names it",
            "\n".join(fix),
        )
        return f.finding("G8", core_missing=True, enforced="")
    protected = {op: _protection(ev, op) for op in ("UPDATE", "DELETE", "TRUNCATE")}
    for by in protected.values():
        f.ok(*by)
    missing_ops = [op for op, by in protected.items() if not by]
    writers = sorted({g for g, p in ev.grants if p in missing_ops})
    if missing_ops:
        revoke = (
            f"\nREVOKE {', '.join(missing_ops)} ON {ev.display} FROM "
            f"{', '.join(quote(w) if w != 'public' else 'PUBLIC' for w in writers)};"
            if writers
            else ""
        )
        f.bad(
            f"{ev.name} is not append-only: {_and(missing_ops)} "
            "of audit rows is neither refused by a trigger nor withheld by privileges"
            + (f" (granted to {', '.join(writers)})" if writers else ""),
            fixes.append_only(ctx, ev, missing_ops) + revoke,
        )
    linked = 0
    for t in (ctx.tasks, ctx.ops):
        if t is None or columns.state(t) is None:
            continue
        links = [
            g
            for g in t.live_triggers()
            # One with a WHEN clause writes events for some changes only (a fan-in's
            # wake of the parent), not for every state change.
            if g.row and (g.on_update or g.on_insert) and not g.conditional and g.mentions(ev.name)
        ]
        if links:
            linked += 1
            f.ok(*(f"trigger {g.name}" for g in links))
        else:
            link = fixes.event_link(ctx, t, ev)
            f.bad(
                f"nothing ties a state change of {t.name} to an {ev.name} row in the same "
                "transaction",
                link
                or f"-- {ev.name} has required columns {t.name} cannot fill: write its row "
                f"in the statement that changes {t.name}",
            )
    core = not protected["UPDATE"] and not protected["DELETE"] and not linked
    return f.finding(
        "G8",
        core_missing=core,
        enforced=f"{ev.name} refuses UPDATE, DELETE and TRUNCATE; a trigger "
        "writes an event for every state change",
    )


def _placeholder(ctx: Context, base: str) -> Table:
    """The event table :func:`fixes.events_table` creates, as the link fix needs to name it."""
    return Table(0, base, fixes.name(ctx, base), "", False, False)


def _protection(t: Table, op: str) -> list[str]:
    """Objects that stop ``op`` on ``t``: a raising BEFORE trigger, an INSTEAD rule,
    or privileges - some role other than the owner inserts and none may ``op``
    (the owner is the migration role; writers connect as someone else). A trigger
    with a WHEN clause or an UPDATE column list, or a rule with a WHERE clause,
    stops some rows or columns only: it does not count."""
    by: list[str] = []
    for g in t.live_triggers():
        fires = {"UPDATE": g.on_update, "DELETE": g.on_delete, "TRUNCATE": g.on_truncate}[op]
        every = not g.conditional and (op != "UPDATE" or not g.columns)
        if fires and every and g.before and g.raises():
            by.append(f"trigger {g.name}")
    event = {"UPDATE": "2", "DELETE": "4"}.get(op)
    by += [
        f"rule {r.name}" for r in t.rules if r.instead and r.event == event and not r.conditional
    ]
    inserters = sorted({g for g, p in t.grants if p == "INSERT"})
    if inserters and not any(p == op for _, p in t.grants):
        withheld = [
            o for o in ("UPDATE", "DELETE", "TRUNCATE") if not any(p == o for _, p in t.grants)
        ]
        by.append(
            f"privileges: {', '.join(inserters)} may INSERT into {t.name}; "
            f"no role but its owner {t.owner} may {', '.join(withheld)}"
        )
    return by


def check_g9(ctx: Context) -> Finding:  # noqa: PLR0912 - one branch per table G9 covers
    """G9: payloads are size-capped; event payloads are secret-checked and expire.

    Events with no payload column carry facts only: nothing of theirs needs a
    cap, a secret check or a separate retention.
    """
    f = Findings()
    ev = ctx.events
    holds = False
    if ev is None:
        f.bad("no event table (see G8)")
    else:
        payloads = [c for c in ev.columns.values() if c.is_payload]
        if not payloads:
            holds = True
            f.ok(f"table {ev.name} (no payload column: events carry facts only)")
        for c in payloads:
            sized = _sized(ev, c)
            if sized:
                holds = True
                f.ok(*(f"check {n}" for n in sized))
            else:
                f.bad(
                    f"{ev.name}.{c.name} is unbounded: a whole prompt or provider response fits",
                    _size_fix(ev, c, 8192),
                )
            if not c.is_json:
                continue
            secret = [
                k.name
                for k in ev.checks_on(c.name)
                if re.search(r"secret|redact|sensitive|pii", k.definition, re.IGNORECASE)
            ]
            if secret:
                holds = True
                f.ok(*(f"check {n}" for n in secret))
            else:
                f.bad(
                    f"no CHECK keeps secrets out of {ev.name}.{c.name}",
                    f"ALTER TABLE {ev.display} ADD CONSTRAINT "
                    f"{quote(ev.name + '_' + c.name + '_no_secrets')} CHECK "
                    f"(NOT ({c.qname}::text ~* "
                    "'\"(password|passwd|secret|api_?key|access_?token|authorization)\"\\s*:'));",
                )
        keep = ev.col(*_RETENTION)
        if keep is not None:
            holds = True
            f.ok(f"column {ev.name}.{keep.name}")
        elif payloads:
            f.bad(
                f"{ev.name} has no retention column: payloads cannot expire apart "
                "from the audit skeleton",
                f"ALTER TABLE {ev.display} ADD COLUMN retain_until timestamptz NOT NULL "
                "DEFAULT now() + interval '400 days';",
            )
    for t in (ctx.tasks, ctx.ops, ctx.outbox):
        if t is None:
            continue
        for c in t.columns.values():
            if not c.is_payload or c.generated:
                continue
            sized = _sized(t, c)
            if sized:
                holds = True
                f.ok(*(f"check {n}" for n in sized))
            else:
                f.bad(f"{t.name}.{c.name} is unbounded", _size_fix(t, c, 65536))
    return f.finding(
        "G9",
        core_missing=not holds,
        enforced=f"every payload has a size CHECK; {ev.name if ev else ''} payloads "
        "are checked for secrets and expire apart from the skeleton",
    )


def _sized(t: Table, c: Column) -> list[str]:
    """The CHECKs that bound the size of ``c``."""
    return [
        k.name
        for k in t.checks_on(c.name)
        if re.search(r"\b(octet_length|length|pg_column_size)\(", k.definition)
    ]


def _size_fix(t: Table, c: Column, limit: int) -> str:
    """A CHECK capping ``c`` at ``limit`` bytes (of its text form, for JSON)."""
    size = f"octet_length({c.qname})" if c.base == "bytea" else f"octet_length({c.qname}::text)"
    return (
        f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_' + c.name + '_size')} "
        f"CHECK ({size} <= {limit});"
    )


def _and(items: Sequence[str]) -> str:
    """``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
