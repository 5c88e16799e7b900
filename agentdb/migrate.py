"""Apply, roll back and inspect agentdb's migrations (psycopg 3, yoyo's bookkeeping).

The migrations are the yoyo files in ``sql/`` (shipped inside the wheel as ``agentdb/_sql``;
:mod:`agentdb.schema` finds them). Every function here takes a ``postgresql://`` URL and an
optional schema; the migrations are schema-agnostic and land in the first schema of the
search_path.

Each migration commits in one transaction together with its row in yoyo's
``_yoyo_migration`` table (the row yoyo itself writes: sha256 of the id), so a run stopped
at any instant - SIGINT, SIGKILL, a lost connection - leaves every migration either applied
and recorded or neither, and a plain re-run carries on. yoyo run on ``sql/`` accepts what
agentdb applied and agentdb accepts what yoyo applied.

Runs exclude each other with an advisory lock, never with a lock row that a dead process
leaves behind. Directly (or through a session pooler) a run holds a session lock, which the
server drops when the process dies. Behind a transaction pooler (``pooler="transaction"`` /
``AGENTDB_POOLER``) a session lock would stay on a shared server connection, so each
migration's transaction takes ``pg_advisory_xact_lock`` and re-checks what is applied once
it has it; both modes take that lock, so they exclude each other too. Nothing here sets
session state: the search_path is ``set_config(..., true)`` in each transaction, and
psycopg never prepares a statement.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, LiteralString

import psycopg
from psycopg import sql

from agentdb import __version__, _dsn
from agentdb._citus import migrate as _citus
from agentdb._db.pool import pooler_mode
from agentdb.errors import ConfigurationError, DatabaseUnavailable, MigrationError
from agentdb.schema import migration_ids, migration_sql, migrations_dir, split_statements

__all__ = [
    "LOCK_CLASS",
    "MigrationState",
    "ddl",
    "grant",
    "libpq_dsn",
    "lock_key",
    "migrate",
    "migration_ids",
    "migrations_dir",
    "redact",
    "role_ddl",
    "rollback",
    "status",
]

# Only names that need no quoting: yoyo (which teams may run on the same
# schema) writes the schema into `SET search_path TO <schema>` unquoted.
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_ROLES = ("agentdb_runtime", "agentdb_agent", "agentdb_operator")
#: First key of the migration lock ('agdb'); :func:`lock_key` is the second.
LOCK_CLASS = 0x61676462
# lock_key(current_schema()), computed by the server: for the script `agentdb sql` prints.
_LOCK_KEY_SQL = "('x' || left(md5(current_schema()), 8))::bit(32)::int"
# (try, wait) by scope: the run-long session lock, or the transaction's.
_LOCKS: dict[bool, tuple[LiteralString, LiteralString]] = {
    True: ("SELECT pg_try_advisory_lock(%s, %s)", "SELECT pg_advisory_lock(%s, %s)"),
    False: ("SELECT pg_try_advisory_xact_lock(%s, %s)", "SELECT pg_advisory_xact_lock(%s, %s)"),
}
# yoyo 9's bookkeeping tables as its internal schema version 2 makes them: with
# all four there, yoyo neither upgrades nor recreates anything.
_YOYO_TABLES: dict[str, str] = {
    "_yoyo_migration": "migration_hash VARCHAR(64), migration_id VARCHAR(255),"
    " applied_at_utc TIMESTAMP, PRIMARY KEY (migration_hash)",
    "_yoyo_log": "id VARCHAR(36), migration_hash VARCHAR(64), migration_id VARCHAR(255),"
    " operation VARCHAR(10), username VARCHAR(255), hostname VARCHAR(255),"
    " comment VARCHAR(255), created_at_utc TIMESTAMP, PRIMARY KEY (id)",
    "_yoyo_version": "version INT NOT NULL PRIMARY KEY, installed_at_utc TIMESTAMP",
    "yoyo_lock": "locked INT DEFAULT 1, ctime TIMESTAMP, pid INT NOT NULL, PRIMARY KEY (locked)",
}
_YOYO_SCHEMA_VERSION = 2
_NOW_UTC = sql.SQL("clock_timestamp() AT TIME ZONE 'UTC'")
# What applying an unrecorded migration whose objects exist fails with.
_DUPLICATE = {"42P07", "42710", "42723", "42P06"}
# What the migrations create under a name of their own, read from the files so that a new
# migration's objects are covered too. Relations (and types, which share their names) in one
# group, routines in the other; triggers, policies and constraints live on our own tables.
_CREATES = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?"
    r"(TABLE|INDEX|SEQUENCE|VIEW|TYPE|FUNCTION|PROCEDURE)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"([a-z_][a-z0-9_]*)",
    re.M | re.I,
)
# How many clashing names a refusal spells out before it counts the rest.
_CLASHES_SHOWN = 8

Direction = Literal["apply", "rollback"]
Notify = Callable[[str], None]

_log = logging.getLogger("agentdb.migrate")


@dataclass(frozen=True, slots=True)
class MigrationState:
    """One migration and whether the target database has it."""

    id: str
    applied: bool
    applied_at: datetime | None


#: Kept for callers of the 0.1 API; see :mod:`agentdb._dsn`.
redact = _dsn.redact
libpq_dsn = _dsn.libpq


def lock_key(schema: str) -> int:
    """The second key of the migration lock on ``schema`` (the first is :data:`LOCK_CLASS`)."""
    digest = hashlib.md5(schema.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def _check_schema_name(schema: str | None) -> None:
    if schema is not None and not _SCHEMA_RE.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} must be a lowercase identifier "
            "(letters, digits, underscore; at most 63 characters)"
        )


def _one_line(exc: BaseException) -> str:
    # libpq puts the reason on the first line and advice on the next: keep both.
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return ("; ".join(lines) or type(exc).__name__).removeprefix("connection failed: ")


def _table(schema: str | None, name: str) -> sql.Identifier:
    return sql.Identifier(name) if schema is None else sql.Identifier(schema, name)


def _create_yoyo_tables(schema: str | None, names: list[str], *, if_missing: bool) -> sql.Composed:
    create = "CREATE TABLE IF NOT EXISTS {} ({});" if if_missing else "CREATE TABLE {} ({});"
    parts = [sql.SQL(create).format(_table(schema, n), sql.SQL(_YOYO_TABLES[n])) for n in names]
    if "_yoyo_version" in names:
        parts.append(
            sql.SQL(
                "INSERT INTO {0} (version, installed_at_utc) SELECT {1}, {2}"
                " WHERE NOT EXISTS (SELECT FROM {0});"
            ).format(_table(schema, "_yoyo_version"), sql.Literal(_YOYO_SCHEMA_VERSION), _NOW_UTC)
        )
    return sql.SQL("\n").join(parts)


def _record(schema: str | None, mid: str, direction: Direction, comment: str) -> sql.Composed:
    """What records ``mid`` as applied (or as no longer), in yoyo's rows and log."""
    # yoyo.migrations.get_migration_hash: sha256 of the id.
    digest = sql.Literal(hashlib.sha256(mid.encode("utf-8")).hexdigest())
    name, table = sql.Literal(mid), _table(schema, "_yoyo_migration")
    if direction == "apply":
        mark = sql.SQL(
            "INSERT INTO {} (migration_hash, migration_id, applied_at_utc) VALUES ({}, {}, {});"
        ).format(table, digest, name, _NOW_UTC)
    else:
        mark = sql.SQL("DELETE FROM {} WHERE migration_hash = {};").format(table, digest)
    log = sql.SQL(
        "INSERT INTO {} (id, migration_hash, migration_id, operation, username, hostname,"
        " comment, created_at_utc) VALUES (gen_random_uuid()::text, {}, {}, {}, session_user,"
        " coalesce(host(inet_client_addr()), 'local'), {}, {});"
    ).format(
        _table(schema, "_yoyo_log"),
        *(digest, name, sql.Literal(direction), sql.Literal(comment), _NOW_UTC),
    )
    return sql.SQL("\n").join([mark, log])


@dataclass
class _Session:
    """One connection to the target, and what each transaction on it needs."""

    conn: psycopg.Connection[Any]
    where: str  # the schema and the (redacted) database, for messages
    schema: str
    search_path: str
    pooled: bool
    lock_timeout: float | None
    notify: Notify
    waited: bool = False


@contextmanager
def _session(
    dsn: str,
    schema: str | None,
    pooler: str | None,
    *,
    create: bool | None = None,
    lock_timeout: float | None = None,
    notify: Notify | None = None,
) -> Iterator[_Session]:
    """Check the input, connect, resolve the schema; database errors leave as ours.

    ``create``: ``None`` for a command that has no ``--create-schema`` to suggest.
    """
    _check_schema_name(schema)
    if lock_timeout is not None and not (math.isfinite(lock_timeout) and lock_timeout >= 0):
        raise ConfigurationError("the lock timeout must be a number of seconds, 0 or more")
    pooled = pooler_mode(pooler) == "transaction"
    url, shown = _dsn.libpq(dsn), _dsn.redact(dsn)
    extra: dict[str, Any] = {"connect_timeout": 10}
    if not pooled:  # through a transaction pooler the name would stay on a shared connection
        extra["fallback_application_name"] = "agentdb migrations"
    try:
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=None, **extra)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to {shown}: {_one_line(exc)}") from None
    say = notify or (lambda line: _log.info("%s", line))
    said: set[str] = set()

    def once(d: psycopg.errors.Diagnostic) -> None:
        # Every migration that grants repeats the same "role is missing" notice.
        line = f"{d.severity_nonlocalized or d.severity}: {d.message_primary}"
        if line not in said:
            said.add(line)
            say(line)

    conn.add_notice_handler(once)
    try:
        found, path = _resolve_schema(conn, schema, create)
        where = f'schema "{found}" of {shown}'
        yield _Session(conn, where, found, path, pooled, lock_timeout, say)
    except psycopg.Error as exc:
        state = exc.sqlstate or ""
        # No SQLSTATE: the client lost the socket; 08: connection, 57P: server shutting down.
        lost = not state or state.startswith(("08", "57P"))
        if isinstance(exc, psycopg.OperationalError) and lost:
            raise DatabaseUnavailable(f"lost the connection to {shown}: {_one_line(exc)}") from exc
        primary = exc.diag.message_primary or _one_line(exc)
        raise MigrationError(f"{shown}: SQLSTATE {state}: {primary}") from exc
    finally:
        # Not `with conn`: its exit sends a ROLLBACK, which a Ctrl-C mid-command turns into
        # a logged error. Closing needs no round trip, and nothing here is left uncommitted.
        conn.close()


def _resolve_schema(
    conn: psycopg.Connection[Any], schema: str | None, create: bool | None
) -> tuple[str, str]:
    """The schema to work in, and the search_path each transaction sets for it."""
    if schema is None:
        row = conn.execute("SELECT current_schema(), current_setting('search_path')").fetchone()
        if row is None or row[0] is None:
            raise ConfigurationError(
                "no schema on the search_path exists in this database; pass --schema"
            )
        return str(row[0]), str(row[1])
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %s)", (schema,)
    ).fetchone()
    if not (row and row[0]):
        if not create:
            hint = "; create it or pass --create-schema" if create is not None else ""
            raise ConfigurationError(f"schema {schema!r} does not exist in this database{hint}")
        with suppress(psycopg.errors.DuplicateSchema):  # a concurrent run created it first
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return schema, sql.Identifier(schema).as_string(conn)


def _yoyo_tables(s: _Session) -> set[str]:
    rows = s.conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = ANY(%s)",
        (s.schema, list(_YOYO_TABLES)),
    ).fetchall()
    return {str(r[0]) for r in rows}


def _applied(s: _Session) -> dict[str, datetime]:
    """What is recorded as applied; an error if it is more than this agentdb knows."""
    if "_yoyo_migration" not in _yoyo_tables(s):
        return {}
    query = sql.SQL("SELECT migration_id, applied_at_utc FROM {}").format(
        _table(s.schema, "_yoyo_migration")
    )
    applied = {str(r[0]): r[1] for r in s.conn.execute(query).fetchall()}
    unknown = sorted(set(applied) - set(migration_ids()))
    if unknown:
        raise MigrationError(
            f"the database has migrations this agentdb does not know ({', '.join(unknown)}); "
            "it was migrated by a newer agentdb - upgrade agentdb instead"
        )
    return applied


def _created() -> tuple[list[str], list[str]]:
    """The relation (and type) names and the routine names the migrations create."""
    relations: set[str] = set()
    routines: set[str] = set()
    for mid in migration_ids():
        for kind, name in _CREATES.findall(migration_sql(mid)):
            (routines if kind.upper() in ("FUNCTION", "PROCEDURE") else relations).add(name)
    return sorted(relations), sorted(routines)


def _clash_query(schema: sql.Composable) -> sql.Composed:
    """One row (``kind name``) per object in ``schema`` named like one the migrations create."""
    relations, routines = _created()
    return sql.SQL(
        "SELECT f.what FROM ("
        " SELECT c.relname AS name, CASE WHEN c.relkind IN ('i', 'I') THEN 'index'"
        " WHEN c.relkind = 'S' THEN 'sequence' WHEN c.relkind IN ('v', 'm') THEN 'view'"
        " ELSE 'table' END || ' ' || c.relname AS what"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = {schema} AND c.relname = ANY({relations}::name[])"
        # A free-standing type holds the name a table's row type would need.
        " UNION ALL SELECT t.typname, 'type ' || t.typname"
        " FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
        " WHERE n.nspname = {schema} AND t.typrelid = 0 AND t.typname = ANY({relations}::name[])"
        # CREATE OR REPLACE would silently replace a user's routine of the same signature.
        " UNION ALL SELECT p.proname, CASE WHEN p.prokind = 'p' THEN 'procedure '"
        " ELSE 'function ' END || p.proname || '()'"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = {schema} AND p.proname = ANY({routines}::name[])"
        ') f ORDER BY f.name COLLATE "C", f.what'
    ).format(schema=schema, relations=sql.Literal(relations), routines=sql.Literal(routines))


def _refuse_clashes(s: _Session) -> None:
    """Refuse, before anything is written, a schema without agentdb's history that already
    holds objects named like agentdb's: they are the user's own, not a half-applied agentdb,
    and the first migration would fail on them after the ones before it stayed applied."""
    found = [str(r[0]) for r in s.conn.execute(_clash_query(sql.Literal(s.schema))).fetchall()]
    if not found:
        return
    # A run migrating at the same time may have committed its first migration between
    # this run's look at the history and this look at the objects: a migration and its
    # record commit together, so a later look at the history sees it, and the objects
    # are agentdb's own (seen through a pooler, where runs take no session lock).
    if _applied(s):
        return
    shown = ", ".join(found[:_CLASHES_SHOWN])
    if len(found) > _CLASHES_SHOWN:
        shown += f" and {len(found) - _CLASHES_SHOWN} more"
    raise MigrationError(
        f"{s.where} has no agentdb migration history but already holds objects named like"
        f" agentdb's ({shown}); nothing was applied: migrate into a schema of agentdb's own"
        " (--schema NAME --create-schema), or move those objects out of the way"
    )


def _holder(s: _Session) -> str:
    row = s.conn.execute(
        "SELECT a.pid, a.usename, coalesce(nullif(a.application_name, ''), '?'),"
        " coalesce(host(a.client_addr), 'local'),"
        " to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
        " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
        " AND l.classid::bigint = %s AND l.objid::bigint = %s"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " LIMIT 1",
        (LOCK_CLASS, lock_key(s.schema) & 0xFFFFFFFF),
    ).fetchone()
    if row is None:
        return "another run"
    pid, user, app, client, since = row
    return f"server process {pid} ({app}, {user}@{client}, connected {since} UTC)"


def _lock(s: _Session, *, session: bool) -> None:
    """Take the migration lock (``session``: run-long; else the transaction's), saying what it
    waits for and giving up after ``lock_timeout``."""
    try_lock, wait_lock = _LOCKS[session]
    key = (LOCK_CLASS, lock_key(s.schema))
    row = s.conn.execute(try_lock, key).fetchone()
    if row and row[0]:
        return
    holder, limit = _holder(s), s.lock_timeout
    if limit is not None and limit <= 0:
        raise MigrationError(f"the migration lock on {s.where} is held by {holder}")
    if not s.waited:
        bound = f"giving up after {limit:g}s" if limit else "--lock-timeout bounds the wait"
        s.notify(f"waiting for the migration lock on {s.where}, held by {holder} ({bound})")
        s.waited = True

    def wait() -> None:
        if limit:
            ms = f"{max(1, round(limit * 1000))}ms"
            s.conn.execute("SELECT set_config('lock_timeout', %s, true)", (ms,))
        s.conn.execute(wait_lock, key)
        if limit:  # the migration's own statements wait for table locks as usual
            s.conn.execute("SET LOCAL lock_timeout TO DEFAULT")

    try:
        if session:
            with _transaction(s, locked=False):  # for SET LOCAL; the session lock outlives it
                wait()
        else:
            wait()
    except psycopg.errors.LockNotAvailable:
        raise MigrationError(
            f"gave up after {limit:g}s waiting for the migration lock on {s.where}, "
            f"held by {holder}"
        ) from None


@contextmanager
def _transaction(s: _Session, *, locked: bool = True) -> Iterator[None]:
    """One transaction in the schema, holding the migration lock unless ``locked`` is false.

    On any error or interruption the connection is closed, not rolled back: a
    Ctrl-C can leave it mid-command, where a ROLLBACK cannot be sent, while
    closing makes the server discard the transaction in every state. The run
    ends there anyway.
    """
    s.conn.execute("BEGIN")
    try:
        s.conn.execute("SELECT set_config('search_path', %s, true)", (s.search_path,))
        if locked:
            _lock(s, session=False)
        yield
        s.conn.execute("COMMIT")
    except BaseException:
        s.conn.close()
        raise


def _step(s: _Session, mid: str, direction: Direction) -> bool:
    """Apply or roll back ``mid`` and record it, in one transaction; ``False``: already done."""
    ids = migration_ids()
    body = migration_sql(mid, rollback=direction == "rollback")
    with _transaction(s):
        # On Citus DDL reaches every shard: keep the triggers, one shard at a time.
        s.conn.execute(_citus.DDL_SETTINGS)
        applied = _applied(s)  # again: another run may have moved on while this one waited
        if (mid in applied) if direction == "apply" else (mid not in applied):
            return False
        if direction == "apply":
            gone = [m for m in ids[: ids.index(mid)] if m not in applied]
            if gone:
                raise MigrationError(f"cannot apply {mid}: another run rolled back {gone[-1]}")
            missing = [n for n in _YOYO_TABLES if n not in _yoyo_tables(s)]
            if missing:
                s.conn.execute(_create_yoyo_tables(s.schema, missing, if_missing=False))
        else:
            newer = [m for m in ids[ids.index(mid) + 1 :] if m in applied]
            if newer:
                raise MigrationError(f"cannot roll back {mid}: another run applied {newer[-1]}")
        try:
            for statement in split_statements(body):
                s.conn.execute(statement.encode())
        except psycopg.Error as exc:
            raise MigrationError(_failure(s, mid, direction, exc)) from exc
        s.conn.execute(_record(s.schema, mid, direction, f"agentdb {__version__} migrate"))
    _log.info("%s %s", "applied" if direction == "apply" else "rolled back", mid)
    return True


def _failure(s: _Session, mid: str, direction: Direction, exc: psycopg.Error) -> str:
    text = f"{direction} of {mid} failed (SQLSTATE {exc.sqlstate}): "
    text += exc.diag.message_primary or _one_line(exc)
    if direction == "apply" and exc.sqlstate in _DUPLICATE:
        text += (
            f"; its objects exist in {s.where} but it is not recorded there (a paste of an"
            " older `agentdb sql`, or an older agentdb or yoyo stopped between applying and"
            " recording): if it is complete there, record it with `yoyo mark`"
        )
    return text


def _run(
    s: _Session, direction: Direction, plan: Callable[[dict[str, datetime]], list[str]]
) -> list[str]:
    todo = plan(_applied(s))
    if todo and not s.pooled:
        _lock(s, session=True)
        todo = plan(_applied(s))  # what another run did while this one waited
    return [mid for mid in todo if _step(s, mid, direction)]


def migrate(
    dsn: str,
    *,
    schema: str | None = None,
    create_schema: bool = False,
    pooler: str | None = None,
    lock_timeout: float | None = None,
    notify: Notify | None = None,
    citus: bool = False,
    events_by_month: bool = False,
) -> list[str]:
    """Apply every migration the database does not have yet; return the ids this call applied.

    ``citus``: then distribute the tables on this Citus coordinator (``agentdb_distribute()``,
    sql/migrations/0012.citus.sql); ``events_by_month``: then partition agent_events by month
    (``agentdb_partition_events()``, sql/migrations/0011.retention.sql). Both re-run as no-ops.

    ``pooler``: ``"transaction"`` behind a transaction-pooling proxy (default
    ``$AGENTDB_POOLER``). ``lock_timeout``: seconds to wait for another run's
    migration lock (``None``: as long as it takes; ``0``: not at all).
    ``notify`` gets each line meant for the operator - what the run waits for,
    and every NOTICE Postgres sends (one per missing agentdb role); without
    it they are logged. Nothing is written when nothing is pending.

    Raises:
        ConfigurationError: a malformed DSN, schema name, pooler or lock timeout,
            or the schema is missing.
        DatabaseUnavailable: the server cannot be reached, refuses the login, or
            the connection is lost.
        MigrationError: the database is ahead of this code, the schema has no agentdb
            history but holds objects named like agentdb's (nothing is applied), the lock
            was not granted in time, or a migration failed (that one is rolled back;
            earlier ones stay applied); with ``citus``: no citus extension, or
            the distribution failed (the migrations stay, the tables as they were).
    """
    with _session(
        dsn, schema, pooler, create=create_schema, lock_timeout=lock_timeout, notify=notify
    ) as s:
        if citus and s.conn.execute(_citus.HAS_CITUS).fetchone() is None:
            raise MigrationError(
                f"--citus: the citus extension is not installed in {s.where} (CREATE "
                "EXTENSION citus on every node, then citus_add_node each worker)"
            )
        if not _applied(s):
            _refuse_clashes(s)
        applied = _run(s, "apply", lambda done: [m for m in migration_ids() if m not in done])
        if citus:
            _call(s, "agentdb_distribute()")
            try:
                _citus.set_defaults(s.conn, s.where, s.notify)
            except psycopg.Error as exc:
                raise MigrationError(_failure(s, "ALTER DATABASE ... SET", "apply", exc)) from exc
        if events_by_month:
            _call(s, "agentdb_partition_events()")
        return applied


def _call(s: _Session, routine: LiteralString) -> None:
    try:
        with _transaction(s):
            s.conn.execute("CALL " + routine)
    except psycopg.Error as exc:
        raise MigrationError(_failure(s, routine, "apply", exc)) from exc


def rollback(
    dsn: str,
    *,
    schema: str | None = None,
    count: int | None = 1,
    pooler: str | None = None,
    lock_timeout: float | None = None,
    notify: Notify | None = None,
) -> list[str]:
    """Roll back the newest ``count`` applied migrations (all when ``None``); return their ids.

    With nothing applied it returns ``[]`` and writes nothing.

    Raises:
        ConfigurationError: as for :func:`migrate`, or ``count`` is below 1.
        DatabaseUnavailable, MigrationError: as for :func:`migrate`.
    """
    if count is not None and count < 1:
        raise ConfigurationError("rollback count must be at least 1")
    with _session(dsn, schema, pooler, lock_timeout=lock_timeout, notify=notify) as s:
        return _run(
            s,
            "rollback",
            lambda applied: [m for m in migration_ids()[::-1] if m in applied][:count],
        )


def status(
    dsn: str, *, schema: str | None = None, pooler: str | None = None
) -> list[MigrationState]:
    """Return every shipped migration and whether the database has it (reads only).

    Raises:
        ConfigurationError, DatabaseUnavailable, MigrationError: as for :func:`migrate`.
    """
    with _session(dsn, schema, pooler) as s:
        applied = _applied(s)
    return [MigrationState(m, m in applied, applied.get(m)) for m in migration_ids()]


def grant(dsn: str, *, schema: str | None = None, pooler: str | None = None) -> list[str]:
    """Run ``agentdb_grant_roles()`` again (after a DBA created missing roles).

    Returns the notices Postgres sent (one per role still missing).

    Raises:
        ConfigurationError, DatabaseUnavailable: as for :func:`migrate`.
        MigrationError: the schema is not migrated, or the grant failed.
    """
    notices: list[str] = []
    with _session(dsn, schema, pooler) as s:
        s.conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        try:
            with _transaction(s):
                s.conn.execute("CALL agentdb_grant_roles()")
        except psycopg.Error as exc:
            raise MigrationError(
                f"agentdb_grant_roles() failed (SQLSTATE {exc.sqlstate}): "
                f"{exc.diag.message_primary}; is the schema migrated and are you its owner?"
            ) from exc
    return notices


def role_ddl() -> str:
    """Return the statements a DBA runs to create agentdb's roles."""
    return "".join(
        sql.SQL("CREATE ROLE {} NOLOGIN;\n").format(sql.Identifier(role)).as_string(None)
        for role in _ROLES
    )


_PASTE_GUARD = """DO $agentdb$
DECLARE
    recorded boolean := false;
    clash text;
BEGIN
    -- The lock `agentdb migrate` takes: a paste and a migrate never interleave.
    PERFORM pg_advisory_xact_lock({lock_class}, {lock_key});
    IF to_regclass(format('%I._yoyo_migration', current_schema())) IS NOT NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT FROM %I._yoyo_migration)', current_schema())
            INTO recorded;
    END IF;
    IF recorded THEN
        RAISE EXCEPTION 'agentdb: schema % already has migrations recorded', current_schema()
            USING ERRCODE = '55000', HINT = 'run agentdb migrate instead of this script';
    END IF;
    -- Objects named like ours with no history: the user's own (agentdb migrate refuses too).
    SELECT string_agg(what, ', ') INTO clash FROM ({clashes}) found (what);
    IF clash IS NOT NULL THEN
        RAISE EXCEPTION 'agentdb: schema % already holds objects named like agentdb''s: %',
            current_schema(), clash
            USING ERRCODE = '42P07', HINT = 'pipe this script into a schema of its own:'
                ' agentdb sql --schema NAME';
    END IF;
END
$agentdb$;"""


def ddl(*, schema: str | None = None) -> str:
    """Return every migration concatenated, as one script to paste or pipe into psql.

    With ``schema`` the script creates that schema if needed and applies
    everything inside it. The script runs in one transaction and records each
    migration as :func:`migrate` does, so ``agentdb migrate`` (or yoyo)
    afterwards has nothing to apply; it refuses a schema that already has
    migrations recorded, or objects named like agentdb's. It is for psql, which
    it tells to stop at the first error (``\\set ON_ERROR_STOP on``).

    Raises:
        ConfigurationError: the schema name is not a plain lowercase identifier.
        MigrationError: a migration file is missing.
    """
    _check_schema_name(schema)
    head = [
        "-- agentdb schema, generated by `agentdb sql`: every migration and its record in",
        "-- yoyo's bookkeeping tables (as `agentdb migrate` writes them), in one transaction.",
        "-- psql carries on after an error (hundreds more, then exit status 0) unless told",
        "-- to stop: stop at the first one, whose message says what is in the way.",
        "\\set ON_ERROR_STOP on",
        "BEGIN;",
    ]
    if schema is not None:
        name = sql.Identifier(schema)
        head += [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {};").format(name).as_string(None),
            sql.SQL("SET LOCAL search_path TO {};").format(name).as_string(None),
        ]
    clashes = _clash_query(sql.SQL("current_schema()")).as_string(None)
    head.append(_PASTE_GUARD.format(lock_class=LOCK_CLASS, lock_key=_LOCK_KEY_SQL, clashes=clashes))
    head.append(_create_yoyo_tables(None, list(_YOYO_TABLES), if_missing=True).as_string(None))
    parts = ["\n".join(head), ""]
    for mid in migration_ids():
        parts.append(f"-- ===== {mid} =====")
        parts.append(migration_sql(mid).rstrip())
        parts.append(_record(None, mid, "apply", f"agentdb {__version__} sql").as_string(None))
        parts.append("")
    parts.append("COMMIT;\n")
    return "\n".join(parts)
