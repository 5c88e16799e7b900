"""What the command-line tools share: the DSN, a pool for one command, logging, imports."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import sysconfig
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

from agentdb import _db, _dsn
from agentdb import schema as agentdb_schema
from agentdb._db.pool import POOLERS
from agentdb.errors import ConfigurationError
from agentdb.tools._signals import run_async

#: A Citus coordinator database for make test-citus / make mutate-citus.
CITUS_ENV = "AGENTDB_CITUS_DSN"
#: Set (to 1): the test session puts every test database on that cluster.
ON_CITUS_ENV = "AGENTDB_TEST_ON_CITUS"

__all__ = [
    "CITUS_ENV",
    "ON_CITUS_ENV",
    "add_dsn",
    "add_pooler",
    "add_target",
    "dsn_from",
    "exit_now",
    "load",
    "run_with_pool",
    "setup_logging",
]

T = TypeVar("T")


def dsn_from(args: argparse.Namespace) -> str:
    """``--dsn``, else ``$DATABASE_URL``.

    Raises:
        ConfigurationError: neither is set, or it is not a postgresql:// URL.
    """
    return _dsn.from_env(getattr(args, "dsn", None))


def add_pooler(p: argparse.ArgumentParser) -> None:
    """``--pooler``: the switch ``AGENTDB_POOLER`` is (the CLI exports it to what it spawns)."""
    p.add_argument(
        "--pooler",
        choices=POOLERS,
        help="'transaction' behind a transaction-pooling proxy such as PgBouncer"
        " (default: $AGENTDB_POOLER, else none)",
    )


def add_dsn(
    p: argparse.ArgumentParser, help: str = "postgresql:// URL (default: $DATABASE_URL)"
) -> None:
    p.add_argument("--dsn", help=help)
    add_pooler(p)


def add_target(p: argparse.ArgumentParser) -> None:
    add_dsn(p)
    p.add_argument("--schema", help="schema to work in (default: first on the search_path)")


def run_with_pool(
    dsn: str,
    size: int,
    body: Callable[[_db.Pool], Awaitable[T]],
    *,
    schema: str | None = None,
    application_name: str | None = None,
    generic_plans: bool = False,
) -> T:
    """Open a pool, check the schema, run ``body(pool)`` on a fresh event loop, close the pool.

    ``generic_plans``: as :func:`agentdb.create_pool`'s (the worker's and the relay's).

    Raises:
        DatabaseUnavailable: the pool could not be opened.
        MigrationError: the schema is missing or older than this agentdb (nothing ran).
        whatever ``body`` raises.
    """

    async def main() -> T:
        pool = await _db.create_pool(
            dsn,
            min_size=1,
            max_size=size,
            schema=schema,
            application_name=application_name,
            generic_plans=generic_plans,
        )
        try:
            await agentdb_schema.check(pool)
            return await body(pool)
        finally:
            await pool.close()

    return run_async(main)


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` at once, its logs and output flushed first.

    For what cannot be waited for: a coroutine that swallows its cancellation
    keeps ``asyncio.run`` from ever returning. Nothing else is cleaned up: the
    operating system closes the connections.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(args: argparse.Namespace) -> None:
    """Log to stderr as text or one JSON object per line (``--log-format``)."""
    handler = logging.StreamHandler()
    if args.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
        )
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler], force=True)


def _failed_at(exc: BaseException) -> str:
    """``file:line: `` of the user's code the exception came from, or ``""``.

    The last frame outside the import machinery and the installed packages: the
    line of the user's module (or of a module of theirs it imports) that failed,
    not the depths of a library it called.
    """
    installed = tuple(
        os.path.realpath(p)
        for p in {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    )
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    ours = [f for f in frames if not os.path.realpath(f.filename).startswith(installed)]
    found = ours or frames
    return f"{found[-1].filename}:{found[-1].lineno}: " if found else ""


def load(spec: str, what: str) -> Any:
    """Import ``module:attribute`` (the current directory is importable).

    Raises:
        ConfigurationError: malformed spec, the module does not import, or it lacks the name.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{what} must be given as MODULE:ATTRIBUTE, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}: " if exc.filename else ""
        raise ConfigurationError(
            f"cannot import {what} module {module_name!r}: {where}SyntaxError: {exc.msg}"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import {what} module {module_name!r}: "
            f"{_failed_at(exc)}{type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
