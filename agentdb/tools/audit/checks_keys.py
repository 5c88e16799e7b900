"""Checks G1-G5: the tables, keys and declared values agent state rests on.

Each check reads the :class:`~agentdb.tools.audit.detect.Context` and
returns one finding; none of them touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentdb.tools.audit.catalog import Column, Table, quote
from agentdb.tools.audit.detect import HASH, OP_KEY, STATE, WAKE, Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import (
    STATE_SETS,
    Findings,
    column_list,
    state_evidence,
    value_set,
)

__all__ = ["check_g1", "check_g2", "check_g3", "check_g4", "check_g5"]

# Most specific first: the first one a table has is the one judged.
_TASK_REF = ("task_id", "job_id")
_OP_REF = ("operation_id", "op_id", "effect_id")
_TASK_KEY = ("dedupe_key", "dedup_key", "idempotency_key", "unique_key")


def check_g1(ctx: Context) -> Finding:
    """G1: tasks and operations are separate tables, linked, and a task can wait."""
    f = Findings()
    tc = quote(ctx.tc)
    tasks, ops = ctx.tasks, ctx.ops
    if tasks is None:
        f.bad(
            "no task-like table (a state column with wake_at/state_version/lease "
            "columns, or task/job in the name); --map tasks=TABLE names it",
            "-- agentdb sql prints a complete agent_tasks table to start from",
        )
        return f.finding("G1", core_missing=True, enforced="")
    if ops is None:
        f.bad(
            f"no operation table apart from {tasks.name} (a table with an "
            "idempotency_key column): effects are not recorded separately from tasks",
            f"CREATE TABLE operations ({tc} uuid NOT NULL, id uuid NOT NULL, "
            f"task_id uuid NOT NULL, idempotency_key text NOT NULL, input_hash text NOT NULL, "
            f"state text NOT NULL, PRIMARY KEY ({tc}, id), "
            f"FOREIGN KEY ({tc}, task_id) REFERENCES {tasks.display} ({tc}, id));",
        )
        return f.finding("G1", core_missing=True, enforced="")
    f.ok(f"table {tasks.name}", f"table {ops.name}")
    links = [fk for fk in ops.of("f") if fk.ref_oid == tasks.oid]
    if links:
        f.ok(*(f"fk {fk.name}" for fk in links))
    else:
        ref = ops.col(*_TASK_REF)
        cols = f"{ctx.tc}, {ref.name}" if ref else f"{ctx.tc}, task_id"
        f.bad(
            f"{ops.name} has no foreign key to {tasks.name}: an operation need not "
            "belong to a task",
            f"ALTER TABLE {ops.display} ADD CONSTRAINT {quote(ops.name + '_task_fkey')} "
            f"FOREIGN KEY ({cols}) REFERENCES {tasks.display} ({ctx.tc}, id);",
        )
    wake = tasks.col(*WAKE)
    if wake is not None:
        f.ok(f"column {tasks.name}.{wake.name}")
    else:
        f.bad(
            f"{tasks.name} has no wake-up column (wake_at, run_at...): a task cannot "
            "wait between operations",
            f"ALTER TABLE {tasks.display} ADD COLUMN wake_at timestamptz;",
        )
    return f.finding(
        "G1",
        core_missing=False,
        enforced=f"{ops.name} rows belong to {tasks.name} rows"
        + (f" ({links[0].name})" if links else "")
        + (f"; {tasks.name}.{wake.name} schedules waits" if wake else ""),
    )


def check_g2(ctx: Context) -> Finding:
    """G2: every key and foreign key of a tenant-owned table carries the tenant column."""
    f = Findings()
    tc = ctx.tc
    for kind in ("tasks", "operations", "events", "outbox", "inbox"):
        t = ctx.kinds[kind]
        if t is not None and tc not in t.columns:
            f.bad(
                f"{t.name} has no {tc} column: its rows belong to no tenant",
                f"ALTER TABLE {t.display} ADD COLUMN {quote(tc)} uuid NOT NULL;",
            )
    if not ctx.owned:
        f.bad(f"no table has a tenant column {tc} (--map tenant=COLUMN names another)")
        return f.finding("G2", core_missing=True, enforced="")
    owned_oids = {t.oid for t in ctx.owned}
    good_fks = bad_fks = 0
    for t in ctx.owned:
        pk = t.pk
        if pk is None:
            # bigserial, not an identity column: Citus cannot reshard those.
            add_id = "" if "id" in t.columns else "ADD COLUMN id bigserial, "
            f.bad(
                f"{t.name} has no primary key: its rows cannot be referenced per tenant",
                f"ALTER TABLE {t.display} {add_id}ADD CONSTRAINT {quote(t.name + '_pkey')} "
                f"PRIMARY KEY ({t.q(tc)}, id);",
            )
        elif tc not in pk.columns:
            f.bad(
                f"{pk.name} is PRIMARY KEY ({column_list(pk.columns)}): {tc} is not in it",
                f"ALTER TABLE {t.display} DROP CONSTRAINT {pk.qname}, ADD CONSTRAINT "
                f"{pk.qname} PRIMARY KEY ({t.q(tc)}, {column_list([t.q(c) for c in pk.columns])});"
                " -- recreate the foreign keys that reference it",
            )
        else:
            f.ok(f"pk {pk.name}")
        for fk in t.of("f"):
            if fk.ref_oid == ctx.tenants_oid and fk.columns == (tc,):
                f.ok(f"fk {fk.name}")
                continue
            if fk.ref_oid not in owned_oids:
                continue
            pairs = dict(zip(fk.columns, fk.ref_columns, strict=False))
            if pairs.get(tc) == tc:
                good_fks += 1
                f.ok(f"fk {fk.name}")
                continue
            bad_fks += 1
            parent = ctx.cat.by_oid(fk.ref_oid)
            assert parent is not None
            f.bad(
                f"{fk.name} ({column_list(fk.columns)}) -> {parent.name} "
                f"({column_list(fk.ref_columns)}) lets a {t.name} row point at another "
                "tenant's row",
                f"ALTER TABLE {t.display} DROP CONSTRAINT {fk.qname}, ADD CONSTRAINT "
                f"{fk.qname} FOREIGN KEY ({t.q(tc)}, {column_list([t.q(c) for c in fk.columns])}) "
                f"REFERENCES {parent.display} ({parent.q(tc)}, "
                f"{column_list([parent.q(c) for c in fk.ref_columns])});"
                + _unique_hint(ctx, parent, fk.ref_columns),
            )
        for names, target in ((_TASK_REF, ctx.tasks), (_OP_REF, ctx.ops)):
            ref = t.col(*names)
            if ref is None or target is None or target.oid == t.oid:
                continue
            if not any(ref.name in fk.columns for fk in t.of("f")):
                f.bad(
                    f"{t.name}.{ref.name} has no foreign key: it can name another "
                    f"tenant's {target.name} row, or none",
                    f"ALTER TABLE {t.display} ADD CONSTRAINT "
                    f"{quote(t.name + '_' + ref.name.removesuffix('_id') + '_fkey')} "
                    f"FOREIGN KEY ({t.q(tc)}, {ref.qname}) REFERENCES {target.display} "
                    f"({target.q(tc)}, id);",
                )
    core = (ctx.tasks is not None and tc not in ctx.tasks.columns) or (
        bad_fks > 0 and good_fks == 0
    )
    return f.finding(
        "G2",
        core_missing=core,
        enforced=f"every key and foreign key of {len(ctx.owned)} tenant-owned tables carries {tc}",
    )


def _unique_hint(ctx: Context, parent: Table, ref_columns: Sequence[str]) -> str:
    """The UNIQUE key a tenant-carrying foreign key to ``parent`` needs, unless it has one."""
    wanted = {ctx.tc, *ref_columns}
    keys = [set(cols) for _, cols, _ in parent.unique_keys()]
    if parent.pk is not None:
        keys.append(set(parent.pk.columns))
    if wanted in keys:
        return ""
    return (
        f"\nALTER TABLE {parent.display} ADD CONSTRAINT "
        f"{quote(parent.name + '_' + ctx.tc + '_key')} UNIQUE ({parent.q(ctx.tc)}, "
        f"{column_list([parent.q(c) for c in ref_columns])});"
    )


def check_g3(ctx: Context) -> Finding:
    """G3: idempotency (and dedupe) keys are unique per tenant, and no other key spans tenants."""
    f = Findings()
    ops, tc = ctx.ops, ctx.tc
    if ops is None:
        f.bad("no operation table with an idempotency key (see G1)")
        return f.finding("G3", core_missing=True, enforced="")
    key = ops.col(*OP_KEY)
    assert key is not None  # an operation table is found by its key column
    core = not _key_is_unique(ctx, f, ops, key)
    judged = {(ops.oid, key.name)}
    tasks = ctx.tasks
    if tasks is not None and (dedupe := tasks.col(*_TASK_KEY)) is not None:
        _key_is_unique(ctx, f, tasks, dedupe)
        judged.add((tasks.oid, dedupe.name))
    # Every other unique key of a tenant-owned table must be per tenant too
    # (primary keys are G2's: they are what foreign keys point at).
    for t in ctx.owned:
        for name, cols, _ in t.unique_keys():
            if tc in cols or any((t.oid, c) in judged for c in cols):
                continue
            f.bad(
                f"UNIQUE {name} ({column_list(cols)}) on {t.name} spans tenants: one tenant's "
                "row blocks another's",
                f"-- drop {name}, then\nALTER TABLE {t.display} ADD CONSTRAINT "
                f"{quote(name)} UNIQUE ({t.q(tc)}, {column_list([t.q(c) for c in cols if c])});",
            )
    return f.finding(
        "G3",
        core_missing=core,
        enforced=f"UNIQUE ({tc}, {key.name}) on {ops.name}",
    )


def _key_is_unique(ctx: Context, f: Findings, t: Table, key: Column) -> bool:
    """Record whether ``key`` is unique per tenant; return False if it is not unique at all."""
    tc = ctx.tc
    keys = [(n, cols, pred) for n, cols, pred in t.unique_keys() if key.name in cols]
    exact = [k for k in keys if set(k[1]) == {tc, key.name}]
    if exact:
        name, _, pred = exact[0]
        f.ok(f"unique {name}" + (f" (partial: WHERE {pred})" if pred else ""))
        return True
    fix = (
        f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_' + key.name)} "
        f"UNIQUE ({t.q(tc)}, {key.qname});"
    )
    if not keys:
        f.bad(f"nothing makes {t.name}.{key.name} unique: two workers can both create it", fix)
        return False
    name, cols, _ = keys[0]
    if tc not in cols:
        f.bad(
            f"UNIQUE {name} ({column_list(cols)}) on {t.name} spans tenants: one tenant's "
            f"{key.name} blocks (and may be answered with) another's",
            f"-- drop {name}, then\n{fix}",
        )
    else:
        f.bad(
            f"UNIQUE {name} ({column_list(cols)}) on {t.name} allows the same {key.name} twice "
            "in a tenant",
            f"-- drop {name}, then\n{fix}",
        )
    return True


def check_g4(ctx: Context) -> Finding:
    """G4: a key is stored with a required, format-checked hash of its request."""
    f = Findings()
    ops = ctx.ops
    if ops is None:
        f.bad("no operation table with an idempotency key (see G1)")
        return f.finding("G4", core_missing=True, enforced="")
    key = ops.col(*OP_KEY)
    assert key is not None
    core = not _hash_checks(f, ops, key)
    tasks = ctx.tasks
    if tasks is not None and (dedupe := tasks.col(*_TASK_KEY)) is not None:
        _hash_checks(f, tasks, dedupe)
    hash_col = ops.col(*HASH)
    return f.finding(
        "G4",
        core_missing=core,
        enforced=f"{ops.name}.{hash_col.name if hash_col else ''} is required and "
        "format-checked; the runtime compares it under the row lock before answering",
    )


def _hash_checks(f: Findings, t: Table, key: Column) -> bool:
    """Record how ``t`` ties a request hash to ``key``; return False if it stores none."""
    h = t.col(*HASH)
    if h is None:
        f.bad(
            f"{t.name} stores no input hash beside {key.name}: a reused key with "
            "different parameters gets the old result",
            f"ALTER TABLE {t.display} ADD COLUMN input_hash text NOT NULL; "
            "-- sha256 of the canonical input, compared before a stored result is returned",
        )
        return False
    f.ok(f"column {t.name}.{h.name}")
    ties = [c for c in t.of("c") if key.name in c.columns and h.name in c.columns]
    if ties:
        f.ok(*(f"check {c.name}" for c in ties))
    elif not h.notnull:
        f.bad(
            f"{t.name}.{h.name} may be NULL while {key.name} is set",
            f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_key_has_hash')} "
            f"CHECK (({key.qname} IS NULL) = ({h.qname} IS NULL));",
        )
    formats = [
        c
        for c in t.checks_on(h.name)
        if c.columns == (h.name,) and re.search(r" ~ |length\(|SIMILAR|LIKE", c.definition)
    ]
    if formats:
        f.ok(*(f"check {c.name}" for c in formats))
    else:
        f.bad(
            f"{t.name}.{h.name} has no format CHECK: any text (even '') passes as a hash",
            f"ALTER TABLE {t.display} ADD CONSTRAINT "
            f"{quote(t.name + '_' + h.name + '_format')} "
            f"CHECK ({h.qname} ~ '^[0-9a-f]{{64}}$');",
        )
    return True


def check_g5(ctx: Context) -> Finding:
    """G5: every state column has a declared value set; owner columns are NOT NULL."""
    f = Findings()
    constrained = 0
    stateful = ctx.stateful()
    for kind, t in stateful:
        state = t.col(*STATE)
        if state is None:
            if kind != "outbox":
                f.bad(
                    f"{t.name} has no state column",
                    f"ALTER TABLE {t.display} ADD COLUMN state text NOT NULL "
                    f"CONSTRAINT {quote(t.name + '_state_valid')} "
                    f"CHECK (state IN ({STATE_SETS[kind]}));",
                )
            continue
        declared, _ = value_set(t, state)
        if declared:
            constrained += 1
            f.ok(*state_evidence(t, state))
        else:
            f.bad(
                f"{t.name}.{state.name} accepts any value: no CHECK, enum or foreign key",
                f"ALTER TABLE {t.display} ADD CONSTRAINT "
                f"{quote(t.name + '_' + state.name + '_valid')} CHECK ({state.qname} IN "
                f"({STATE_SETS[kind]})); -- your states",
            )
        if not state.notnull:
            f.bad(
                f"{t.name}.{state.name} may be NULL",
                f"ALTER TABLE {t.display} ALTER COLUMN {state.qname} SET NOT NULL;",
            )
    for t in ctx.owned:
        c = t.columns[ctx.tc]
        if not c.notnull:
            f.bad(
                f"{t.name}.{c.name} may be NULL: a row without an owner",
                f"ALTER TABLE {t.display} ALTER COLUMN {c.qname} SET NOT NULL;",
            )
    if not stateful:
        f.bad("no task, operation or outbox table to check (see G1, G10)")
    return f.finding(
        "G5",
        core_missing=constrained == 0,
        enforced="every state column has a declared value set; owner columns are NOT NULL",
    )
