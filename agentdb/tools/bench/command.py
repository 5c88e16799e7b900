"""Registers ``agentdb bench`` and runs ``python -m agentdb.tools.bench``.

Light on purpose: the CLI imports this module to list its subcommands; the
benchmark itself (psycopg, the library, the peers) is imported only when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import agentdb.tools.bench
from agentdb.errors import AgentDBError, ConfigurationError
from agentdb.tools._signals import interrupted
from agentdb.tools.cli import EXIT_FAILURE, EXIT_USAGE

__all__ = ["add_arguments", "add_bench", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench's options, shared by ``agentdb bench`` and ``python -m agentdb.tools.bench``."""
    p.add_argument(
        "--dsn",
        help="postgresql:// URL of a server where the bench may CREATE DATABASE "
        "(default: start an embedded Postgres)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, under a minute (CI smoke)")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (default 3)")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    p.add_argument(
        "--skip-1m", action="store_true", help="scale to 100k tasks instead of 1M (faster)"
    )
    p.add_argument(
        "--snapshot-seconds",
        type=float,
        help="length of each held-snapshot run (default 600; 5 with --quick)",
    )
    p.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="agentdb against DBOS: run N single-effect units on each side first (unmeasured), "
        "and CHECKPOINT before each measured run - the WAL of a database with a history, "
        "whose indexes are larger than a run (needs superuser or pg_checkpoint)",
    )
    only = p.add_mutually_exclusive_group()
    only.add_argument(
        "--dbos-only",
        action="store_const",
        const="dbos",
        dest="only",
        help="run only agentdb against DBOS (both workloads, --reps repetitions)",
    )
    only.add_argument(
        "--wal-breakdown",
        action="store_const",
        const="wal",
        dest="only",
        help="run each side's workloads once and print their WAL per unit by relation "
        "and record type (pg_waldump, per database)",
    )
    p.set_defaults(only="all")


def _cmd_bench(args: argparse.Namespace) -> int:
    """Run the bench for the parsed ``args``.

    Raises:
        ConfigurationError, DatabaseUnavailable: as for :func:`agentdb.tools.bench.runner.run`.
    """
    from agentdb.tools.bench.runner import Options, run

    run(Options(args.dsn, args.quick, args.reps, args.out, args.skip_1m, args.snapshot_seconds,
                args.only, args.history))  # fmt: skip
    return 0


def add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` subcommand to ``agentdb``'s subparsers."""
    p = sub.add_parser(
        "bench",
        help="benchmark agentdb against raw asyncpg, PgQueuer, Procrastinate and DBOS",
        description="Create throwaway databases, run each comparison with its contenders "
        "interleaved, and write report.md, results.json and chart.png.",
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_bench)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentdb.tools.bench``: the same as ``agentdb bench``; return the exit status.

    Bad input ends with one line on stderr and status 2, a database or runtime
    failure with status 1, Ctrl-C with 130 and SIGTERM with 143, as for ``agentdb``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m agentdb.tools.bench",
        description=agentdb.tools.bench.__doc__,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return _cmd_bench(args)
    except ConfigurationError as exc:
        print(f"agentdb bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AgentDBError as exc:
        print(f"agentdb bench: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt as exc:
        how, status = interrupted(exc)
        print(f"agentdb bench: {how}", file=sys.stderr)
        return status
