"""The catalog of one schema, read once, read-only, into plain objects the checks inspect.

Only ``pg_catalog`` is read, inside a READ ONLY transaction: a role with no
table privileges can run the audit, and it cannot write even by mistake.
Every statement is static text with parameters; names reach fixes already
quoted by the server (``quote_ident``) or by :func:`quote`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg

from agentdb import _dsn
from agentdb.errors import AgentDBError, ConfigurationError, DatabaseUnavailable
from agentdb.tools.audit import catalog_sql as q

__all__ = [
    "AuditError",
    "Catalog",
    "Column",
    "Constraint",
    "Index",
    "Policy",
    "Rule",
    "Table",
    "Trigger",
    "keyed_rows",
    "quote",
    "read_only",
    "snapshot",
]


class AuditError(AgentDBError):
    """The catalog could not be read (the server refused a catalog query)."""


# --- the model -------------------------------------------------------------------
# Names as the catalog spells them (for messages and matching) beside their
# quoted forms (for fixes); nothing is fetched again after the snapshot.


@dataclass(frozen=True, slots=True)
class Column:
    """A column, its type resolved through domains, with the values an enum or domain allows."""

    name: str
    qname: str
    notnull: bool
    type: str
    base: str  # the type's name; a domain's base type
    enum_labels: tuple[str, ...]
    domain_checks: tuple[str, ...]
    has_default: bool = False  # a DEFAULT, an identity or a generated column
    generated: bool = False

    @property
    def is_json(self) -> bool:
        return self.base in ("json", "jsonb")

    @property
    def is_payload(self) -> bool:
        """A column that holds a document or blob whose size only a CHECK bounds."""
        return self.base in ("json", "jsonb", "bytea")


@dataclass(frozen=True, slots=True)
class Constraint:
    """A PRIMARY KEY, UNIQUE, FOREIGN KEY, CHECK or EXCLUDE constraint of a table."""

    name: str
    qname: str
    type: str  # p u f c x
    columns: tuple[str, ...]
    ref_oid: int
    ref_display: str
    ref_columns: tuple[str, ...]
    on_delete: str  # a r c n d
    definition: str


@dataclass(frozen=True, slots=True)
class Index:
    """An index of a table: its key columns, expressions and partial predicate."""

    name: str
    unique: bool
    primary: bool
    columns: tuple[str, ...]  # key columns; '' for an expression
    expressions: str | None
    predicate: str | None
    backs_constraint: bool
    valid: bool
    partition: str | None = None  # read from this partition (on every one of them)


@dataclass(frozen=True, slots=True)
class Trigger:
    """A user trigger and the source of its function, read for what it guards."""

    name: str
    tgtype: int
    enabled: bool
    columns: tuple[str, ...]  # UPDATE OF columns; empty for any column
    function: str
    source: str
    conditional: bool = False  # a WHEN clause: it fires for some rows only

    # pg_trigger.tgtype bits (include/catalog/pg_trigger.h).
    @property
    def row(self) -> bool:
        return bool(self.tgtype & 1)

    @property
    def before(self) -> bool:
        return bool(self.tgtype & 2)

    @property
    def on_insert(self) -> bool:
        return bool(self.tgtype & 4)

    @property
    def on_delete(self) -> bool:
        return bool(self.tgtype & 8)

    @property
    def on_update(self) -> bool:
        return bool(self.tgtype & 16)

    @property
    def on_truncate(self) -> bool:
        return bool(self.tgtype & 32)

    def raises(self) -> bool:
        # A RAISE in a comment ("-- TODO: RAISE ...") refuses nothing.
        return _RAISES.search(_COMMENTS.sub(" ", self.source)) is not None

    def reads_old(self, column: str) -> bool:
        pattern = rf"\bOLD\s*\.\s*(?:{re.escape(column)}|\"{re.escape(column)}\")(?!\w)"
        return re.search(pattern, self.source, re.IGNORECASE) is not None

    def mentions(self, name: str) -> bool:
        return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", self.source, re.IGNORECASE) is not None


_RAISES = re.compile(r"\bRAISE\b(?!\s+(?:NOTICE|WARNING|INFO|LOG|DEBUG)\b)", re.IGNORECASE)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Policy:
    """A row-level security policy."""

    name: str
    permissive: bool
    roles: tuple[str, ...]
    qual: str | None
    with_check: str | None
    #: The USING expression reads a column (of the row, or of a subquery's table).
    reads_row: bool = True


@dataclass(frozen=True, slots=True)
class Rule:
    """A rewrite rule (an enabled one: disabled rules change nothing)."""

    name: str
    event: str  # 1 select, 2 update, 3 insert, 4 delete
    instead: bool
    conditional: bool = False  # a WHERE clause: it rewrites some rows only


@dataclass(slots=True)
class Table:
    """A table of the audited schema with everything the checks look at."""

    oid: int
    name: str
    display: str
    owner: str
    rls: bool
    force_rls: bool
    kind: str = "r"  # pg_class.relkind: r ordinary, p partitioned, f foreign
    persistence: str = "p"  # p permanent, u unlogged
    partition_key: tuple[str, ...] = ()
    children: int = 0  # partitions or inheriting tables
    columns: dict[str, Column] = field(default_factory=dict)
    constraints: list[Constraint] = field(default_factory=list)
    indexes: list[Index] = field(default_factory=list)
    triggers: list[Trigger] = field(default_factory=list)
    policies: list[Policy] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    grants: list[tuple[str, str]] = field(default_factory=list)  # (grantee, privilege)
    #: partitions granted to someone that do not force row-level security themselves
    exposed_partitions: list[str] = field(default_factory=list)

    def col(self, *names: str) -> Column | None:
        """The first of ``names`` that is a column of this table, else ``None``."""
        for n in names:
            if n in self.columns:
                return self.columns[n]
        return None

    def q(self, column: str) -> str:
        """``column`` quoted for a fix, whether or not the table has it yet."""
        c = self.columns.get(column)
        return c.qname if c is not None else quote(column)

    def of(self, kind: str) -> list[Constraint]:
        """The constraints of one ``pg_constraint.contype`` (``p u f c x``)."""
        return [c for c in self.constraints if c.type == kind]

    @property
    def pk(self) -> Constraint | None:
        return next(iter(self.of("p")), None)

    def checks_on(self, column: str) -> list[Constraint]:
        return [c for c in self.of("c") if column in c.columns]

    def live_triggers(self) -> list[Trigger]:
        return [t for t in self.triggers if t.enabled]

    def guards_reading(self, tables: list[Table], event: str) -> list[Trigger]:
        """Live row triggers on ``event`` (``"insert"`` or ``"update"``) that can RAISE and
        name one of ``tables``: what enforces a rule kept in another table."""
        return [
            g
            for g in self.live_triggers()
            if g.row
            and (g.on_insert if event == "insert" else g.on_update)
            and g.raises()
            and any(g.mentions(t.name) for t in tables)
        ]

    def update_guards(self, column: str, *, every_row: bool = False) -> list[Trigger]:
        """Live row triggers that run before an UPDATE, read ``OLD.column`` and can RAISE.

        With ``every_row``, only those without a WHEN clause: a rule every change
        must pass (a state's edges, a version's +1) is no rule if a WHEN can skip
        it (``WHEN (pg_trigger_depth() > 5)``). Other guards narrow themselves to
        the rows they judge (a deadline guard to tasks that have one)."""
        return [
            g
            for g in self.live_triggers()
            if g.row
            and g.before
            and g.on_update
            and not (every_row and g.conditional)
            and g.reads_old(column)
            and g.raises()
        ]

    def unique_keys(self) -> list[tuple[str, tuple[str, ...], str | None]]:
        """(name, key columns, partial predicate) of every UNIQUE constraint or index.

        An expression key counts the columns it names (``COALESCE(k, '')`` is a key on ``k``).
        """
        keys: list[tuple[str, tuple[str, ...], str | None]]
        keys = [(c.name, c.columns, None) for c in self.of("u")]
        keys += [
            (i.name, self.index_columns(i), i.predicate)
            for i in self.indexes
            if i.unique and not i.primary and not i.backs_constraint and i.valid
        ]
        return keys

    def index_columns(self, index: Index) -> tuple[str, ...]:
        """The index's plain key columns, then the columns its key expressions name."""
        plain = tuple(c for c in index.columns if c)
        if not index.expressions:
            return plain
        named = tuple(
            c.name
            for c in self.columns.values()
            if c.name not in plain
            and re.search(rf"(?<![\w\"]){re.escape(c.qname)}(?![\w\"])", index.expressions)
        )
        return plain + named

    def pk_columns(self) -> tuple[str, ...]:
        """The primary key's columns (empty without one)."""
        return self.pk.columns if self.pk is not None else ()


@dataclass(slots=True)
class Catalog:
    """What one snapshot read: the connection's context and the schema's tables."""

    database: str
    schema: str
    role: str
    role_super: bool
    role_bypassrls: bool
    server_version: str
    tables: dict[str, Table]
    elevated: list[tuple[str, str, bool, bool]]  # (member, via policy role, super, bypassrls)
    routines: list[str]
    prefix: str = ""  # the schema as fixes qualify new objects ("" on the search_path)
    citus: str | None = None  # the citus extension's version, when installed
    # Citus tables by oid: (method 'h' hash / 'n' reference, distribution column, colocation)
    distributed: dict[int, tuple[str, str | None, int]] = field(default_factory=dict)

    def by_oid(self, oid: int) -> Table | None:
        for t in self.tables.values():
            if t.oid == oid:
                return t
        return None


_HIDE_SHARDS = """SELECT set_config('citus.override_table_visibility', 'on', false)
    FROM pg_extension WHERE extname = 'citus'"""
_SIMPLE_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


# Every keyword PostgreSQL 15 does not leave free as a name (pg_get_keywords() with a
# catcode other than U): quote_ident() quotes these, and a fix naming a column `user`
# unquoted is a syntax error.
_KEYWORD_WORDS = (
    "all analyse analyze and any array as asc asymmetric authorization between bigint binary "
    "bit boolean both case cast char character check coalesce collate collation column "
    "concurrently constraint create cross current_catalog current_date current_role "
    "current_schema current_time current_timestamp current_user dec decimal default "
    "deferrable desc distinct do else end except exists extract false fetch float for foreign "
    "freeze from full grant greatest group grouping having ilike in initially inner inout int "
    "integer intersect interval into is isnull join lateral leading least left like limit "
    "localtime localtimestamp national natural nchar none normalize not notnull null nullif "
    "numeric offset on only or order out outer overlaps overlay placing position precision "
    "primary real references returning right row select session_user setof similar smallint "
    "some substring symmetric table tablesample then time timestamp to trailing treat trim "
    "true union unique user using values varchar variadic verbose when where window with "
    "xmlattributes xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi "
    "xmlroot xmlserialize xmltable"
)
_KEYWORDS = frozenset(_KEYWORD_WORDS.split())


_NOT_NULL_ONLY = re.compile(r"^\(*\s*(?:\(*[\w\"]+\)* IS NOT NULL\)*(?:\s+AND\s+)?)+\s*\)*$")
_NOT_NULL_OF = re.compile(r"([\w\"]+)\)* IS NOT NULL")


def keyed_rows(pred: str | None, cols: tuple[str, ...]) -> bool:
    """Whether a unique index with predicate ``pred`` covers every row that has a key:
    none, or only "IS NOT NULL" of its own key columns (a NULL key is never a duplicate;
    "WHERE result IS NOT NULL" leaves every key without a result free to repeat)."""
    if pred is None:
        return True
    named = {c.strip('"') for c in _NOT_NULL_OF.findall(pred)}
    return _NOT_NULL_ONLY.match(pred) is not None and named <= set(cols)


def quote(name: str) -> str:
    """Quote an identifier for a suggested fix, the way quote_ident() would."""
    name = name[:63]
    if _SIMPLE_IDENT.match(name) and name not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


# --- reading it ----------------------------------------------------------------


@contextmanager
def read_only(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Yield a connection inside a READ ONLY transaction, rolled back at the end.

    Raises:
        ConfigurationError: no or malformed DSN, or libpq refuses its options.
        DatabaseUnavailable: the server cannot be reached, refuses the login or
            drops the connection.
        AuditError: the server refused a statement run on the connection.
    """
    try:
        # No prepared statements: behind a transaction pooler one would stay on a shared
        # server connection and collide with the next client's (42P05).
        conn = psycopg.connect(_dsn.libpq(dsn), connect_timeout=10, prepare_threshold=None)
    except psycopg.OperationalError as exc:
        # libpq's first line names the failure; later lines are indented hints.
        text = str(exc).strip()
        reason = text.splitlines()[0].strip() if text else type(exc).__name__
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {reason}") from exc
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"cannot use {_dsn.redact(dsn)}: {exc}") from exc
    try:
        # On Citus, shards hidden again (`migrate --citus` shows them to agentdb's
        # sessions, see agentdb._citus.migrate): the audit reads the tables, not
        # their shards. Committed, or the rollback below would undo it.
        conn.execute(_HIDE_SHARDS)
        conn.commit()
        # Every transaction psycopg opens on this connection is BEGIN READ ONLY:
        # the audit cannot write even by mistake.
        conn.read_only = True
        yield conn
    except psycopg.Error as exc:
        raise _translate(exc, dsn) from exc
    finally:
        # A failed rollback means the connection is gone; the error above says why.
        with suppress(psycopg.Error):
            conn.rollback()
        conn.close()


def _translate(exc: psycopg.Error, dsn: str) -> AgentDBError:
    """Map a catalog query failure on its SQLSTATE, never its message text."""
    state = exc.sqlstate or ""
    primary = exc.diag.message_primary or type(exc).__name__
    if not state or state.startswith("08") or state in ("57P01", "57P02", "57P03"):
        return DatabaseUnavailable(f"lost the connection to {_dsn.redact(dsn)}: {primary}")
    if state == "42501":
        return AuditError(f"this role may not read the catalog (SQLSTATE 42501): {primary}")
    return AuditError(f"reading the catalog failed (SQLSTATE {state}): {primary}")


def _rows(
    conn: psycopg.Connection[Any], query: LiteralString, *params: Any
) -> list[tuple[Any, ...]]:
    return conn.execute(query, params).fetchall()


def snapshot(conn: psycopg.Connection[Any], schema: str | None) -> Catalog:  # noqa: C901, PLR0912 - one read per catalog, in order
    """Read ``schema`` (default: the first on the search_path) from the catalog.

    Raises:
        ConfigurationError: no such schema, or none on the search_path exists.
        AuditError: the role is not in pg_roles, or the transaction is not read-only.
        psycopg.Error: a catalog query failed (:func:`read_only` maps it).
    """
    ctx = _rows(conn, q.CONTEXT)
    if not ctx:
        raise AuditError("the connecting role is not in pg_roles")
    role, database, current, version, transaction_read_only, rolsuper, bypass = ctx[0]
    if transaction_read_only != "on":
        raise AuditError("the audit transaction is not read-only; refusing to continue")
    target = schema if schema is not None else current
    if target is None:
        raise ConfigurationError(
            "no schema on the search_path exists in this database; pass --schema"
        )
    found = _rows(conn, q.SCHEMA, target)
    if not found:
        raise ConfigurationError(f"schema {target!r} does not exist in database {database!r}")
    nsp, qschema = found[0]
    prefix = "" if target == current else f"{qschema}."

    tables: dict[int, Table] = {}
    for oid, rel, qrel, rls, force, owner, kind, persistence, partkey, children in _rows(
        conn, q.TABLES, nsp
    ):
        tables[oid] = Table(
            oid, rel, prefix + qrel, owner, rls, force, kind, persistence, tuple(partkey), children
        )
    # Every loop below skips rows of relations that are not audited tables
    # (partitions, views, indexes, composite types): their catalog rows share
    # the schema, and the tables they belong to are read through their root.
    for rel_oid, col, qcol, notnull, typ, base, labels, checks, has_default, generated in _rows(
        conn, q.COLUMNS, nsp
    ):
        if rel_oid in tables:
            tables[rel_oid].columns[col] = Column(
                col, qcol, notnull, typ, base, tuple(labels), tuple(checks), has_default, generated
            )
    for rel_oid, *con in _rows(conn, q.CONSTRAINTS, nsp):
        if rel_oid not in tables:
            continue
        name, qname, kind, cols, ref_oid, ref_display, ref_cols, on_delete, definition = con
        constraint = Constraint(
            name, qname, kind, tuple(cols), ref_oid or 0, ref_display or "", tuple(ref_cols),
            on_delete, definition,
        )  # fmt: skip
        tables[rel_oid].constraints.append(constraint)
    for rel_oid, *idx in _rows(conn, q.INDEXES, nsp):
        name, unique, primary, cols, exprs, pred, backs, valid = idx
        if rel_oid in tables:  # indexes of partitions and the like
            tables[rel_oid].indexes.append(
                Index(name, unique, primary, tuple(cols), exprs, pred, backs, valid)
            )
    _partition_indexes(tables, _rows(conn, q.PARTITION_INDEXES, nsp))
    for root, partition in _rows(conn, q.PARTITION_ACCESS, nsp):
        if root in tables:
            tables[root].exposed_partitions.append(partition)
    for rel_oid, name, tgtype, enabled, cols, function, source, when in _rows(
        conn, q.TRIGGERS, nsp
    ):
        if rel_oid in tables:
            # 'O' fires in normal sessions, 'A' always; 'D' is disabled and 'R'
            # fires only on replicas - neither protects anything here.
            tables[rel_oid].triggers.append(
                Trigger(name, tgtype, enabled in ("O", "A"), tuple(cols), function, source or "",
                        bool(when))
            )  # fmt: skip
    for rel_oid, name, event, instead, where in _rows(conn, q.RULES, nsp):
        if rel_oid in tables:
            tables[rel_oid].rules.append(Rule(name, event, instead, bool(where)))
    for rel_oid, name, permissive, roles, qual, check, reads in _rows(conn, q.POLICIES, nsp):
        if rel_oid in tables:
            tables[rel_oid].policies.append(
                Policy(name, permissive, tuple(roles), qual, check, reads)
            )
    for rel_oid, grantee, privilege in _rows(conn, q.GRANTS, nsp, nsp):
        if rel_oid in tables:
            tables[rel_oid].grants.append((grantee, privilege))
    elevated = [(r[0], r[1], r[2], r[3]) for r in _rows(conn, q.ELEVATED_MEMBERS, nsp)]
    routines = [r[0] for r in _rows(conn, q.ROUTINES, nsp)]
    citus = _rows(conn, q.CITUS)
    distributed = (
        {int(r[0]): (str(r[1]), r[2], int(r[3])) for r in _rows(conn, q.CITUS_TABLES, nsp)}
        if citus
        else {}
    )
    return Catalog(
        database=database,
        schema=target,
        role=role,
        role_super=rolsuper,
        role_bypassrls=bypass,
        server_version=version,
        tables={t.name: t for t in tables.values()},
        elevated=elevated,
        routines=routines,
        prefix=prefix,
        citus=str(citus[0][0]) if citus else None,
        distributed=distributed,
    )


def _partition_indexes(tables: dict[int, Table], rows: list[tuple[Any, ...]]) -> None:
    """Give a partitioned root the unique keys every one of its partitions has.

    A unique index on each partition that contains the partition key is as
    good as one on the root (no two partitions hold the same key values);
    one on some partitions only, or without the key, makes nothing unique.
    """
    seen: dict[tuple[int, tuple[str, ...], str | None, str | None], set[str]] = {}
    first: dict[tuple[int, tuple[str, ...], str | None, str | None], str] = {}
    for root, partition, cols, exprs, pred, index_name in rows:
        key = (root, tuple(cols), exprs, pred)
        seen.setdefault(key, set()).add(partition)
        first.setdefault(key, index_name)
    for (root, cols, exprs, pred), partitions in seen.items():
        table = tables.get(root)
        if table is None or len(partitions) < table.children:
            continue
        index = Index(first[(root, cols, exprs, pred)], True, False, cols, exprs, pred, False, True,
                      partition=min(partitions))  # fmt: skip
        if set(table.partition_key) <= set(table.index_columns(index)):
            table.indexes.append(index)
