"""The state of a migrated schema, read back from the catalog: as JSON and as SQL.

    python -m dev.schema_state catalogue --dsn URL [--schema S]
    python -m dev.schema_state baseline --dsn SERVER_URL > tests/baseline/catalogue.json
    python -m dev.schema_state sql --dsn URL [--schema S]
    python -m dev.schema_state write [--dsn URL]      # make schema

``catalogue`` prints every object of agentdb's in the schema - tables and
their columns (type, default, nullability, in order), constraints (name and
definition), indexes, triggers, policies, grants, RLS flags, sequences,
routines (signature, language, volatility, security, settings, grants, a
digest of its code, comments left out) and the seed rows of agent_transitions -
as stable JSON.
``tests/baseline/catalogue.json`` froze it for a database migrated by the
migrations before they were squashed (0001-0029), and
``tests/test_schema_state.py`` checks the squashed migrations give the same.

``sql`` renders the same objects as SQL, grouped by table (its columns,
constraints, indexes, triggers, RLS, policies and grants together), then the
routines: ``sql/schema.sql``, the current state a reader opens first.
``write`` migrates a fresh database (on ``--dsn`` / ``AGENTDB_TEST_DSN``, or
an embedded Postgres) and writes that file; a test fails when the file
differs from what the migrations make.

Names are read with the schema on the search_path, so nothing is qualified
with it; the role that ran the migrations (the tables' owner) is written as
OWNER in the JSON and CURRENT_USER in the SQL; the month partitions of
agent_events (``--events-by-month``) are named relative to the current month.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["OWNER", "catalogue", "main", "render_sql", "write_schema_file"]

OWNER = "OWNER"
_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = _ROOT / "sql" / "schema.sql"

# Tables and sequences are agentdb's by name; yoyo's bookkeeping is not the schema.
_RELATIONS = """
SELECT c.oid, c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity,
       c.relispartition, pg_get_partkeydef(c.oid) AS partkey,
       pg_get_expr(c.relpartbound, c.oid) AS bound,
       (SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
        WHERE i.inhrelid = c.oid) AS parent,
       c.relowner, c.relacl, c.reloptions
FROM pg_class c
WHERE c.relnamespace = %(nsp)s::regnamespace AND c.relkind IN ('r', 'p', 'S')
  AND c.relname NOT LIKE '\\_yoyo%%' AND c.relname <> 'yoyo_lock'
ORDER BY c.relname
"""
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid) AS "default", a.attidentity, a.attgenerated
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_CONSTRAINTS = """
SELECT c.conname, c.contype, pg_get_constraintdef(c.oid) AS def, c.condeferrable,
       c.condeferred, c.convalidated
FROM pg_constraint c WHERE c.conrelid = %(oid)s ORDER BY c.conname
"""
_INDEXES = """
SELECT i.relname, pg_get_indexdef(x.indexrelid) AS def
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = %(oid)s
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid
                                                  AND c.conrelid = x.indrelid)
ORDER BY i.relname
"""
_TRIGGERS = """
SELECT t.tgname, pg_get_triggerdef(t.oid) AS def, t.tgenabled
FROM pg_trigger t
WHERE t.tgrelid = %(oid)s AND (NOT t.tgisinternal OR t.tgconstraint <> 0)
  AND t.tgname NOT LIKE 'RI\\_ConstraintTrigger%%'
ORDER BY t.tgname
"""
_POLICIES = """
SELECT y.polname, y.polcmd, y.polpermissive, y.polroles::oid[] AS roles,
       pg_get_expr(y.polqual, y.polrelid) AS qual,
       pg_get_expr(y.polwithcheck, y.polrelid) AS with_check
FROM pg_policy y WHERE y.polrelid = %(oid)s ORDER BY y.polname
"""
_ROUTINES = """
SELECT p.oid, p.proname, pg_get_function_identity_arguments(p.oid) AS args, p.prokind,
       pg_get_function_result(p.oid) AS result, l.lanname, p.provolatile, p.prosecdef,
       p.proisstrict, p.proparallel, p.proleakproof, p.proconfig, p.prosrc, p.proowner,
       p.proacl
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = %(nsp)s::regnamespace
ORDER BY p.proname, args
"""
_ACL = """
SELECT a.grantee, a.privilege_type, a.is_grantable FROM aclexplode(%(acl)s::aclitem[]) a
"""
_OWNED_BY = """
SELECT t.relname || '.' || a.attname FROM pg_depend d
JOIN pg_class t ON t.oid = d.refobjid
JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.classid = 'pg_class'::regclass AND d.objid = %(oid)s AND d.deptype = 'a'
"""
_SEQUENCE = "SELECT format_type(s.seqtypid, NULL) FROM pg_sequence s WHERE s.seqrelid = %(oid)s"
_TRANSITIONS = """
SELECT entity, from_state, to_state FROM agent_transitions ORDER BY entity, from_state, to_state
"""
_POLCMD = {"r": "SELECT", "a": "INSERT", "w": "UPDATE", "d": "DELETE", "*": "ALL"}
_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")


def code_of(body: str) -> str:
    """A routine's body without its comments and with its whitespace collapsed: what runs.

    ``--`` starts a comment only outside a string literal ('-----BEGIN' is code).
    """
    out: list[str] = []
    i, quoted = 0, False
    while i < len(body):
        ch = body[i]
        if quoted:
            out.append(ch)
            quoted = ch != "'"
        elif ch == "'":
            out.append(ch)
            quoted = True
        elif body.startswith("--", i):
            end = body.find("\n", i)
            i = len(body) if end < 0 else end
            continue
        else:
            out.append(ch)
        i += 1
    return " ".join("".join(out).split())


def _role_name(conn: psycopg.Connection[Any], oid: int, owner: int) -> str:
    if oid == 0:
        return "PUBLIC"
    if oid == owner:
        return OWNER
    row = conn.execute("SELECT rolname FROM pg_roles WHERE oid = %s", (oid,)).fetchone()
    return str(row[0]) if row else f"<role {oid}>"


def _grants(conn: psycopg.Connection[Any], acl: Any, owner: int) -> list[str]:
    """An ACL as sorted 'role:PRIVILEGE' items (None: the default, the owner's only)."""
    if acl is None:
        return ["<default>"]
    rows = conn.execute(_ACL, {"acl": acl}).fetchall()
    return sorted(
        f"{_role_name(conn, r[0], owner)}:{r[1]}{' WITH GRANT OPTION' if r[2] else ''}"
        for r in rows
    )


Months = list[tuple[str, str]]


def _month_names(conn: psycopg.Connection[Any]) -> Months:
    """(literal, relative name) for the months around now: partitions are named by month."""
    row = conn.execute("SELECT date_trunc('month', now(), 'UTC') AT TIME ZONE 'UTC'").fetchone()
    assert row is not None
    base: datetime = row[0]
    pairs: list[tuple[str, str]] = []
    for k in range(-3, 6):
        total = base.year * 12 + base.month - 1 + k
        year, month = divmod(total, 12)
        month += 1
        tag = f"(month{k:+d})"
        pairs.append((f"p{year:04d}_{month:02d}", f"p{tag}"))
        pairs.append((f"{year:04d}-{month:02d}-01 00:00:00+00", tag))
    return pairs


def _relative(text: str, months: Months) -> str:
    for literal, name in months:
        text = text.replace(literal, name)
    return text


def _unqualified(text: str, nsp: str) -> str:
    """pg_get_indexdef and pg_get_triggerdef name the table with its schema: drop it."""
    return re.sub(rf"\b{re.escape(nsp)}\.(?=agent)", "", text)


@contextlib.contextmanager
def _in_schema(dsn: str, schema: str | None) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if schema is None:
            row = conn.execute("SELECT current_schema()").fetchone()
            if row is None or row[0] is None:
                raise SystemExit("no schema on the search_path; pass --schema")
            schema = str(row[0])
        # On the search_path alone: pg_get_*def then qualify nothing of ours.
        conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        conn.execute("SET TimeZone = 'UTC'")
        yield conn, schema


def catalogue(dsn: str, schema: str | None = None) -> dict[str, Any]:
    """Every object of agentdb's in ``schema`` (default: the first on the search_path)."""
    with _in_schema(dsn, schema) as (conn, nsp):
        return _catalogue(conn, nsp)


def _catalogue(conn: psycopg.Connection[Any], nsp: str) -> dict[str, Any]:
    months = _month_names(conn)
    tables: dict[str, Any] = {}
    sequences: dict[str, Any] = {}
    for rel in conn.execute(_RELATIONS, {"nsp": nsp}).fetchall():
        # Storage parameters (0018's fillfactor) are in schema.sql, not in the
        # catalogue record the squash was held to: the layers set none.
        oid, name, kind, rls, force, _, partkey, bound, parent, owner, acl, _ = rel
        key = _relative(name, months)
        if kind == "S":
            seq_type = conn.execute(_SEQUENCE, {"oid": oid}).fetchone()
            owned = conn.execute(_OWNED_BY, {"oid": oid}).fetchone()
            sequences[key] = {
                "type": seq_type[0] if seq_type else None,
                "owned_by": _relative(owned[0], months) if owned else None,
                "grants": _grants(conn, acl, owner),
            }
            continue
        tables[key] = {
            "kind": "partitioned" if kind == "p" else "table",
            "partition_key": partkey,
            "partition_of": parent,
            "partition_bound": _relative(bound, months) if bound else None,
            "rls": rls,
            "force_rls": force,
            "columns": [
                {
                    "name": c[0],
                    "type": c[1],
                    "not_null": c[2],
                    "default": c[3],
                    "identity": c[4],
                    "generated": c[5],
                }
                for c in conn.execute(_COLUMNS, {"oid": oid}).fetchall()
            ],
            "constraints": {
                _relative(c[0], months): {
                    "type": c[1],
                    "definition": c[2],
                    "deferrable": c[3],
                    "deferred": c[4],
                    "validated": c[5],
                }
                for c in conn.execute(_CONSTRAINTS, {"oid": oid}).fetchall()
            },
            "indexes": {
                _relative(i[0], months): _relative(_unqualified(i[1], nsp), months)
                for i in conn.execute(_INDEXES, {"oid": oid}).fetchall()
            },
            "triggers": {
                t[0]: {"definition": _relative(_unqualified(t[1], nsp), months), "enabled": t[2]}
                for t in conn.execute(_TRIGGERS, {"oid": oid}).fetchall()
            },
            "policies": {
                p[0]: {
                    "command": _POLCMD[p[1]],
                    "permissive": p[2],
                    "roles": sorted(_role_name(conn, r, owner) for r in p[3]),
                    "using": p[4],
                    "with_check": p[5],
                }
                for p in conn.execute(_POLICIES, {"oid": oid}).fetchall()
            },
            "grants": _grants(conn, acl, owner),
        }
    routines: dict[str, Any] = {}
    for r in conn.execute(_ROUTINES, {"nsp": nsp}).fetchall():
        _, name, args, kind, result, lang, volatile, secdef, strict, parallel, leak, config = r[:12]
        body, owner, acl = r[12:]
        routines[f"{name}({args})"] = {
            "kind": {"f": "function", "p": "procedure", "a": "aggregate", "w": "window"}[kind],
            "returns": result,
            "language": lang,
            "volatility": {"i": "immutable", "s": "stable", "v": "volatile"}[volatile],
            "security_definer": secdef,
            "strict": strict,
            "parallel": {"s": "safe", "r": "restricted", "u": "unsafe"}[parallel],
            "leakproof": leak,
            "settings": sorted(
                s.replace(f"search_path={nsp},", "search_path=<schema>,") for s in config or []
            ),
            "grants": _grants(conn, acl, owner),
            # Of the code, not its comments: a comment may say more now, the code may not.
            "code_md5": hashlib.md5(code_of(body).encode(), usedforsecurity=False).hexdigest(),
        }
    has_transitions = "agent_transitions" in tables
    rows = [list(r) for r in conn.execute(_TRANSITIONS).fetchall()] if has_transitions else []
    return {
        "tables": tables,
        "sequences": sequences,
        "routines": routines,
        "rows": {"agent_transitions": rows},
    }


def dumps(state: dict[str, Any]) -> str:
    """The catalogue as the stable JSON text the baseline file holds."""
    return json.dumps(state, indent=1, sort_keys=True) + "\n"


# ---- SQL ------------------------------------------------------------------------------------

_HEADER = """\
-- agentdb: the current state of the schema, one object after another.
--
-- GENERATED by `make schema` from a database migrated by sql/migrations/
-- (tests/test_schema_state.py fails when this file and the migrations differ).
-- Do not edit it, and do not apply it: the migrations are what you apply
-- (`agentdb migrate`, yoyo, or `agentdb sql`); their comments say why each
-- object is there and which guarantee (G1...) it serves. This is what they
-- leave behind, read back from the catalog: each table with its columns,
-- constraints, indexes, triggers, row-level security, policies and grants,
-- then every routine. CURRENT_USER is the role that ran the migrations (the
-- owner); <schema> the schema they ran in.
"""


def render_sql(dsn: str, schema: str | None = None) -> str:
    """The schema as SQL text, grouped by object (see the module docstring)."""
    with _in_schema(dsn, schema) as (conn, nsp):
        return _render(conn, nsp)


def _acl_statements(conn: psycopg.Connection[Any], acl: Any, owner: int, target: str) -> list[str]:
    """GRANT / REVOKE statements that turn the default ACL of ``target`` into ``acl``."""
    if acl is None:
        return []
    by_role: dict[str, list[str]] = {}
    public = False
    for grantee, privilege, grantable in conn.execute(_ACL, {"acl": acl}).fetchall():
        if grantee == owner:
            continue
        if grantee == 0:
            public = True
        role = _role_name(conn, grantee, owner)
        by_role.setdefault(role, []).append(privilege + (" (grantable)" if grantable else ""))
    out = []
    if target.startswith(("FUNCTION ", "PROCEDURE ")) and not public:
        out.append(f"REVOKE EXECUTE ON {target} FROM PUBLIC;")
    for role, privileges in sorted(by_role.items()):
        order = {p: i for i, p in enumerate(_PRIVILEGES)}
        listed = ", ".join(sorted(privileges, key=lambda p: (order.get(p, 99), p)))
        out.append(f"GRANT {listed} ON {target} TO {role};")
    return out


def _render(conn: psycopg.Connection[Any], nsp: str) -> str:
    from agentdb.schema import migration_ids

    months = _month_names(conn)
    ids = migration_ids()
    out = [_HEADER + f"--\n-- Migrations: {ids[0]} ... {ids[-1]} ({len(ids)}).\n"]
    rels = conn.execute(_RELATIONS, {"nsp": nsp}).fetchall()
    seqs = [r for r in rels if r[2] == "S"]
    if seqs:
        out.append("-- ==== sequences " + "=" * 68 + "\n")
        for oid, name, *_, owner, acl in seqs:
            out += _sequence_sql(conn, oid, name, owner, acl, months)
        out.append("")
    for rel in rels:
        if rel[2] != "S":
            out += _table_sql(conn, rel, nsp, months)
            out.append("")
    out.append("-- ==== routines " + "=" * 69 + "\n")
    for r in conn.execute(_ROUTINES, {"nsp": nsp}).fetchall():
        out += _routine_sql(conn, r, nsp)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _sequence_sql(
    conn: psycopg.Connection[Any], oid: int, name: str, owner: int, acl: Any, months: Months
) -> list[str]:
    seq_type = conn.execute(_SEQUENCE, {"oid": oid}).fetchone()
    owned = conn.execute(_OWNED_BY, {"oid": oid}).fetchone()
    line = f"CREATE SEQUENCE {_relative(name, months)}"
    line += f" AS {seq_type[0]}" if seq_type else ""
    line += f" OWNED BY {_relative(owned[0], months)};" if owned else ";"
    return [line, *_acl_statements(conn, acl, owner, f"SEQUENCE {name}")]


def _table_sql(
    conn: psycopg.Connection[Any], rel: tuple[Any, ...], nsp: str, months: Months
) -> list[str]:
    """One table: its columns and constraints, then indexes, triggers, RLS, policies, grants."""
    oid, name, _, rls, force, _, partkey, bound, parent, owner, acl, options = rel
    name = _relative(name, months)
    out = [f"-- ==== {name} " + "=" * max(4, 78 - len(name)) + "\n"]
    cols = conn.execute(_COLUMNS, {"oid": oid}).fetchall()
    cons = sorted(
        conn.execute(_CONSTRAINTS, {"oid": oid}).fetchall(),
        key=lambda c: ("pufxct".find(c[1]), c[0]),  # keys, then foreign keys, then checks
    )
    columns = [
        f"    {c[0]} {c[1]}" + (" NOT NULL" if c[2] else "") + (f" DEFAULT {c[3]}" if c[3] else "")
        for c in cols
    ]
    constraints = [_constraint_sql(c, months) for c in cons]
    if parent is not None:
        head = f"CREATE TABLE {name} PARTITION OF {parent} {_relative(bound, months)}"
        out.append(head + (" (\n" + ",\n".join(constraints) + "\n);" if cons else ";"))
    else:
        tail = f" PARTITION BY {partkey}" if partkey else ""
        tail += f" WITH ({', '.join(options)});" if options else ";"
        out.append(f"CREATE TABLE {name} (\n" + ",\n".join(columns + constraints) + "\n)" + tail)
    for _, idef in conn.execute(_INDEXES, {"oid": oid}).fetchall():
        out.append(_relative(_unqualified(idef, nsp), months) + ";")
    for tgname, tdef, enabled in conn.execute(_TRIGGERS, {"oid": oid}).fetchall():
        out.append(_relative(_unqualified(tdef, nsp), months) + ";")
        if enabled == "D":
            out.append(f"ALTER TABLE {name} DISABLE TRIGGER {tgname};")
    if rls:
        out.append(f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY;")
    if force:
        out.append(f"ALTER TABLE {name} FORCE ROW LEVEL SECURITY;")
    for policy in conn.execute(_POLICIES, {"oid": oid}).fetchall():
        out.append(_policy_sql(conn, policy, name, owner))
    out += _acl_statements(conn, acl, owner, name)
    if name == "agent_transitions":
        rows = conn.execute(_TRANSITIONS).fetchall()
        values = ",\n".join(f"    ('{e}', '{f}', '{t}')" for e, f, t in rows)
        out.append(
            "-- The lifecycle graph (G6): rows, not schema, but the migrations write them.\n"
            f"INSERT INTO agent_transitions (entity, from_state, to_state) VALUES\n{values};"
        )
    return out


def _constraint_sql(con: tuple[Any, ...], months: Months) -> str:
    conname, _, condef, deferrable, deferred, validated = con
    line = f"    CONSTRAINT {_relative(conname, months)} {condef}"
    line += " DEFERRABLE" if deferrable and "DEFERRABLE" not in condef else ""
    line += " INITIALLY DEFERRED" if deferred and "DEFERRED" not in condef else ""
    return line + (" NOT VALID" if not validated and "NOT VALID" not in condef else "")


def _policy_sql(
    conn: psycopg.Connection[Any], policy: tuple[Any, ...], table: str, owner: int
) -> str:
    pname, cmd, permissive, roles, qual, check = policy
    named = (_role_name(conn, r, owner) for r in roles)
    who = ", ".join(sorted("CURRENT_USER" if n == OWNER else n for n in named))
    line = f"CREATE POLICY {pname} ON {table}"
    line += "" if permissive else " AS RESTRICTIVE"
    line += f" FOR {_POLCMD[cmd]}" if cmd != "*" else ""
    line += f" TO {who}"
    line += f" USING ({qual})" if qual is not None else ""
    line += f" WITH CHECK ({check})" if check is not None else ""
    return line + ";"


def _routine_sql(conn: psycopg.Connection[Any], routine: tuple[Any, ...], nsp: str) -> list[str]:
    oid, name, args, kind = routine[:4]
    owner, acl = routine[13:]
    row = conn.execute("SELECT pg_get_functiondef(%s)", (oid,)).fetchone()
    assert row is not None
    head, _, rest = str(row[0]).rstrip().partition("\n")
    text = _unqualified(head, nsp) + "\n" + rest  # the CREATE line names the schema
    text = text.replace(
        f"SET search_path TO '{nsp}', 'pg_temp'", "SET search_path TO <schema>, pg_temp"
    )
    target = f"{'PROCEDURE' if kind == 'p' else 'FUNCTION'} {name}({args})"
    return [text + ";", *_acl_statements(conn, acl, owner, target)]


# ---- make schema ----------------------------------------------------------------------------


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    from agentdb.tools.embedded import embedded_postgres

    with embedded_postgres(migrate=False) as url:
        yield url


@contextlib.contextmanager
def fresh_database(dsn: str) -> Iterator[str]:
    """A new, empty database on ``dsn``'s server (dropped after the block): its DSN."""
    from urllib.parse import urlsplit, urlunsplit

    name = f"agentdb_schema_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(dsn)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def migrated_catalogue(dsn: str, *, events_by_month: bool = False) -> dict[str, Any]:
    """Migrate a fresh database on ``dsn``'s server (optionally by month) and read it back."""
    from agentdb.migrate import migrate

    with fresh_database(dsn) as url:
        migrate(url, events_by_month=events_by_month, notify=lambda _line: None)
        return catalogue(url)


def baseline(dsn: str) -> dict[str, Any]:
    """The catalogue of both layouts (one events table; events by month), for the baseline."""
    return {
        "plain": migrated_catalogue(dsn),
        "events_by_month": migrated_catalogue(dsn, events_by_month=True),
    }


def migrated_schema_sql(dsn: str) -> str:
    """Migrate a fresh database on ``dsn``'s server and render its schema."""
    from agentdb.migrate import migrate

    with fresh_database(dsn) as url:
        migrate(url, notify=lambda _line: None)
        return render_sql(url)


def write_schema_file(dsn: str | None, path: Path = SCHEMA_FILE) -> bool:
    """Write ``sql/schema.sql`` anew; return whether it changed."""
    with _server(dsn) as url:
        text = migrated_schema_sql(url)
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old != text:
        path.write_text(text, encoding="utf-8")
    return old != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.schema_state")
    parser.add_argument("what", choices=("catalogue", "baseline", "sql", "write"))
    parser.add_argument("--dsn", default=None, help="a migrated database (write: any server)")
    parser.add_argument("--schema", default=None)
    args = parser.parse_args(argv)
    if args.what == "baseline":
        url = args.dsn or os.environ.get("AGENTDB_TEST_DSN")
        if not url:
            parser.error("baseline needs --dsn (a server to create two databases on)")
        sys.stdout.write(dumps(baseline(url)))
        return 0
    if args.what == "write":
        changed = write_schema_file(args.dsn or os.environ.get("AGENTDB_TEST_DSN"))
        print(f"{SCHEMA_FILE.relative_to(_ROOT)} {'written' if changed else 'unchanged'}")
        return 0
    if not args.dsn:
        parser.error("--dsn is required")
    if args.what == "catalogue":
        sys.stdout.write(dumps(catalogue(args.dsn, args.schema)))
    else:
        sys.stdout.write(render_sql(args.dsn, args.schema))
    return 0


if __name__ == "__main__":
    sys.exit(main())
