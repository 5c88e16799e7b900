"""Checks G10-G13: messages leave reliably, leases are fenced, doubt is findable.

Each check reads the :class:`~agentdb.tools.audit.detect.Context` and
returns one finding; none of them touches the database.
"""

from __future__ import annotations

import re

from agentdb.tools.audit.catalog import Column, Index, quote
from agentdb.tools.audit.detect import (
    DELIVERED,
    LEASE_EXPIRES,
    LEASE_OWNER,
    MESSAGE_ID,
    STATE,
    Context,
)
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import (
    STATE_SETS,
    Findings,
    not_applicable,
    state_evidence,
    value_set,
)

__all__ = ["check_g10", "check_g11", "check_g12", "check_g13"]

# Most specific first: the first one a table has is the one judged.
_LEASE_TOKEN = ("lease_token", "fencing_token", "lease_epoch", "lease_generation", "claim_token")
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
    tc = quote(ctx.tc)
    ob = ctx.outbox
    if ob is None:
        f.bad(
            "no outbox table: a crash between commit and publish loses the message",
            f"CREATE TABLE outbox ({tc} uuid NOT NULL, id uuid NOT NULL DEFAULT "
            "gen_random_uuid(), topic text NOT NULL, payload jsonb NOT NULL, state text NOT "
            "NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')), "
            "attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL "
            f"DEFAULT now(), delivered_at timestamptz, PRIMARY KEY ({tc}, id));\n"
            "CREATE INDEX outbox_pending_idx ON outbox (next_attempt_at) "
            "WHERE state = 'pending';",
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
            f"ALTER TABLE {ob.display} ADD PRIMARY KEY ({ob.q(ctx.tc)}, id);",
        )
    if inbox is None:
        f.bad(
            "no inbox table records processed message ids on the consumer side",
            f"CREATE TABLE inbox ({tc} uuid NOT NULL, consumer text NOT NULL, message_id "
            "uuid NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), "
            f"PRIMARY KEY ({tc}, consumer, message_id));",
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
                f"ALTER TABLE {inbox.display} ADD PRIMARY KEY ({tc}, consumer, message_id);",
            )
    return f.finding(
        "G11",
        core_missing=core,
        enforced=f"{ob.name} rows have a stable key; {inbox.name if inbox else ''} "
        "records each processed message id once",
    )


def check_g12(ctx: Context) -> Finding:
    """G12: task leases are complete (owner with expiry) and fenced by a growing token."""
    f = Findings()
    t = ctx.tasks
    if t is None:
        f.bad("no task table (see G1)")
        return f.finding("G12", core_missing=True, enforced="")
    owner, expires, token = t.col(*LEASE_OWNER), t.col(*LEASE_EXPIRES), t.col(*_LEASE_TOKEN)
    if owner is None or expires is None:
        f.bad(
            f"{t.name} has no lease (owner and expiry columns): a crashed worker's "
            "task is never taken over safely",
            f"ALTER TABLE {t.display} ADD COLUMN lease_owner text, ADD COLUMN "
            "lease_acquired_at timestamptz, ADD COLUMN lease_expires_at timestamptz, "
            f"ADD CONSTRAINT {quote(t.name + '_lease_complete')} CHECK ((lease_owner IS "
            "NULL) = (lease_expires_at IS NULL));",
        )
    else:
        f.ok(f"column {t.name}.{owner.name}", f"column {t.name}.{expires.name}")
        whole = [c.name for c in t.of("c") if {owner.name, expires.name} <= set(c.columns)]
        if whole:
            f.ok(*(f"check {n}" for n in whole))
        else:
            f.bad(
                f"no CHECK keeps the lease whole: {owner.name} without "
                f"{expires.name} never expires",
                f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_lease_complete')} "
                f"CHECK (({owner.qname} IS NULL) = ({expires.qname} IS NULL));",
            )
    if token is None:
        f.bad(
            f"{t.name} has no fencing token: a worker whose lease expired can still "
            "complete the task",
            f"ALTER TABLE {t.display} ADD COLUMN lease_token bigint NOT NULL DEFAULT 0; "
            "-- every grant takes a larger token; every holder's write matches it",
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
                f"CREATE TRIGGER {quote(t.name + '_lease_guard')} BEFORE UPDATE ON "
                f"{t.display} FOR EACH ROW EXECUTE FUNCTION guard_lease(); -- RAISE if "
                f"NEW.{token.name} < OLD.{token.name} or a new owner keeps the token",
            )
    return f.finding(
        "G12",
        core_missing=owner is None or expires is None,
        enforced=f"{t.name} leases are complete and fenced by a growing token",
    )


def check_g13(ctx: Context) -> Finding:
    """G13: operations have an 'unknown' state and an index over unsettled rows."""
    f = Findings()
    ops = ctx.ops
    if ops is None:
        f.bad("no operation table (see G1)")
        return f.finding("G13", core_missing=True, enforced="")
    state = ops.col(*STATE)
    ok = 0
    if state is None:
        f.bad(f"{ops.name} has no state column (see G5)")
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
                f"-- add 'unknown' to the {state.name} CHECK of {ops.name}, e.g.\n"
                f"ALTER TABLE {ops.display} ADD CONSTRAINT "
                f"{quote(ops.name + '_' + state.name + '_valid')} CHECK ({state.qname} IN "
                f"({STATE_SETS['operations']}));",
            )
        index = [i.name for i in ops.indexes if _finds_unknown(i, state)]
        if index:
            ok += 1
            f.ok(*(f"index {n}" for n in index))
        else:
            order = ops.col(*_UNSETTLED_ORDER)
            f.bad(
                f"no index finds unsettled {ops.name} rows for reconciliation",
                f"CREATE INDEX {quote(ops.name + '_unsettled_idx')} ON {ops.display} "
                f"({order.qname if order else 'id'}) WHERE {state.qname} IN "
                "('reserved', 'in_flight', 'unknown');",
            )
    return f.finding(
        "G13",
        core_missing=ok == 0,
        enforced=f"{ops.name} has an 'unknown' state and an index over unsettled rows; "
        "reserve-before-call is the runtime's API shape",
    )
