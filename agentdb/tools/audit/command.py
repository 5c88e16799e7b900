"""Registers ``agentdb audit``; the audit itself is imported only when it runs.

Exit status, as for every agentdb command: 0 when the report is written, 2
for bad input (a ConfigurationError, one line on stderr), 1 when the
database cannot be reached or read; and
:data:`~agentdb.tools.audit.report.EXIT_FINDINGS` when ``--fail-on`` finds a
guarantee below the bar.
"""

from __future__ import annotations

import argparse
import sys

from agentdb import _dsn
from agentdb.tools._common import add_pooler

# The report module is plain data (no psycopg): cheap enough to import just
# to name the exit status in --help.
from agentdb.tools.audit.report import EXIT_FINDINGS

__all__ = ["add_audit"]


def add_audit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``audit`` subcommand to ``agentdb``'s subparsers."""
    p = sub.add_parser(
        "audit",
        help="report which guarantees an existing schema enforces",
        description="Read the catalog of one schema (read-only) and report, for each "
        "guarantee, whether it is enforced, partial, missing or not applicable, "
        "with the objects that enforce it and a suggested fix.",
    )
    p.add_argument("--dsn", help="postgresql:// URL (default: $DATABASE_URL)")
    add_pooler(p)
    p.add_argument("--schema", help="schema to audit (default: first on the search_path)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="KIND=TABLE[,...]",
        help="assign tables to roles: tasks, operations, events, outbox, inbox, tenants, "
        "credentials (TABLE '-' for none); tenant=COLUMN names the tenant column",
    )
    p.add_argument(
        "--json", action="store_true", help="machine-readable output (schema: docs/audit.md)"
    )
    p.add_argument(
        "--fail-on",
        choices=("missing", "partial"),
        help=f"exit {EXIT_FINDINGS} if any guarantee is missing (or partial or missing)",
    )
    p.set_defaults(func=_audit)


def _audit(args: argparse.Namespace) -> int:
    """Print the report; return 0, or :data:`EXIT_FINDINGS` when ``--fail-on`` is not met.

    Raises:
        ConfigurationError: no or malformed DSN, unknown schema, or a bad ``--map``.
        DatabaseUnavailable: the server cannot be reached or drops the connection.
        AuditError: the server refused a catalog query.
    """
    from agentdb.tools.audit.api import audit, parse_mapping

    dsn = _dsn.from_env(args.dsn)
    report = audit(dsn, schema=args.schema, mapping=parse_mapping(args.map))
    sys.stdout.write(report.to_json() + "\n" if args.json else report.render())
    code = report.exit_code(args.fail_on)
    if code:
        counts = report.summary()
        print(
            f"agentdb: audit failed (--fail-on {args.fail_on}): {counts['missing']} missing, "
            f"{counts['partial']} partial",
            file=sys.stderr,
        )
    return code
