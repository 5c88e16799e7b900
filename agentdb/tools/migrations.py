"""``agentdb migrate`` / ``rollback`` / ``sql`` / ``grant``: the schema's migrations.

:mod:`agentdb.migrate` (and psycopg with it) is imported when a command runs,
not when the parser is built: that keeps the CLI's first instant short.
"""

from __future__ import annotations

import argparse
import sys

from agentdb.errors import MigrationError
from agentdb.tools._common import add_target, dsn_from

__all__ = ["add_grant", "add_migrate", "add_rollback", "add_sql"]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _add_lock_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock-timeout",
        type=float,
        metavar="SECONDS",
        help="give up after waiting this long for another run's migration lock"
        " (default: wait; 0: do not wait)",
    )


def add_migrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("migrate", help="apply pending migrations")
    add_target(p)
    p.add_argument("--create-schema", action="store_true", help="create --schema if missing")
    p.add_argument(
        "--citus",
        action="store_true",
        help="on a Citus coordinator: then distribute the tables by tenant (re-runnable)",
    )
    p.add_argument(
        "--events-by-month",
        action="store_true",
        help="then partition agent_events by month: retention drops whole months, event"
        " writes cost more server CPU (docs: Operating, 'Events by month'; re-runnable)",
    )
    _add_lock_timeout(p)
    p.set_defaults(func=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    from agentdb import migrate

    applied = migrate.migrate(
        dsn_from(args),
        schema=args.schema,
        create_schema=args.create_schema,
        pooler=args.pooler,
        lock_timeout=args.lock_timeout,
        notify=_stderr,
        citus=args.citus,
        events_by_month=args.events_by_month,
    )
    for mid in applied:
        print(f"applied {mid}")
    if not applied:
        print("nothing to apply: the schema is up to date")
    if args.citus:
        print("distributed: every tenant table by tenant_id, colocated; shared tables replicated")
    if args.events_by_month:
        print("agent_events: partitioned by month of created_at")
    return 0


def add_rollback(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rollback", help="roll back applied migrations (newest first)")
    add_target(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--all", action="store_true", help="roll back every migration")
    group.add_argument("--count", type=int, default=1, help="how many to roll back (default 1)")
    _add_lock_timeout(p)
    p.set_defaults(func=_rollback)


def _rollback(args: argparse.Namespace) -> int:
    from agentdb import migrate

    undone = migrate.rollback(
        dsn_from(args),
        schema=args.schema,
        count=None if args.all else args.count,
        pooler=args.pooler,
        lock_timeout=args.lock_timeout,
        notify=_stderr,
    )
    if not undone:
        where = f"schema {args.schema!r}" if args.schema else "the first schema on the search_path"
        raise MigrationError(f"nothing to roll back: no agentdb migration is applied in {where}")
    for mid in undone:
        print(f"rolled back {mid}")
    return 0


def add_sql(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sql", help="print the complete DDL for pasting or piping into psql")
    p.add_argument("--schema", help="create and fill this schema instead of the default")
    p.add_argument("--roles", action="store_true", help="print only the CREATE ROLE statements")
    p.set_defaults(func=_sql)


def _sql(args: argparse.Namespace) -> int:
    from agentdb import migrate

    sys.stdout.write(migrate.role_ddl() if args.roles else migrate.ddl(schema=args.schema))
    return 0


def add_grant(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("grant", help="grant to agentdb roles created after migrating")
    add_target(p)
    p.set_defaults(func=_grant)


def _grant(args: argparse.Namespace) -> int:
    from agentdb import migrate

    for notice in migrate.grant(dsn_from(args), schema=args.schema, pooler=args.pooler):
        print(notice)
    print("grants applied to the agentdb roles that exist")
    return 0
