"""``agentdb migrate`` / ``rollback`` / ``sql`` / ``grant``: the schema's migrations."""

from __future__ import annotations

import argparse
import sys

from agentdb import migrate
from agentdb.tools._common import add_target, dsn_from

__all__ = ["add_grant", "add_migrate", "add_rollback", "add_sql"]


def add_migrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("migrate", help="apply pending migrations")
    add_target(p)
    p.add_argument("--create-schema", action="store_true", help="create --schema if missing")
    p.set_defaults(func=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    applied = migrate.migrate(dsn_from(args), schema=args.schema, create_schema=args.create_schema)
    for mid in applied:
        print(f"applied {mid}")
    if not applied:
        print("nothing to apply: the schema is up to date")
    return 0


def add_rollback(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rollback", help="roll back applied migrations (newest first)")
    add_target(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--all", action="store_true", help="roll back every migration")
    group.add_argument("--count", type=int, default=1, help="how many to roll back (default 1)")
    p.set_defaults(func=_rollback)


def _rollback(args: argparse.Namespace) -> int:
    count = None if args.all else args.count
    undone = migrate.rollback(dsn_from(args), schema=args.schema, count=count)
    for mid in undone:
        print(f"rolled back {mid}")
    if not undone:
        print("nothing to roll back")
    return 0


def add_sql(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sql", help="print the complete DDL for pasting or piping into psql")
    p.add_argument("--schema", help="create and fill this schema instead of the default")
    p.add_argument("--roles", action="store_true", help="print only the CREATE ROLE statements")
    p.set_defaults(func=_sql)


def _sql(args: argparse.Namespace) -> int:
    sys.stdout.write(migrate.role_ddl() if args.roles else migrate.ddl(schema=args.schema))
    return 0


def add_grant(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("grant", help="grant to agentdb roles created after migrating")
    add_target(p)
    p.set_defaults(func=_grant)


def _grant(args: argparse.Namespace) -> int:
    for notice in migrate.grant(dsn_from(args), schema=args.schema):
        print(notice)
    print("grants applied to the agentdb roles that exist")
    return 0
