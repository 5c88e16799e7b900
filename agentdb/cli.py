"""The ``agentdb`` command line (also ``python -m agentdb``).

Bad input and unreachable databases end with one line on stderr and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from agentdb import __version__, migrate
from agentdb.errors import AgentDBError, ConfigurationError

__all__ = ["main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2


def _dsn(args: argparse.Namespace) -> str:
    dsn: str | None = args.dsn or os.environ.get("DATABASE_URL")
    if not dsn:
        raise ConfigurationError("no database given: pass --dsn or set DATABASE_URL")
    return dsn


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="postgresql:// URL (default: $DATABASE_URL)")
    p.add_argument("--schema", help="schema to work in (default: first on the search_path)")


def _cmd_migrate(args: argparse.Namespace) -> int:
    applied = migrate.migrate(_dsn(args), schema=args.schema, create_schema=args.create_schema)
    for mid in applied:
        print(f"applied {mid}")
    if not applied:
        print("nothing to apply: the schema is up to date")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    count = None if args.all else args.count
    undone = migrate.rollback(_dsn(args), schema=args.schema, count=count)
    for mid in undone:
        print(f"rolled back {mid}")
    if not undone:
        print("nothing to roll back")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    states = migrate.status(_dsn(args), schema=args.schema)
    if args.json:
        payload = [
            {
                "id": s.id,
                "applied": s.applied,
                "applied_at": s.applied_at.isoformat() if s.applied_at else None,
            }
            for s in states
        ]
        print(json.dumps({"migrations": payload}, indent=2))
    else:
        width = max(len(s.id) for s in states)
        for s in states:
            when = f"  {s.applied_at:%Y-%m-%d %H:%M:%S} UTC" if s.applied_at else ""
            print(f"{s.id:<{width}}  {'applied' if s.applied else 'pending'}{when}")
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    sys.stdout.write(migrate.role_ddl() if args.roles else migrate.ddl(schema=args.schema))
    return 0


def _cmd_grant(args: argparse.Namespace) -> int:
    for notice in migrate.grant(_dsn(args), schema=args.schema):
        print(notice)
    print("grants applied to the agentdb roles that exist")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="agentdb",
        description="Postgres enforces what AI agents must not get wrong.",
    )
    parser.add_argument("--version", action="version", version=f"agentdb {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply pending migrations")
    _add_target(p)
    p.add_argument("--create-schema", action="store_true", help="create --schema if missing")
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser("rollback", help="roll back applied migrations (newest first)")
    _add_target(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--all", action="store_true", help="roll back every migration")
    group.add_argument("--count", type=int, default=1, help="how many to roll back (default 1)")
    p.set_defaults(func=_cmd_rollback)

    p = sub.add_parser("status", help="show which migrations are applied")
    _add_target(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("sql", help="print the complete DDL for pasting or piping into psql")
    p.add_argument("--schema", help="create and fill this schema instead of the default")
    p.add_argument("--roles", action="store_true", help="print only the CREATE ROLE statements")
    p.set_defaults(func=_cmd_sql)

    p = sub.add_parser("grant", help="grant to agentdb roles created after migrating")
    _add_target(p)
    p.set_defaults(func=_cmd_grant)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigurationError as exc:
        print(f"agentdb: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AgentDBError as exc:
        print(f"agentdb: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("agentdb: interrupted", file=sys.stderr)
        return 130
    return code
