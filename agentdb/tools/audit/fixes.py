"""Suggested fixes that apply: SQL in the schema's own tables, columns, key types and states.

Every fix the audit prints is a statement (or a few) that runs as written on
the audited schema: new objects are named after the table they serve and
qualified like it, foreign keys take the referenced key's columns and types,
state lists are the column's own declared values, and the guard functions a
trigger needs are created beside it. ``tests/test_audit_peers.py`` applies
every fix to a scratch copy of real schemas and re-audits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from agentdb.tools.audit import columns
from agentdb.tools.audit.catalog import Column, Table, quote
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.verdicts import value_set

__all__ = [
    "OP_STATES",
    "TASK_STATES",
    "append_only",
    "event_link",
    "events_table",
    "lease_fence",
    "name",
    "ops_table",
    "state_column",
    "state_values",
    "transition_guard",
    "version_guard",
]

# Only where a schema declares no states of its own: agentdb's.
TASK_STATES: Final = ("pending", "waiting", "running", "succeeded", "failed", "cancelled", "dead")
OP_STATES: Final = ("reserved", "in_flight", "succeeded", "failed", "unknown")


def name(ctx: Context, base: str) -> str:
    """A new object's name, quoted and qualified like the audited tables."""
    return ctx.cat.prefix + quote(base[:63])


def said(name: str) -> str:
    """``name`` inside a fix's ``RAISE EXCEPTION '...'`` text: a quote closes the
    literal and a ``%`` is a placeholder there (a table "It's jobs", "100% steps")."""
    return name.replace("'", "''").replace("%", "%%")


def _lit(values: Sequence[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def state_values(t: Table, state: Column | None, kind: str) -> tuple[str, ...]:
    """The states a column declares (enum labels or a CHECK list), else the ones its
    indexes name (``WHERE status = 'PENDING'``), else agentdb's."""
    if state is not None:
        _, values = value_set(t, state)
        if state.enum_labels:
            return state.enum_labels
        if values:
            return tuple(sorted(values))
        seen = seen_states(t, state)
        if seen:
            return seen
    return OP_STATES if kind == "operations" else TASK_STATES


def seen_states(t: Table, state: Column) -> tuple[str, ...]:
    """The literals the table's index predicates compare ``state`` with, in order seen."""
    col = re.escape(state.qname)
    found: list[str] = []
    for i in t.indexes:
        pred = i.predicate or ""
        for m in re.finditer(
            rf"(?<![\w\"]){col}\)?\s*(?:=|<>|!=)\s*(?:ANY\s*\(\s*ARRAY\[(?P<list>[^\]]*)\]"
            r"|(?P<one>'(?:[^']|'')*'))",
            pred,
        ):
            text = m["list"] or m["one"] or ""
            found += [v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", text)]
    return tuple(dict.fromkeys(found))


def _key_columns(t: Table) -> list[Column]:
    """The columns a reference to ``t`` names: its primary key, else ``id``."""
    cols = [t.columns[c] for c in t.pk_columns() if c in t.columns]
    if not cols and "id" in t.columns:
        cols = [t.columns["id"]]
    return cols


def _ref_names(t: Table, prefix: str) -> list[tuple[str, Column]]:
    """(new column name, referenced column) for a reference to ``t``."""
    return [
        (c.name if c.name.startswith(prefix) else f"{prefix}_{c.name}", c) for c in _key_columns(t)
    ]


def tenant_scoped(ctx: Context, base: str) -> str:
    """What a new tenant-owned table needs beside its key (G15, G17): forced RLS with a
    tenant policy, and a foreign key to the tenants table if there is one."""
    if ctx.single_tenant:
        return ""
    t = name(ctx, base)
    tc = quote(ctx.tc)
    ttype = next(
        (x.columns[ctx.tc].type for x in ctx.cat.tables.values() if ctx.tc in x.columns), "uuid"
    )
    out = [
        f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;",
        f"CREATE POLICY {quote(base + '_tenant_scope')} ON {t} USING ({tc} = "
        f"current_setting('app.tenant_id')::{ttype});",
    ]
    if ctx.tenants_oid is not None:
        ref = next(
            (
                fk.ref_columns[0]
                for x in ctx.cat.tables.values()
                for fk in x.of("f")
                if fk.ref_oid == ctx.tenants_oid and fk.columns == (ctx.tc,)
            ),
            "id",
        )
        out.append(
            f"ALTER TABLE {t} ADD CONSTRAINT {quote(base + '_tenant_fkey')} FOREIGN KEY ({tc}) "
            f"REFERENCES {ctx.tenants_display()} ({quote(ref)});"
        )
    return "\n" + "\n".join(out)


def ops_table(ctx: Context) -> str:
    """CREATE TABLE for an operation table beside the task table, keyed like it."""
    tasks = ctx.tasks
    base = (tasks.name if tasks is not None else "task") + "_operations"
    tn = name(ctx, base)
    cols: list[str] = []
    keys: list[str] = []
    tenant = ""
    if not ctx.single_tenant:
        tcol = tasks.columns.get(ctx.tc) if tasks is not None else None
        tenant = quote(ctx.tc)
        cols.append(f"{tenant} {tcol.type if tcol else 'uuid'} NOT NULL")
    cols.append("id bigint GENERATED BY DEFAULT AS IDENTITY")
    refs: list[tuple[str, Column]] = []
    if tasks is not None:
        refs = [(n, c) for n, c in _ref_names(tasks, "task") if c.name != ctx.tc]
        cols += [f"{quote(n)} {c.type} NOT NULL" for n, c in refs]
    cols += [
        "idempotency_key text NOT NULL",
        "input_hash text NOT NULL CHECK (input_hash ~ '^[0-9a-f]{64}$')",
        f"state text NOT NULL DEFAULT 'reserved' CHECK (state IN ({_lit(OP_STATES)}))",
        "result jsonb CHECK (octet_length(result::text) <= 65536)",
        "created_at timestamptz NOT NULL DEFAULT now()",
    ]
    scope = [tenant] if tenant else []
    keys.append(f"PRIMARY KEY ({', '.join([*scope, 'id'])})")
    keys.append(f"UNIQUE ({', '.join([*scope, 'idempotency_key'])})")
    hint = ""
    if tasks is not None and refs:
        here = [*scope, *(quote(n) for n, _ in refs)]
        there = [*(tasks.q(ctx.tc) for _ in scope), *(c.qname for _, c in refs)]
        keys.append(
            f"FOREIGN KEY ({', '.join(here)}) REFERENCES {tasks.display} ({', '.join(there)})"
        )
        wanted = {ctx.tc, *(c.name for _, c in refs)} if scope else {c.name for _, c in refs}
        have = [set(cols_) for _, cols_, pred in tasks.unique_keys() if pred is None]
        have.append(set(tasks.pk_columns()))
        if wanted not in have:
            hint = (
                f"ALTER TABLE {tasks.display} ADD CONSTRAINT "
                f"{quote(tasks.name + '_' + '_'.join(sorted(wanted)) + '_key')} "
                f"UNIQUE ({', '.join(there)});\n"
            )
    index = f"CREATE INDEX {quote(base + '_unsettled_idx')} ON {tn} (state, created_at);"
    body = ",\n    ".join(cols + keys)
    return f"{hint}CREATE TABLE {tn} (\n    {body}\n);\n{index}" + tenant_scoped(ctx, base)


def state_column(ctx: Context, t: Table, kind: str) -> str:
    """ADD COLUMN state with a CHECK (for a table whose lifecycle has no column)."""
    states = TASK_STATES if kind == "tasks" else OP_STATES
    return (
        f"ALTER TABLE {t.display} ADD COLUMN state text NOT NULL DEFAULT '{states[0]}' "
        f"CONSTRAINT {quote(t.name + '_state_valid')} CHECK (state IN ({_lit(states)}));"
    )


def transition_guard(ctx: Context, t: Table, state: Column | None, kind: str) -> str:
    """A table of allowed moves in the column's own states, and the trigger that refuses others.

    Seeded with every move except out of a final state (review the list: a
    manual retry from a final state is a move to add).
    """
    col = state.qname if state is not None else "state"
    ctype = state.type if state is not None else "text"
    values = state_values(t, state, kind)
    edges = [
        f"({_lit([a])}, {_lit([b])})"
        for a in values
        for b in values
        if a != b and a.lower() not in columns.FINAL_STATES
    ]
    moves = name(ctx, t.name + "_moves")
    fn = name(ctx, t.name + "_guard_move")
    # Suggested text shown to a DBA, never executed by the audit (S608).
    seed = f"INSERT INTO {moves} VALUES {', '.join(edges)};\n" if edges else ""  # noqa: S608
    return (
        f"CREATE TABLE {moves} (old_value {ctype} NOT NULL, new_value {ctype} NOT NULL, "  # noqa: S608
        "PRIMARY KEY (old_value, new_value));\n"
        f"{seed}"
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n"
        f"  IF NEW.{col} IS DISTINCT FROM OLD.{col} AND NOT EXISTS (SELECT 1 FROM {moves} m\n"
        f"      WHERE m.old_value = OLD.{col} AND m.new_value = NEW.{col}) THEN\n"
        f"    RAISE EXCEPTION '{said(t.name)}: % -> % is not an allowed move', "
        f"OLD.{col}, NEW.{col}\n"
        f"      USING ERRCODE = 'check_violation';\n"
        f"  END IF;\n"
        f"  RETURN NEW;\n"
        f"END $$;\n"
        f"CREATE TRIGGER {quote(t.name + '_transition_guard')} BEFORE UPDATE OF {col} "
        f"ON {t.display} FOR EACH ROW EXECUTE FUNCTION {fn}();"
    )


def version_guard(ctx: Context, t: Table, v: Column | None) -> str:
    """A version column (if missing) and a trigger that moves it by one on every write.

    The trigger sets the new version itself, so existing writers keep working;
    one that writes any other value is refused.
    """
    add = ""
    if v is None:
        add = f"ALTER TABLE {t.display} ADD COLUMN state_version bigint NOT NULL DEFAULT 0;\n"
    col = v.qname if v is not None else "state_version"
    fn = name(ctx, t.name + "_bump_version")
    return (
        f"{add}CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n"
        f"  IF NEW.{col} IS DISTINCT FROM OLD.{col} AND NEW.{col} IS DISTINCT FROM OLD.{col} + 1 "
        "THEN\n"
        f"    RAISE EXCEPTION '{said(t.name)}.{said(col)} moves by one' "
        "USING ERRCODE = 'check_violation';\n"
        f"  END IF;\n"
        f"  NEW.{col} := OLD.{col} + 1;\n"
        f"  RETURN NEW;\n"
        f"END $$;\n"
        f"CREATE TRIGGER {quote(t.name + '_version_guard')} BEFORE UPDATE ON {t.display} "
        f"FOR EACH ROW EXECUTE FUNCTION {fn}();"
    )


def append_only(ctx: Context, ev: Table, ops: Sequence[str]) -> str:
    """Triggers that refuse UPDATE/DELETE (DELETE allowed on the retention path) and TRUNCATE."""
    fn = name(ctx, ev.name + "_refuse_change")
    out = [
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        "  -- the retention job runs: SET LOCAL app.retention = 'on'\n"
        "  IF TG_OP = 'DELETE' AND current_setting('app.retention', true) = 'on' THEN\n"
        "    RETURN OLD;\n"
        "  END IF;\n"
        f"  RAISE EXCEPTION '% on {said(ev.name)} is refused: audit rows are append-only', TG_OP\n"
        "    USING ERRCODE = 'insufficient_privilege';\n"
        "END $$;"
    ]
    if "UPDATE" in ops or "DELETE" in ops:
        out.append(
            f"CREATE TRIGGER {quote(ev.name + '_append_only')} BEFORE UPDATE OR DELETE "
            f"ON {ev.display} FOR EACH ROW EXECUTE FUNCTION {fn}();"
        )
    if "TRUNCATE" in ops:
        out.append(
            f"CREATE TRIGGER {quote(ev.name + '_no_truncate')} BEFORE TRUNCATE ON "
            f"{ev.display} FOR EACH STATEMENT EXECUTE FUNCTION {fn}();"
        )
    return "\n".join(out)


def events_table(ctx: Context) -> tuple[str, str]:
    """(name, CREATE TABLE) of an event table for the task table's state changes."""
    tasks = ctx.tasks
    base = (tasks.name if tasks is not None else "task") + "_events"
    cols: list[str] = []
    scope: list[str] = []
    if not ctx.single_tenant:
        tcol = tasks.columns.get(ctx.tc) if tasks is not None else None
        scope = [quote(ctx.tc)]
        cols.append(f"{quote(ctx.tc)} {tcol.type if tcol else 'uuid'} NOT NULL")
    cols.append("id bigint GENERATED BY DEFAULT AS IDENTITY")
    refs = [(n, c) for n, c in _ref_names(tasks, "task") if c.name != ctx.tc] if tasks else []
    cols += [f"{quote(n)} {c.type} NOT NULL" for n, c in refs]
    cols += ["event_type text NOT NULL", "created_at timestamptz NOT NULL DEFAULT now()"]
    cols.append(f"PRIMARY KEY ({', '.join([*scope, 'id'])})")
    if scope and tasks is not None and refs:
        # Tenant-scoped like G2 wants; a single-tenant queue deletes finished
        # jobs, which a foreign key from append-only rows would block.
        cols.append(
            f"FOREIGN KEY ({', '.join([*scope, *(quote(n) for n, _ in refs)])}) REFERENCES "
            f"{tasks.display} ({', '.join([tasks.q(ctx.tc), *(c.qname for _, c in refs)])})"
        )
    create = f"CREATE TABLE {name(ctx, base)} (\n    " + ",\n    ".join(cols) + "\n);"
    return base, create + tenant_scoped(ctx, base)


def event_link(ctx: Context, t: Table, ev: Table, *, new_events: bool = False) -> str | None:
    """An AFTER trigger on ``t`` that writes the ``ev`` row of every state change.

    Each required column of ``ev`` is filled from ``t``'s row: the task
    reference from its key, the event column from its state, others by
    name. ``None`` when a required column has no source.
    """
    state = columns.state(t)
    key = _key_columns(t)
    if not key:
        return None
    values: dict[str, str] = {}
    if new_events:
        for n, c in _ref_names(t, "task"):
            if c.name != ctx.tc:
                values[n] = f"NEW.{c.qname}"
        if not ctx.single_tenant:
            values[ctx.tc] = f"NEW.{t.q(ctx.tc)}"
        values["event_type"] = f"NEW.{state.qname}::text" if state else "TG_OP"
    else:
        refs = columns.task_ref(ev, t)
        pk = [c for c in key if c.name != ctx.tc]
        for ref, c in zip(refs, pk, strict=False):
            values[ref] = f"NEW.{c.qname}"
        kind = ev.col("event_type", "type", "event", "kind", "action") or columns.state(ev)
        for c in ev.columns.values():
            if c.name in values:
                continue
            if kind is not None and c.name == kind.name:
                if state is not None and state.type == c.type:
                    values[c.name] = f"NEW.{state.qname}"
                elif c.base in ("text", "varchar"):
                    values[c.name] = f"NEW.{state.qname}::text" if state else "TG_OP"
                continue
            if c.name in t.columns and t.columns[c.name].type == c.type:
                values[c.name] = f"NEW.{t.columns[c.name].qname}"
        for c in ev.columns.values():
            if c.notnull and not c.has_default and c.name not in values:
                return None
    fn = name(ctx, t.name + "_write_event")
    names = [ev.columns[n].qname if n in ev.columns else quote(n) for n in values]
    when = (
        f"IF TG_OP = 'UPDATE' AND NEW.{state.qname} IS NOT DISTINCT FROM OLD.{state.qname} THEN\n"
        "    RETURN NEW;\n  END IF;\n  "
        if state is not None
        else ""
    )
    return (
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"  # noqa: S608
        f"BEGIN\n  {when}INSERT INTO {ev.display} ({', '.join(names)})\n"
        f"    VALUES ({', '.join(values.values())});\n"
        "  RETURN NEW;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(t.name + '_event_required')} AFTER INSERT OR UPDATE ON "
        f"{t.display} FOR EACH ROW EXECUTE FUNCTION {fn}();"
    )


def lease_fence(ctx: Context, t: Table, lease: columns.Lease) -> str:
    """What a task's lease lacks: an owner, a fencing token and the guard that moves it.

    The guard takes a larger token whenever the owner changes and refuses a
    token going backwards; a holder's writes then match ``token = $mine``.
    """
    add: list[str] = []
    owner = lease.owner.qname if lease.owner is not None else "lease_owner"
    if lease.owner is None:
        add.append("ADD COLUMN lease_owner text")
    if lease.takeover is None:
        add.append("ADD COLUMN lease_expires_at timestamptz")
        add.append(
            f"ADD CONSTRAINT {quote(t.name + '_lease_complete')} CHECK (({owner} IS NULL) = "
            "(lease_expires_at IS NULL))"
        )
    elif lease.owner is not None and lease.expires is not None:
        add.append(
            f"ADD CONSTRAINT {quote(t.name + '_lease_complete')} CHECK (({owner} IS NULL) = "
            f"({lease.expires.qname} IS NULL))"
        )
    token = lease.token.qname if lease.token is not None else "lease_token"
    if lease.token is None:
        add.append("ADD COLUMN lease_token bigint NOT NULL DEFAULT 0")
    fn = name(ctx, t.name + "_fence_lease")
    out = [f"ALTER TABLE {t.display} {', '.join(add)};"] if add else []
    out.append(
        f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        f"  IF NEW.{token} < OLD.{token} THEN\n"
        f"    RAISE EXCEPTION '{said(t.name)}.{said(token)} went backwards'\n"
        "      USING ERRCODE = 'check_violation';\n"
        "  END IF;\n"
        f"  IF NEW.{owner} IS DISTINCT FROM OLD.{owner} AND NEW.{token} = OLD.{token} THEN\n"
        f"    NEW.{token} := OLD.{token} + 1;  -- a new holder, a new token\n"
        "  END IF;\n"
        "  RETURN NEW;\n"
        "END $$;\n"
        f"CREATE TRIGGER {quote(t.name + '_lease_guard')} BEFORE UPDATE ON {t.display} "
        f"FOR EACH ROW EXECUTE FUNCTION {fn}(); -- holders write WHERE {token} = $mine"
    )
    return "\n".join(out)
