"""What ``agentdb migrate`` does differently on a Citus coordinator (see README "Scaling out").

The distribution itself is SQL (``agentdb_distribute()``, sql/migrations/0012.citus.sql);
here are the session settings every migration runs under there and the
database defaults ``--citus`` sets for agentdb's own connections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, LiteralString

import psycopg
from psycopg import sql

__all__ = ["DDL_SETTINGS", "HAS_CITUS", "set_defaults"]

#: Run in each migration's transaction: a no-op without the citus extension.
DDL_SETTINGS = """SELECT set_config('citus.enable_unsafe_triggers', 'on', true),
    set_config('citus.multi_shard_modify_mode', 'sequential', true)
    FROM pg_extension WHERE extname = 'citus'"""
HAS_CITUS = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"

# citus.override_table_visibility: Citus hides shard tables from applications
# by filtering every pg_class scan through relation_is_a_known_shard(), and
# asyncpg's type lookup (on each new connection, for int8[], uuid[] and the
# like) then took about a second instead of milliseconds - 4-7 s with several
# connections starting at once, long enough for a worker restarted after a
# SIGKILL to be killed again before its first claim.
# citus.max_adaptive_executor_pool_size: agentdb's few multi-shard statements
# are small reads (the claim's tenant discovery), and a new session opening
# up to 16 connections per worker node for each costs more than the read.
_DEFAULTS: tuple[tuple[LiteralString, str], ...] = (
    ("citus.override_table_visibility", "off"),
    ("citus.max_adaptive_executor_pool_size", "1"),
)
_MAY_ALTER_DATABASE = """SELECT pg_has_role(d.datdba, 'USAGE')
        OR (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user)
    FROM pg_database d WHERE d.datname = current_database()"""


def set_defaults(conn: psycopg.Connection[Any], where: str, notify: Callable[[str], None]) -> None:
    """Set agentdb's defaults on ``conn``'s database (autocommit; re-running changes nothing).

    Database defaults, not session settings: the pool's RESET ALL after each
    use would undo a SET. Without the privilege (the database's owner) it
    tells ``notify`` what to run instead and sets nothing.

    Raises:
        psycopg.Error: the server refused an ALTER DATABASE.
    """
    stmts = [
        sql.SQL("ALTER DATABASE {} SET {} = {}").format(
            sql.Identifier(conn.info.dbname), sql.SQL(name), sql.Literal(value)
        )
        for name, value in _DEFAULTS
    ]
    row = conn.execute(_MAY_ALTER_DATABASE).fetchone()
    if row is None or not row[0]:
        todo = "; ".join(stmt.as_string(conn) for stmt in stmts)
        notify(
            f"not the owner of {where}: run {todo} as its owner (agentdb's connections "
            "start slowly on Citus without them)"
        )
        return
    for stmt in stmts:
        conn.execute(stmt)
