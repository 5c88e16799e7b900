"""Checks G10-G13: messages leave reliably, leases are fenced, doubt is findable.

Each check reads the :class:`~agentdb.tools.audit.detect.Context` and
returns one finding; none of them touches the database.
"""

from __future__ import annotations

import re

from agentdb.tools.audit import columns, fixes
from agentdb.tools.audit.catalog import Column, Index, Table, quote
from agentdb.tools.audit.detect import DELIVERED, MESSAGE_ID, STATE, Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import (
    Findings,
    not_applicable,
    state_evidence,
    value_set,
)

__all__ = ["check_g10", "check_g11", "check_g12", "check_g13"]

# Most specific first: the first one a table has is the one judged.
_NEXT_ATTEMPT = ("next_attempt_at", "available_at", "run_at", "scheduled_at")
_UNSETTLED_ORDER = ("updated_at", "created_at", "id")
_UNKNOWN_STATES = frozenset(
    {"unknown", "indeterminate", "in_doubt", "uncertain", "needs_reconciliation", "reconciling"}
)


def _finds_unknown(index: Index, state: Column) -> bool:
    """Does the index find operations in doubt? Led by the state column, or partial
    on a predicate that selects an unknown-like state (a retention index over
    settled rows does not count)."""
    if index.columns and index.columns[0] == state.name:
        return True
    pred = index.predicate or ""
    if not re.search(rf"(?<![\w\"]){re.escape(state.qname)}(?![\w\"])", pred):
        return False
    named = {v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", pred)}
    if "<>" in pred or re.search(r"\bNOT\b", pred):
        return not named & _UNKNOWN_STATES  # e.g. state <> ALL ('succeeded', 'failed')
    return bool(named & _UNKNOWN_STATES)


def check_g10(ctx: Context) -> Finding:
    """G10: the outbox keeps a checked delivery state, indexed for the relay."""
    f = Findings()
    ob = ctx.outbox
    if ob is None:
        tenant = "" if ctx.single_tenant else f"{quote(ctx.tc)} {_tenant_type(ctx)} NOT NULL, "
        key = "id" if ctx.single_tenant else f"{quote(ctx.tc)}, id"
        outbox = fixes.name(ctx, "outbox")
        f.bad(
            "no outbox table: a crash between commit and publish loses the message",
            f"CREATE TABLE {outbox} ({tenant}id uuid NOT NULL DEFAULT "
            "gen_random_uuid(), topic text NOT NULL, payload jsonb NOT NULL CHECK "
            "(octet_length(payload::text) <= 65536), state text NOT "
            "NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')), "
            "attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL "
            f"DEFAULT now(), delivered_at timestamptz, PRIMARY KEY ({key}));\n"
            f"CREATE INDEX outbox_pending_idx ON {outbox} (next_attempt_at) "
            "WHERE state = 'pending';" + fixes.tenant_scoped(ctx, "outbox"),
        )
        return f.finding("G10", core_missing=True, enforced="")
    f.ok(f"table {ob.name}")
    state = ob.col(*STATE)
    delivered = ob.col(*DELIVERED)
    if state is not None and value_set(ob, state)[0]:
        f.ok(*state_evidence(ob, state))
    elif delivered is not None:
        f.ok(f"column {ob.name}.{delivered.name}")
    else:
        f.bad(
            f"{ob.name} has no checked delivery state (state with a CHECK, or delivered_at)",
            f"ALTER TABLE {ob.display} ADD COLUMN delivered_at timestamptz;",
        )
    if delivered is not None and state is not None:
        both = {state.name, delivered.name}
        f.ok(*(f"check {c.name}" for c in ob.of("c") if both <= set(c.columns)))
    pending = [i.name for i in ob.indexes if _serves_pending(i, state, delivered)]
    if pending:
        f.ok(*(f"index {n}" for n in pending))
    else:
        order = ob.col(*_NEXT_ATTEMPT, "created_at")
        if state is not None:
            where = f"{state.qname} = 'pending'"
        elif delivered is not None:
            where = f"{delivered.qname} IS NULL"
        else:
            where = "... -- your undelivered rows"
        f.bad(
            f"no index serves the relay's query for pending {ob.name} rows",
            f"CREATE INDEX {quote(ob.name + '_pending_idx')} ON {ob.display} "
            f"({order.qname if order else 'created_at'}) WHERE {where};",
        )
    return f.finding(
        "G10",
        core_missing=False,
        enforced=f"{ob.name} keeps a checked delivery state, indexed for the relay",
    )


def _tenant_type(ctx: Context) -> str:
    """The tenant column's type where the schema has it (uuid otherwise)."""
    return next(
        (t.columns[ctx.tc].type for t in ctx.cat.tables.values() if ctx.tc in t.columns), "uuid"
    )


def _serves_pending(i: Index, state: Column | None, delivered: Column | None) -> bool:
    """Does the index find undelivered rows (by its predicate or its leading column)?"""
    pred = i.predicate or ""
    if (
        state is not None
        and re.search(rf"(?<![\w\"]){re.escape(state.qname)}\b", pred)
        and re.search(r"'(pending|queued|new|ready|scheduled)'", pred)
    ):
        return True
    if delivered is not None and re.search(
        rf"(?<![\w\"]){re.escape(delivered.qname)}\)? IS NULL|NOT {re.escape(delivered.qname)}",
        pred,
    ):
        return True
    return bool(i.columns) and i.columns[0] in _NEXT_ATTEMPT


def check_g11(ctx: Context) -> Finding:
    """G11: outbox rows have a stable key and an inbox records processed ids."""
    f = Findings()
    tc = quote(ctx.tc)
    scope = "" if ctx.single_tenant else f"{tc}, "
    ob, inbox = ctx.outbox, ctx.kinds["inbox"]
    if ob is None:
        return not_applicable("G11", "no outbox, so nothing is relayed to deduplicate (see G10)")
    core = False
    if ob.pk is not None:
        f.ok(f"pk {ob.pk.name}")
    else:
        core = True
        f.bad(
            f"{ob.name} has no primary key: messages have no stable id to deduplicate on",
            f"ALTER TABLE {ob.display} ADD PRIMARY KEY ({scope}id);",
        )
    if inbox is None:
        f.bad(
            "no inbox table records processed message ids on the consumer side",
            f"CREATE TABLE {fixes.name(ctx, 'inbox')} ("
            + ("" if ctx.single_tenant else f"{tc} {_tenant_type(ctx)} NOT NULL, ")
            + "consumer text NOT NULL, message_id uuid NOT NULL, processed_at timestamptz NOT "
            f"NULL DEFAULT now(), PRIMARY KEY ({scope}consumer, message_id));"
            + fixes.tenant_scoped(ctx, "inbox"),
        )
    else:
        mid = inbox.col(*MESSAGE_ID)
        keys = [(n, cols) for n, cols, _ in inbox.unique_keys()]
        if inbox.pk is not None:
            keys.append((inbox.pk.name, inbox.pk.columns))
        covering = [n for n, cols in keys if mid is not None and mid.name in cols]
        if covering:
            f.ok(*(f"key {n}" for n in covering))
        else:
            f.bad(
                f"{inbox.name} has no key on a message id: a redelivery is processed again",
                f"ALTER TABLE {inbox.display} ADD CONSTRAINT "
                f"{quote(inbox.name + '_message_key')} UNIQUE ({scope}"
                + ("consumer, " if "consumer" in inbox.columns else "")
                + f"{mid.qname if mid else 'message_id'});",
            )
    return f.finding(
        "G11",
        core_missing=core,
        enforced=f"{ob.name} rows have a stable key; {inbox.name if inbox else ''} "
        "records each processed message id once",
    )


def check_g12(ctx: Context) -> Finding:
    """G12: task leases are complete (owner with expiry) and fenced by a growing token.

    A lease another worker takes over (after an expiry, a stale heartbeat or
    a timeout) without a fencing token holds part of it: the task is taken
    over, but the old holder can still write - partial.
    """
    f = Findings()
    t = ctx.tasks
    if t is None:
        f.bad("no task table (see G1)", None)
        return f.finding("G12", core_missing=True, enforced="")
    lease = columns.lease(ctx.cat, t)
    owner, takeover, token = lease.owner, lease.takeover, lease.token
    fix = fixes.lease_fence(ctx, t, lease)
    if takeover is None:
        held = f"{owner.name} names an owner but" if owner else "no owner and"
        f.bad(
            f"{t.name} has no lease: {held} no expiry, heartbeat or lock time, so no "
            "takeover of a crashed worker's task is visible to the database",
            fix,
        )
    else:
        f.ok(*(f"column {t.name}.{c.name}" for c in lease.columns if c is not token))
        if lease.heartbeat is not None:
            f.ok(f"heartbeat {lease.heartbeat}")
        if owner is None:
            f.bad(
                f"{t.name} is taken over by {takeover} but records no owner: any worker may "
                "complete a task it does not hold",
                fix,
            )
        if owner is not None and lease.expires is not None:
            whole = [
                c.name for c in t.of("c") if {owner.name, lease.expires.name} <= set(c.columns)
            ]
            if whole:
                f.ok(*(f"check {n}" for n in whole))
            else:
                f.bad(
                    f"no CHECK keeps the lease whole: {owner.name} without "
                    f"{lease.expires.name} never expires",
                    fix,
                )
    if token is None:
        if takeover is not None:
            f.bad(
                f"{t.name} is taken over by {takeover}"
                + (f" from {owner.name}" if owner is not None else "")
                + " without a fencing token: a worker whose lease expired and was taken over "
                "can still complete the task",
                fix,
            )
    else:
        f.ok(f"column {t.name}.{token.name}")
        guards = t.update_guards(token.name)
        if guards:
            f.ok(*(f"trigger {g.name}" for g in guards))
        else:
            f.bad(
                f"nothing stops {t.name}.{token.name} going backwards or a new lease "
                "reusing the old token",
                fix,
            )
    return f.finding(
        "G12",
        core_missing=takeover is None,
        enforced=f"{t.name} leases are complete and fenced by a growing token",
    )


def check_g13(ctx: Context) -> Finding:
    """G13: operations have an 'unknown' state and an index over unsettled rows."""
    f = Findings()
    ops = ctx.ops
    if ops is None:
        f.bad("no operation table (see G1)", fixes.ops_table(ctx))
        return f.finding("G13", core_missing=True, enforced="")
    state = columns.state(ops)
    order = ops.col(*_UNSETTLED_ORDER)
    ok = 0
    if state is None:
        f.bad(
            f"{ops.name} has no state column (see G5)",
            fixes.state_column(ctx, ops, "operations")
            + f"\nCREATE INDEX {quote(ops.name + '_unsettled_idx')} ON {ops.display} "
            f"(state{', ' + order.qname if order else ''});",
        )
    else:
        _, values = value_set(ops, state)
        unknown = sorted((values or frozenset()) & _UNKNOWN_STATES)
        if unknown:
            ok += 1
            f.ok(*(f"{e} (has '{unknown[0]}')" for e in state_evidence(ops, state)))
        else:
            f.bad(
                f"{ops.name}.{state.name} declares no 'unknown' state: an effect whose "
                "outcome is unknown after a crash looks unsettled or done, not in doubt",
                _add_unknown(ops, state),
            )
        index = [i.name for i in ops.indexes if _finds_unknown(i, state)]
        if index:
            ok += 1
            f.ok(*(f"index {n}" for n in index))
        else:
            f.bad(
                f"no index finds unsettled {ops.name} rows for reconciliation",
                f"CREATE INDEX {quote(ops.name + '_unsettled_idx')} ON {ops.display} "
                f"({state.qname}{', ' + order.qname if order else ''});",
            )
    return f.finding(
        "G13",
        core_missing=ok == 0,
        enforced=f"{ops.name} has an 'unknown' state and an index over unsettled rows; "
        "reserve-before-call is the runtime's API shape",
    )


def _add_unknown(ops: Table, state: Column) -> str:
    """'unknown' added to the state's own declaration: its enum, its CHECK, or a new CHECK."""
    if state.enum_labels:
        return f"ALTER TYPE {state.type} ADD VALUE IF NOT EXISTS 'unknown';"
    for con in ops.checks_on(state.name):
        _, values = value_set(ops, state)
        if values and con.columns == (state.name,):
            listed = ", ".join(f"'{v}'" for v in sorted(values | {"unknown"}))
            return (
                f"ALTER TABLE {ops.display} DROP CONSTRAINT {con.qname}, ADD CONSTRAINT "
                f"{con.qname} CHECK ({state.qname} IN ({listed}));"
            )
    listed = ", ".join(f"'{v}'" for v in fixes.OP_STATES)
    return (
        f"ALTER TABLE {ops.display} ADD CONSTRAINT "
        f"{quote(ops.name + '_' + state.name + '_valid')} CHECK ({state.qname} IN ({listed}));"
    )
