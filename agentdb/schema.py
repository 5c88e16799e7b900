"""Which schema this code needs, and a startup check that the database has it.

The shipped migrations are the yoyo files in ``sql/migrations/`` (inside the
wheel as ``agentdb/_sql/migrations``). The newest migration defines
``agentdb_schema_version()`` to return its own id (a later one redefines it
whole), so a worker or relay started against an older schema refuses to run
(one clear line) instead of failing at its first statement. A newer schema is
accepted: migrations only expand (``-- phase: expand``), so older code keeps
working on it.
"""

from __future__ import annotations

import re
from pathlib import Path

from agentdb import _db
from agentdb.errors import MigrationError

__all__ = [
    "check",
    "migration_ids",
    "migration_sql",
    "migrations_dir",
    "required_version",
    "split_statements",
]

_Q = _db.queries(__name__)


def migrations_dir() -> Path:
    """Return the directory holding the yoyo migration files.

    Raises:
        MigrationError: the installation carries no migrations.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here / "_sql" / "migrations", here.parent / "sql" / "migrations"):
        if (candidate / "0001.foundation.sql").is_file():
            return candidate
    raise MigrationError("agentdb's migration files are missing from this installation")


def migration_ids() -> list[str]:
    """Return the ids of the shipped migrations, in order."""
    return sorted(
        p.name.removesuffix(".sql")
        for p in migrations_dir().glob("*.sql")
        if not p.name.endswith(".rollback.sql")
    )


def split_statements(body: str) -> list[str]:
    """A migration's statements, one by one, split as yoyo splits the same files (sqlparse).

    ``agentdb migrate`` sends them one at a time, in the migration's one
    transaction: Citus forwards the text of a DDL command (CREATE TRIGGER,
    CREATE or DROP INDEX) on a distributed table to every worker as a
    prepared statement, which refuses a string holding several commands - so
    a migration run on an installation already distributed would fail on its
    first such command. Pieces that are only comments are left out (an empty
    query is an error to psycopg).

    Raises:
        MigrationError: sqlparse cannot split the text (past its token or nesting limits).
    """
    import sqlparse  # only the migration runner splits: the runtime never loads it
    from sqlparse.exceptions import SQLParseError

    try:
        return [
            piece
            for piece in sqlparse.split(body)
            if sqlparse.format(piece, strip_comments=True).strip()
        ]
    except SQLParseError as exc:  # a statement past sqlparse's token or nesting limits
        raise MigrationError(f"cannot split the migration into statements: {exc}") from exc


def migration_sql(mid: str, *, rollback: bool = False) -> str:
    """Return the text of migration ``mid`` (or of its rollback).

    Raises:
        MigrationError: the file is missing, or it asks to run outside a transaction
            (agentdb commits every migration in one transaction with its record, so
            that an interruption cannot leave it half-applied).
    """
    path = migrations_dir() / f"{mid}{'.rollback' if rollback else ''}.sql"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MigrationError(f"migration {mid} has no {path.name}") from None
    if re.search(r"^\s*--\s*transactional\s*:\s*false\b", text, flags=re.M | re.I):
        raise MigrationError(f"{path.name} says `transactional: false`; agentdb cannot apply it")
    return text


def required_version() -> str:
    """The newest shipped migration: the schema version this code runs against."""
    return migration_ids()[-1]


async def check(db: _db.Executor) -> str:
    """Return the schema's version if it is at least :func:`required_version`.

    Raises:
        MigrationError: the schema is not migrated at all, or older than this code
            (or not agentdb's): run ``agentdb migrate``.
    """
    need = required_version()
    try:
        row = await _db.fetch_one(db, _Q["schema_version"])
    except Exception as exc:
        # 42883 undefined_function: a schema not migrated to the end, or not agentdb's.
        if getattr(exc, "sqlstate", None) != "42883":
            raise
        if not (await _db.fetch_one(db, _Q["schema_has_agentdb"]))["migrated"]:
            raise MigrationError(
                "the database schema is not migrated (no agentdb tables on the search_path): "
                "run `agentdb migrate` first"
            ) from None
        raise MigrationError(
            f"the database schema is older than this agentdb (it needs migration {need}): "
            "run `agentdb migrate` first"
        ) from None
    have = str(row["version"])
    if have < need:
        raise MigrationError(
            f"the database schema is at migration {have}, this agentdb needs {need}: "
            "run `agentdb migrate` first"
        )
    return have
