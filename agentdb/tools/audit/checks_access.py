"""Checks G14-G17: typed policy facts, tenant scoping, tracing, tenant deletion.

Each check reads the :class:`~agentdb.tools.audit.detect.Context` and
returns one finding; none of them touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from agentdb.tools.audit import fixes
from agentdb.tools.audit.catalog import Constraint, Index, Table, quote
from agentdb.tools.audit.detect import Context
from agentdb.tools.audit.report import Finding
from agentdb.tools.audit.verdicts import Findings, column_list, single_tenant

__all__ = ["check_g14", "check_g15", "check_g16", "check_g17"]

_SECRET_COLUMN = re.compile(
    r"secret|token|passw|api_?key|credential|private_?key|(^|_)ref(erence)?($|_)|(^|_)value($|_)"
)
# A routine that deletes tenants is G17's evidence when there is one.
_DELETION_ROUTINE = re.compile(
    r"(delete|purge|erase|forget|offboard|remove|drop).*tenant"
    r"|tenant.*(delete|purge|erase|forget|offboard|remov)"
)

# pg_constraint.confdeltype values that make a delete do something implicit.
_DELETE_RULES: Final[Mapping[str, str]] = {
    "c": "CASCADE silently deletes",
    "n": "SET NULL orphans",
    "d": "SET DEFAULT re-parents",
}


_JSON_PATH = re.compile(
    r"->>?|#>>?|@\?|\bjsonb?_path_\w+\s*\(|\bjsonb?_extract_path(?:_text)?\s*\(",
    re.IGNORECASE,
)
_JSON_OPERATOR = re.compile(r"@>|<@|\?\||\?&|\s\?\s")


def _json_path_use(expression: str | None, table: Table) -> bool:
    """Does the expression read a fact out of a JSON document?"""
    if not expression:
        return False
    if _JSON_PATH.search(expression):
        return True
    # @>, ? and friends also work on arrays and ranges, and [...] on arrays: count
    # them only when they apply to one of the table's JSON columns (jsonb
    # subscripting, PG 14+, reads meta['tenant'] as meta ->> would).
    json_columns = [re.escape(c.qname) for c in table.columns.values() if c.is_json]
    if any(re.search(rf"(?<![\w\"]){q}\)*\[", expression) for q in json_columns):
        return True
    if _JSON_OPERATOR.search(expression):
        return any(re.search(rf"(?<![\w\"]){q}(?![\w\"])", expression) for q in json_columns)
    return False


def check_g14(ctx: Context) -> Finding:
    """G14: no index, policy or CHECK reads a fact out of a JSON document."""
    f = Findings()
    in_policy = False
    for t in ctx.cat.tables.values():
        for p in t.policies:
            if _json_path_use(p.qual, t) or _json_path_use(p.with_check, t):
                in_policy = True
                f.bad(
                    f"policy {p.name} on {t.name} decides access from a JSON path",
                    _fix(t, _promote(t, [p.qual, p.with_check]), _alter_policy, p.name),
                )
        for i in t.indexes:
            if _json_path_use(i.expressions, t) or _json_path_use(i.predicate, t):
                f.bad(
                    f"index {i.name} on {t.name} serves a query on a JSON path",
                    _fix(t, _promote(t, [i.expressions, i.predicate]), _reindex, ctx, i),
                )
        for c in t.of("c"):
            if _json_path_use(c.definition, t):
                f.bad(
                    f"CHECK {c.name} on {t.name} validates a JSON path",
                    _fix(t, _promote(t, [c.definition]), _recheck, c),
                )
    for t in ctx.cat.tables.values():
        f.ok(*(f"json column {t.name}.{c.name}" for c in t.columns.values() if c.is_json))
    return f.finding(
        "G14",
        core_missing=in_policy,
        enforced="no index, policy or CHECK reads a JSON path; JSON holds only payloads",
    )


# ``params ->> 'priority'::text`` as pg_get_expr prints a field read.
_FIELD = re.compile(
    r"(?P<col>[a-z_][a-z0-9_]*|\"(?:[^\"]|\"\")+\") (?P<op>->>?) '(?P<key>[^']+)'::text"
)


def _promote(t: Table, texts: list[str | None]) -> tuple[list[str], list[str | None]] | None:
    """Make the JSON fields ``texts`` read STORED generated columns of ``t``.

    Returns the statements adding them and ``texts`` reading those columns
    instead; ``None`` when a JSON path is not a plain field read.
    """
    adds: dict[str, str] = {}

    def column(m: re.Match[str]) -> str:
        base = re.sub(r"[^a-z0-9]+", "_", f"{m['col'].strip(chr(34))}_{m['key']}".lower())
        name = quote(base.strip("_") or "json_field")
        kind = "text" if m["op"] == "->>" else "jsonb"
        adds[name] = (
            f"ADD COLUMN {name} {kind} GENERATED ALWAYS AS ({m['col']} {m['op']} "
            f"'{m['key']}') STORED"
        )
        return name

    new = [None if text is None else _FIELD.sub(column, text) for text in texts]
    if not adds or any(n is not None and _JSON_PATH.search(n) for n in new):
        return None
    add = ", ".join(a for n, a in adds.items() if n.strip('"') not in t.columns)
    return ([f"ALTER TABLE {t.display} {add};"] if add else []), new


def _fix(
    t: Table,
    promoted: tuple[list[str], list[str | None]] | None,
    rewrite: Callable[..., list[str]],
    *args: Any,
) -> str:
    """The promotion's statements, then ``rewrite(t, *args, new_texts)``'s."""
    if promoted is None:
        return (
            f"-- promote the JSON field to a typed column of {t.name} (a STORED generated "
            "column) and rewrite what reads it on that column"
        )
    head, new = promoted
    return "\n".join(head + rewrite(t, *args, new))


def _recheck(t: Table, c: Constraint, new: list[str | None]) -> list[str]:
    return [
        f"ALTER TABLE {t.display} DROP CONSTRAINT {c.qname}, ADD CONSTRAINT {c.qname} {new[0]};"
    ]


def _alter_policy(t: Table, name: str, new: list[str | None]) -> list[str]:
    using = f" USING ({new[0]})" if new[0] else ""
    check = f" WITH CHECK ({new[1]})" if len(new) > 1 and new[1] else ""
    return [f"ALTER POLICY {quote(name)} ON {t.display}{using}{check};"]


def _reindex(t: Table, ctx: Context, i: Index, new: list[str | None]) -> list[str]:
    expr, pred = new
    keys = [quote(c) for c in i.columns if c]
    if expr:
        keys.append(f"({expr})")
    unique = "UNIQUE " if i.unique else ""
    where = f" WHERE {pred}" if pred else ""
    return [
        f"DROP INDEX {fixes.name(ctx, i.name)};",
        f"CREATE {unique}INDEX {quote(i.name)} ON {t.display} ({', '.join(keys)}){where};",
    ]


def check_g15(ctx: Context) -> Finding:
    """G15: forced row-level security on tenant-owned tables, and no role bypasses it."""
    if (na := single_tenant("G15", ctx.single_tenant, ctx.tc, ctx.tenant_candidate)) is not None:
        return na
    f = Findings()
    owned = ctx.owned
    if not owned:
        f.bad(f"no tenant-owned tables (no {ctx.tc} column) to scope (see G2)")
        return f.finding("G15", core_missing=True, enforced="")
    enabled = [t for t in owned if t.rls]
    for t in owned:
        if not t.rls:
            f.bad(
                f"row-level security is off on {t.name}: any role with SELECT sees every tenant",
                f"ALTER TABLE {t.display} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL "
                f"SECURITY;\nCREATE POLICY {quote(t.name + '_tenant_scope')} ON {t.display} "
                f"USING ({t.q(ctx.tc)} = current_setting('app.tenant_id')::"
                f"{t.columns[ctx.tc].type});",
            )
        elif not t.force_rls:
            f.bad(
                f"row-level security on {t.name} is enabled but not forced: its owner bypasses it",
                f"ALTER TABLE {t.display} FORCE ROW LEVEL SECURITY;",
            )
        else:
            f.ok(f"rls {t.name} (enabled, forced)")
        for part in t.exposed_partitions:
            # The root's policies do not apply to a query that names the partition.
            f.bad(
                f"partition {part} of {t.name} is granted to a role and has no forced "
                "row-level security of its own: through it that role sees every tenant",
                f"ALTER TABLE {part} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;",
            )
        for p in t.policies:
            # A USING that reads no column is true for every row or for none.
            if "public" in p.roles and p.permissive and not p.reads_row:
                f.bad(
                    f"policy {p.name} opens every row of {t.name} to PUBLIC",
                    f"DROP POLICY {quote(p.name)} ON {t.display};",
                )
            else:
                f.ok(f"policy {p.name}")
        public_writes = sorted(
            p
            for g, p in t.grants
            if g == "public" and p in ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
        )
        if public_writes:
            f.bad(
                f"PUBLIC may {', '.join(public_writes)} {t.name}",
                f"REVOKE {', '.join(public_writes)} ON {t.display} FROM PUBLIC;",
            )
    if ctx.cat.role_super or ctx.cat.role_bypassrls:
        what = "a superuser" if ctx.cat.role_super else "BYPASSRLS"
        f.bad(
            f"connected as {ctx.cat.role}, which is {what}: row-level security does not "
            "apply to it (audit as the role the runtime connects as)",
            f"ALTER ROLE {quote(ctx.cat.role)} NOSUPERUSER NOBYPASSRLS; -- or give the "
            "runtime its own role",
        )
    else:
        f.ok(f"role {ctx.cat.role} (no superuser, no BYPASSRLS)")
    for member, via, is_super, _ in ctx.cat.elevated:
        what = "a superuser" if is_super else "BYPASSRLS"
        f.bad(
            f"role {member} is {what} and inherits {via}, which policies name: RLS does "
            "not apply to it",
            f"ALTER ROLE {quote(member)} NOSUPERUSER NOBYPASSRLS;",
        )
    return f.finding(
        "G15",
        core_missing=not enabled,
        enforced=f"row-level security enabled and forced on {len(owned)} tenant-owned "
        "tables; no role the policies name bypasses it",
    )


def check_g16(ctx: Context) -> Finding:
    """G16: tasks and operations carry format-checked W3C trace and span ids."""
    f = Findings()
    present = 0
    for t in (ctx.tasks, ctx.ops):
        if t is None:
            continue
        missing = [n for n in ("trace_id", "span_id") if n not in t.columns]
        if missing:
            f.bad(
                f"{t.name} has no {' or '.join(missing)} column: a bad row cannot be "
                "traced to the run that wrote it",
                f"ALTER TABLE {t.display} "
                + ", ".join(f"ADD COLUMN {n} text" for n in missing)
                + ", "
                + ", ".join(
                    f"ADD CONSTRAINT {quote(t.name + '_' + n + '_format')} CHECK ({n} ~ "
                    f"'^[0-9a-f]{{{32 if n == 'trace_id' else 16}}}$')"
                    for n in missing
                )
                + ";",
            )
        else:
            present += 1
    for t in (ctx.tasks, ctx.ops, ctx.events, ctx.outbox):
        if t is None:
            continue
        for n, width in (("trace_id", 32), ("span_id", 16)):
            c = t.columns.get(n)
            if c is None:
                continue
            f.ok(f"column {t.name}.{n}")
            formats = [k.name for k in t.checks_on(n) if k.columns == (n,)]
            if formats:
                f.ok(*(f"check {x}" for x in formats))
            else:
                f.bad(
                    f"{t.name}.{n} has no format CHECK (W3C: {width} lowercase hex digits)",
                    f"ALTER TABLE {t.display} ADD CONSTRAINT "
                    f"{quote(t.name + '_' + n + '_format')} CHECK ({c.qname} ~ "
                    f"'^[0-9a-f]{{{width}}}$');",
                )
    if ctx.tasks is None and ctx.ops is None:
        f.bad("no task or operation table (see G1)")
    return f.finding(
        "G16",
        core_missing=present == 0,
        enforced="tasks and operations carry format-checked W3C trace and span ids",
    )


def check_g17(ctx: Context) -> Finding:
    """G17: tenant data is anchored by RESTRICT keys; credentials are references."""
    if (na := single_tenant("G17", ctx.single_tenant, ctx.tc, ctx.tenant_candidate)) is not None:
        return na
    f = Findings()
    tc = ctx.tc
    owned = ctx.owned
    tenants = ctx.tenants_oid
    ttype = owned[0].columns[tc].type if owned else "uuid"
    tenants_new = fixes.name(ctx, "tenants")
    if tenants is None:
        f.bad(
            f"no tenants table: nothing {tc} references, so deleting a tenant leaves its "
            "rows behind unnoticed",
            f"CREATE TABLE {tenants_new} (id {ttype} PRIMARY KEY, name text NOT NULL);\n"
            + "\n".join(
                f"ALTER TABLE {t.display} ADD CONSTRAINT {quote(t.name + '_tenant_fkey')} "
                f"FOREIGN KEY ({t.q(tc)}) REFERENCES {tenants_new} (id);"
                for t in owned
            ),
        )
    else:
        tenants_table = ctx.cat.by_oid(tenants)
        f.ok(f"table {tenants_table.name if tenants_table else tenants}")
    anchored = _anchored(ctx, tenants)
    if tenants is not None:
        for t in owned:
            if t.oid not in anchored and not t.columns[tc].notnull:
                # A foreign key skips NULL: a row without a tenant is anchored by nothing.
                f.bad(
                    f"{t.name}.{tc} may be NULL: such a row belongs to no tenant and "
                    "outlives every tenant's deletion",
                    f"ALTER TABLE {t.display} ALTER COLUMN {t.q(tc)} SET NOT NULL;",
                )
            elif t.oid not in anchored:
                f.bad(
                    f"{t.name} reaches the tenants table through no NOT NULL foreign key: "
                    "its rows outlive their tenant",
                    f"ALTER TABLE {t.display} ADD CONSTRAINT "
                    f"{quote(t.name + '_tenant_fkey')} FOREIGN KEY ({t.q(tc)}) REFERENCES "
                    f"{ctx.tenants_display()} (id);",
                )
    owned_oids = {t.oid for t in owned}
    restrict = 0
    for t in ctx.cat.tables.values():
        for fk in t.of("f"):
            if not (t.oid in owned_oids or fk.ref_oid in owned_oids or fk.ref_oid == tenants):
                continue
            if fk.on_delete in ("a", "r"):
                restrict += 1
                f.ok(f"fk {fk.name}")
                continue
            verb = _DELETE_RULES[fk.on_delete]
            parent = fk.ref_display
            f.bad(
                f"{fk.name} ON DELETE {verb} {t.name} rows when a {parent} row goes",
                f"ALTER TABLE {t.display} DROP CONSTRAINT {fk.qname}, ADD CONSTRAINT "
                f"{fk.qname} FOREIGN KEY ({column_list([t.q(c) for c in fk.columns])}) REFERENCES "
                f"{parent} ({column_list([quote(c) for c in fk.ref_columns])}); "
                "-- NO ACTION: deletion goes through an explicit routine",
            )
    creds = ctx.kinds["credentials"]
    if creds is not None:
        secretish = [c for c in creds.columns.values() if _SECRET_COLUMN.search(c.name)]
        for c in secretish:
            refs = [
                k.name
                for k in creds.checks_on(c.name)
                if re.search(r" ~\*? | LIKE | SIMILAR TO |starts_with\(|secret", k.definition)
            ]
            if refs:
                f.ok(*(f"check {n}" for n in refs))
            else:
                f.bad(
                    f"{creds.name}.{c.name} may hold a secret value: no CHECK makes it a reference",
                    f"ALTER TABLE {creds.display} ADD CONSTRAINT "
                    f"{quote(creds.name + '_is_reference')} CHECK ({c.qname} ~ "
                    "'^[a-z][a-z0-9+.-]*://[^[:space:]]+$');",
                )
    routines = [r for r in ctx.cat.routines if _DELETION_ROUTINE.search(r.lower())]
    f.ok(*(f"routine {r}" for r in routines))
    how = f"routine {routines[0]}" if routines else "an explicit routine"
    return f.finding(
        "G17",
        core_missing=tenants is None or not anchored,
        enforced=f"every tenant-owned table is anchored to its tenant by {restrict} "
        f"RESTRICT/NO ACTION foreign keys, so tenant data goes only through {how}"
        + ("; credentials are CHECKed references" if creds is not None else ""),
    )


def _anchored(ctx: Context, tenants: int | None) -> set[int]:
    """Tenant-owned tables whose rows cannot exist without their tenant's row."""
    if tenants is None:
        return set()
    anchored: set[int] = set()
    changed = True
    while changed:
        changed = False
        for t in ctx.owned:
            if t.oid in anchored:
                continue
            for fk in t.of("f"):
                required = all(t.columns[c].notnull for c in fk.columns)
                if required and (
                    (fk.ref_oid == tenants and fk.columns == (ctx.tc,)) or fk.ref_oid in anchored
                ):
                    anchored.add(t.oid)
                    changed = True
                    break
    return anchored
