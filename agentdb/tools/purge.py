"""``agentdb purge``: delete what is past retention, in small batches."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

from agentdb import _db, retention
from agentdb.errors import ConfigurationError
from agentdb.tools._common import add_target, dsn_from, run_with_pool

__all__ = ["add_purge"]


def add_purge(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("purge", help="delete what is past retention, in small batches")
    add_target(p)
    p.add_argument("--batch", type=int, default=1000, help="rows per statement (default 1000)")
    p.add_argument(
        "--older-than",
        action="append",
        metavar="CLASS=DAYS",
        help="age for outbox_delivered, inbox, operations, signals, tasks (repeatable)",
    )
    p.add_argument("--only", help="comma-separated classes to purge (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_purge)


def _purge(args: argparse.Namespace) -> int:
    dsn = dsn_from(args)
    ages = {}
    for spec in args.older_than or ():
        kind, _, days = spec.partition("=")
        if kind not in retention.CLASSES or not days.replace(".", "", 1).isdigit():
            raise ConfigurationError(
                f"--older-than wants CLASS=DAYS (classes: {', '.join(retention.CLASSES)})"
            )
        ages[kind] = timedelta(days=float(days))
    classes = tuple(args.only.split(",")) if args.only else retention.CLASSES

    def progress(kind: str, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\rpurging {kind}: {total} rows", end="", file=sys.stderr, flush=True)

    async def body(pool: _db.Pool) -> retention.PurgeReport:
        return await retention.purge(
            pool, batch=args.batch, ages=ages, classes=classes, progress=progress
        )

    report = run_with_pool(dsn, 1, body, schema=args.schema)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        doc = {
            "removed": report.removed,
            "partitions": [
                {"name": p.name, "action": p.action, "events": p.events} for p in report.partitions
            ],
            "statements": report.statements,
            "longest_statement_ms": round(report.longest_statement * 1000, 1),
            "elapsed_s": round(report.elapsed, 3),
        }
        print(json.dumps(doc, indent=2))
        return 0
    for part in report.partitions:
        dropped = f" ({part.events} events)" if part.action == "dropped" else ""
        print(f"  {part.name}: {part.action}{dropped}")
    for kind, n in report.removed.items():
        print(f"  {kind:<18} {n:>9} rows")
    print(
        f"{report.statements} statements in {report.elapsed:.2f}s;"
        f" longest single statement {report.longest_statement * 1000:.1f} ms"
    )
    return 0
