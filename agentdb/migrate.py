"""Apply, roll back and inspect agentdb's migrations (yoyo on psycopg 3).

The migrations are the yoyo files in ``sql/`` (shipped inside the wheel as
``agentdb/_sql``; :mod:`agentdb.schema` finds them). Every function here
takes a ``postgresql://`` URL and an optional schema; the migrations are
schema-agnostic and land in whichever schema yoyo puts first on the
search_path.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from agentdb import _dsn
from agentdb.errors import ConfigurationError, DatabaseUnavailable, MigrationError
from agentdb.schema import migration_ids, migrations_dir

__all__ = [
    "MigrationState",
    "ddl",
    "grant",
    "libpq_dsn",
    "migrate",
    "migration_ids",
    "migrations_dir",
    "role_ddl",
    "rollback",
    "status",
]

# yoyo writes the schema into `SET search_path TO <schema>` unquoted, so only
# names that need no quoting are accepted.
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_MIGRATION_TABLE = "_yoyo_migration"
_ROLES = ("agentdb_runtime", "agentdb_agent")

_log = logging.getLogger("agentdb.migrate")


@dataclass(frozen=True, slots=True)
class MigrationState:
    """One migration and whether the target database has it."""

    id: str
    applied: bool
    applied_at: datetime | None


def _check_schema_name(schema: str | None) -> None:
    if schema is not None and not _SCHEMA_RE.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} must be a lowercase identifier "
            "(letters, digits, underscore; at most 63 characters)"
        )


#: Kept for callers of the 0.1 API; see :mod:`agentdb._dsn`.
redact = _dsn.redact
libpq_dsn = _dsn.libpq


def _yoyo_url(dsn: str, schema: str | None) -> str:
    return _dsn.with_query(dsn, "postgresql+psycopg", schema=schema)


@contextmanager
def _connect(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    try:
        conn = psycopg.connect(_dsn.libpq(dsn), connect_timeout=10, autocommit=True)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {reason}") from exc
    with conn:
        yield conn


def _resolve_schema(conn: psycopg.Connection[Any], schema: str | None, create: bool) -> str:
    if schema is None:
        row = conn.execute("SELECT current_schema()").fetchone()
        if row is None or row[0] is None:
            raise ConfigurationError(
                "no schema on the search_path exists in this database; pass --schema"
            )
        return str(row[0])
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", (schema,)
    ).fetchone()
    if not (row and row[0]):
        if not create:
            raise ConfigurationError(
                f"schema {schema!r} does not exist; create it or pass --create-schema"
            )
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    return schema


def _applied(conn: psycopg.Connection[Any], schema: str) -> dict[str, datetime]:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s)",
        (schema, _MIGRATION_TABLE),
    ).fetchone()
    if not (row and row[0]):
        return {}
    query = sql.SQL("SELECT migration_id, applied_at_utc FROM {}").format(
        sql.Identifier(schema, _MIGRATION_TABLE)
    )
    return {str(r[0]): r[1] for r in conn.execute(query).fetchall()}


def _preflight(dsn: str, schema: str | None, *, create: bool = False) -> dict[str, datetime]:
    """Check the target before yoyo touches it; return what is applied there."""
    _check_schema_name(schema)
    with _connect(dsn) as conn:
        resolved = _resolve_schema(conn, schema, create)
        applied = _applied(conn, resolved)
    unknown = sorted(set(applied) - set(migration_ids()))
    if unknown:
        raise MigrationError(
            f"the database has migrations this agentdb does not know ({', '.join(unknown)}); "
            "it was migrated by a newer agentdb - upgrade agentdb instead"
        )
    return applied


def _backend(dsn: str, schema: str | None) -> Any:
    from yoyo import get_backend

    try:
        return get_backend(_yoyo_url(dsn, schema))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {exc}") from exc


def _migrations() -> Any:
    from yoyo import read_migrations

    return read_migrations(str(migrations_dir()))


def _run(action: str, step: Any, migrations: Any) -> list[str]:
    done: list[str] = []
    for m in migrations:
        try:
            step(m)
        except psycopg.Error as exc:
            primary = exc.diag.message_primary or str(exc).strip().splitlines()[0]
            raise MigrationError(
                f"{action} of {m.id} failed (SQLSTATE {exc.sqlstate}): {primary}"
            ) from exc
        done.append(m.id)
        _log.info("%s %s", action, m.id)
    return done


def migrate(dsn: str, *, schema: str | None = None, create_schema: bool = False) -> list[str]:
    """Apply every migration the database does not have yet; return their ids.

    Raises:
        ConfigurationError: malformed DSN or schema name, or the schema is missing.
        DatabaseUnavailable: the server cannot be reached or refuses the login.
        MigrationError: the database is ahead of this code, or a migration failed
            (that migration is rolled back; earlier ones stay applied).
    """
    _preflight(dsn, schema, create=create_schema)
    from yoyo.exceptions import LockTimeout

    backend = _backend(dsn, schema)
    try:
        with backend.lock():
            return _run("apply", backend.apply_one, backend.to_apply(_migrations()))
    except LockTimeout as exc:
        raise MigrationError(f"{exc}") from exc
    finally:
        backend.connection.close()


def rollback(dsn: str, *, schema: str | None = None, count: int | None = 1) -> list[str]:
    """Roll back the newest ``count`` applied migrations (all when ``None``).

    Raises:
        ConfigurationError, DatabaseUnavailable, MigrationError: as for :func:`migrate`.
    """
    if count is not None and count < 1:
        raise ConfigurationError("rollback count must be at least 1")
    _preflight(dsn, schema)
    from yoyo.exceptions import LockTimeout

    backend = _backend(dsn, schema)
    try:
        with backend.lock():
            todo = list(backend.to_rollback(_migrations()))
            if count is not None:
                todo = todo[:count]
            return _run("rollback", backend.rollback_one, todo)
    except LockTimeout as exc:
        raise MigrationError(f"{exc}") from exc
    finally:
        backend.connection.close()


def status(dsn: str, *, schema: str | None = None) -> list[MigrationState]:
    """Return every shipped migration and whether the database has it.

    Raises:
        ConfigurationError, DatabaseUnavailable, MigrationError: as for :func:`migrate`.
    """
    applied = _preflight(dsn, schema)
    return [MigrationState(m, m in applied, applied.get(m)) for m in migration_ids()]


def grant(dsn: str, *, schema: str | None = None) -> list[str]:
    """Run ``agentdb_grant_roles()`` again (after a DBA created missing roles).

    Returns the notices Postgres sent (one per role still missing).

    Raises:
        ConfigurationError, DatabaseUnavailable: as for :func:`migrate`.
        MigrationError: the schema is not migrated, or the grant failed.
    """
    _check_schema_name(schema)
    notices: list[str] = []
    with _connect(dsn) as conn:
        resolved = _resolve_schema(conn, schema, create=False)
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("SELECT set_config('search_path', %s, false)", (resolved,))
        try:
            conn.execute("CALL agentdb_grant_roles()")
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


def ddl(*, schema: str | None = None) -> str:
    """Return every migration concatenated, as one script to paste or pipe into psql.

    With ``schema`` the script creates that schema if needed and applies
    everything inside it. The script runs in one transaction.

    Raises:
        ConfigurationError: the schema name is not a plain lowercase identifier.
    """
    _check_schema_name(schema)
    head = ["-- agentdb schema, generated by `agentdb sql`.", "BEGIN;"]
    if schema is not None:
        name = sql.Identifier(schema)
        head += [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {};").format(name).as_string(None),
            sql.SQL("SET LOCAL search_path TO {};").format(name).as_string(None),
        ]
    parts = ["\n".join(head), ""]
    for mid in migration_ids():
        parts.append(f"-- ===== {mid} =====")
        parts.append((migrations_dir() / f"{mid}.sql").read_text(encoding="utf-8").rstrip())
        parts.append("")
    parts.append("COMMIT;\n")
    return "\n".join(parts)
