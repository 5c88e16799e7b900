"""The ``agentdb`` command line (also ``python -m agentdb``).

Each tool registers its own subcommand; only the tool the command line names
is imported (``agentdb migrate`` never loads the audit or the benchmark), and
``agentdb --help`` loads just the small command modules. Bad input and
unreachable databases end with one line on stderr and a non-zero exit
status, never a traceback: 2 for bad input, 1 for a database or runtime
failure, 3 for ``audit --fail-on`` findings, 130 when interrupted (Ctrl-C,
SIGINT), 143 when ended by SIGTERM where the tool turns it into an exception
(every tool that starts an embedded Postgres does: see
:mod:`agentdb.tools._signals`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, cast

from agentdb import __version__
from agentdb.errors import AgentDBError, ConfigurationError
from agentdb.tools._signals import deferred, interrupted

__all__ = ["COMMANDS", "build_parser", "main", "one_line"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
_BREAKS = re.compile(r"\s*[\r\n]+\s*")

#: Subcommand -> the ``module:function`` that adds it, in ``--help`` order.
COMMANDS: dict[str, str] = {
    "migrate": "agentdb.tools.migrations:add_migrate",
    "rollback": "agentdb.tools.migrations:add_rollback",
    "status": "agentdb.tools.status:add_status",
    "purge": "agentdb.tools.purge:add_purge",
    "sql": "agentdb.tools.migrations:add_sql",
    "grant": "agentdb.tools.migrations:add_grant",
    "audit": "agentdb.tools.audit.command:add_audit",
    "bench": "agentdb.tools.bench.command:add_bench",
    "tenant": "agentdb.tools.tenant:add_tenant",
    "task": "agentdb.tools.operate:add_task",
    "signal": "agentdb.tools.operate:add_signal",
    "approve": "agentdb.tools.operate:add_approve",
    "reject": "agentdb.tools.operate:add_reject",
    "effects": "agentdb.tools.operate:add_effects",
    "outbox": "agentdb.tools.operate:add_outbox",
    "console": "agentdb.tools.console.command:add_console",
    "worker": "agentdb.tools.processes:add_worker",
    "relay": "agentdb.tools.processes:add_relay",
    "demo": "agentdb.tools.demo.command:add_demo",
}

Adder = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (exit 2) like every other agentdb error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"agentdb: {one_line(message)} (see `{self.prog} --help`)\n")


def one_line(message: object) -> str:
    """``message`` on one line: a newline inside an argument or a driver's reason is a space.

    An error's own ``agentdb:`` prefix is dropped: the line already starts with one.
    """
    return _BREAKS.sub(" ", str(message)).strip().removeprefix("agentdb: ")


def _adder(name: str) -> Adder:
    module, _, function = COMMANDS[name].partition(":")
    adder: Adder = getattr(importlib.import_module(module), function)
    return adder


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Return the argument parser.

    With ``argv`` naming a known subcommand, only that subcommand's tool is
    imported and registered; otherwise (no argument, ``--help``, a typo)
    every subcommand is, so argparse can list or suggest them.
    """
    parser = _Parser(
        prog="agentdb",
        description="Postgres enforces what AI agents must not get wrong.",
    )
    parser.add_argument("--version", action="version", version=f"agentdb {__version__}")
    # Subparsers are _Parser too (argparse makes them with the parent's class).
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"),
    )
    named = next((a for a in (argv or ()) if not a.startswith("-")), None)
    for name in [named] if named in COMMANDS else list(COMMANDS):
        assert name is not None
        _adder(name)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        # Building the parser imports the command's tool, and with it the library.
        # A Ctrl-C meanwhile is held until the imports are over (it could land
        # where Python swallows exceptions), then acts: one line, not a traceback.
        with deferred():
            parser = build_parser(args_list)
        args = parser.parse_args(args_list)
        if getattr(args, "pooler", None):
            # One switch: --pooler is AGENTDB_POOLER, for this process and all it spawns.
            os.environ["AGENTDB_POOLER"] = args.pooler
        code: int = args.func(args)
    except ConfigurationError as exc:
        print(f"agentdb: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except AgentDBError as exc:
        print(f"agentdb: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM where the tool raises it
        how, status = interrupted(exc)
        print(f"agentdb: {how}", file=sys.stderr)
        return status
    return code
