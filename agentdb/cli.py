"""The ``agentdb`` command line (also ``python -m agentdb``).

Bad input and unreachable databases end with one line on stderr and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

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
    dsn = _dsn(args)
    states = migrate.status(dsn, schema=args.schema)
    if args.migrations:
        _print_migrations(states, as_json=args.json)
        return 0
    if args.watch is not None and args.watch <= 0:
        raise ConfigurationError("--watch needs a positive number of seconds")
    applied = sum(s.applied for s in states)
    from agentdb import status

    async def main() -> None:
        pool = await _connect_pool(dsn, 2, schema=args.schema)
        try:
            while True:
                snap = await status.snapshot(pool)
                if args.json:
                    doc = status.to_json(
                        snap, migrations={"applied": applied, "shipped": len(states)}
                    )
                    print(json.dumps(doc, indent=2), flush=True)
                else:
                    header = (
                        f"agentdb status at {snap.at:%Y-%m-%d %H:%M:%S} UTC"
                        f" - schema: {applied} of {len(states)} migrations applied"
                    )
                    if args.watch is not None:
                        print("\033[2J\033[H", end="")
                    print(status.to_table(snap, header=header), flush=True)
                if args.watch is None:
                    return
                await asyncio.sleep(args.watch)
        finally:
            await pool.close()

    asyncio.run(main())
    return 0


def _print_migrations(states: list[migrate.MigrationState], *, as_json: bool) -> None:
    if as_json:
        payload = [
            {
                "id": s.id,
                "applied": s.applied,
                "applied_at": s.applied_at.isoformat() if s.applied_at else None,
            }
            for s in states
        ]
        print(json.dumps({"migrations": payload}, indent=2))
        return
    width = max(len(s.id) for s in states)
    for s in states:
        when = f"  {s.applied_at:%Y-%m-%d %H:%M:%S} UTC" if s.applied_at else ""
        print(f"{s.id:<{width}}  {'applied' if s.applied else 'pending'}{when}")


def _cmd_purge(args: argparse.Namespace) -> int:
    from agentdb import retention

    dsn = _dsn(args)
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

    async def main() -> Any:
        pool = await _connect_pool(dsn, 1, schema=args.schema)
        try:
            return await retention.purge(
                pool, batch=args.batch, ages=ages, classes=classes, progress=progress
            )
        finally:
            await pool.close()

    report = asyncio.run(main())
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        print(json.dumps({
            "removed": report.removed, "statements": report.statements,
            "longest_statement_ms": round(report.longest_statement * 1000, 1),
            "elapsed_s": round(report.elapsed, 3),
        }, indent=2))  # fmt: skip
        return 0
    for kind, n in report.removed.items():
        print(f"  {kind:<18} {n:>9} rows")
    print(
        f"{report.statements} statements in {report.elapsed:.2f}s;"
        f" longest single statement {report.longest_statement * 1000:.1f} ms"
    )
    return 0


def _cmd_sql(args: argparse.Namespace) -> int:
    sys.stdout.write(migrate.role_ddl() if args.roles else migrate.ddl(schema=args.schema))
    return 0


def _cmd_grant(args: argparse.Namespace) -> int:
    for notice in migrate.grant(_dsn(args), schema=args.schema):
        print(notice)
    print("grants applied to the agentdb roles that exist")
    return 0


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


def _setup_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler()
    if args.log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
        )
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler], force=True)


def _load(spec: str, what: str) -> Any:
    """Import ``module:attribute`` (the current directory is importable)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{what} must be given as MODULE:ATTRIBUTE, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import {what} module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None


def _handlers(target: Any, spec: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    handlers = getattr(target, "handlers", target)
    reconcilers = getattr(target, "reconcilers", {})
    if not isinstance(handlers, Mapping) or not handlers:
        raise ConfigurationError(
            f"{spec} must be a non-empty dict of task type -> async handler "
            "(or an object with .handlers and optional .reconcilers)"
        )
    for name, fn in handlers.items():
        if not (isinstance(name, str) and callable(fn)):
            raise ConfigurationError(f"{spec}: handler for {name!r} is not callable")
    return handlers, reconcilers


def _pool_size(concurrency: int) -> int:
    # One connection per running job plus heartbeats and claims.
    return concurrency + 2


def _cmd_worker(args: argparse.Namespace) -> int:
    from agentdb.worker import Worker

    dsn = _dsn(args)
    if args.concurrency < 1:
        raise ConfigurationError("--concurrency must be at least 1")
    if args.lease_ttl is not None and not 1 <= args.lease_ttl <= 86400:
        raise ConfigurationError("--lease-ttl must be between 1 second and 1 day")
    handlers, reconcilers = _handlers(_load(args.handlers, "handler"), args.handlers)
    _setup_logging(args)

    async def main() -> None:
        pool = await _connect_pool(dsn, _pool_size(args.concurrency))
        try:
            worker = Worker(
                pool,
                handlers,
                reconcilers=reconcilers,
                worker_id=args.worker_id,
                concurrency=args.concurrency,
                lease_ttl=timedelta(seconds=args.lease_ttl) if args.lease_ttl else None,
                poll_interval=args.poll_interval,
                shutdown_grace=args.shutdown_grace,
                listen_dsn=None if args.no_listen else dsn,
                retry_base=args.retry_base,
            )
            await worker.run()
        finally:
            await pool.close()

    asyncio.run(main())
    return 0


def _cmd_relay(args: argparse.Namespace) -> int:
    from agentdb.relay import Relay

    dsn = _dsn(args)
    if args.batch < 1:
        raise ConfigurationError("--batch must be at least 1")
    publisher = _load(args.publisher, "publisher")
    if not callable(publisher):
        raise ConfigurationError(
            f"{args.publisher} is not callable (an async def publish(message))"
        )
    _setup_logging(args)

    async def main() -> None:
        pool = await _connect_pool(dsn, 4)
        try:
            relay = Relay(
                pool,
                publisher,
                relay_id=args.relay_id,
                batch=args.batch,
                visibility=timedelta(seconds=args.visibility),
                poll_interval=args.poll_interval,
                listen_dsn=None if args.no_listen else dsn,
                retry_base=args.retry_base,
            )
            await relay.run()
        finally:
            await pool.close()

    asyncio.run(main())
    return 0


async def _connect_pool(dsn: str, size: int, *, schema: str | None = None) -> Any:
    import asyncpg

    from agentdb.errors import DatabaseUnavailable
    from agentdb.migrate import redact

    settings = {"search_path": schema} if schema else None
    try:
        return await asyncpg.create_pool(
            dsn, min_size=1, max_size=size, timeout=10, server_settings=settings
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseUnavailable(f"cannot connect to {redact(dsn)}: {exc}") from exc


def _cmd_tenant_delete(args: argparse.Namespace) -> int:
    import uuid

    from agentdb.tenancy import delete_tenant

    dsn = _dsn(args)
    try:
        tenant_id = uuid.UUID(args.tenant_id)
    except ValueError:
        raise ConfigurationError(f"{args.tenant_id!r} is not a tenant id (a UUID)") from None
    if args.dry_run == args.yes:
        raise ConfigurationError("say --dry-run to see what would happen, or --yes to do it")

    async def main() -> Any:
        pool = await _connect_pool(dsn, 1)
        try:
            return await delete_tenant(pool, tenant_id, dry_run=args.dry_run, actor="agentdb-cli")
        finally:
            await pool.close()

    report = asyncio.run(main())
    if args.json:
        print(json.dumps({
            "tenant_id": str(report.tenant_id),
            "dry_run": report.dry_run,
            "complete": report.complete,
            "steps": [
                {"step": s.step, "object": s.object, "action": s.action, "rows": s.affected,
                 "retained_until": s.retained_until.isoformat() if s.retained_until else None,
                 "refs": list(s.refs)}
                for s in report.steps
            ],
        }, indent=2))  # fmt: skip
        return 0
    verb = "would" if report.dry_run else "did"
    print(f"tenant {tenant_id}: {'dry run' if report.dry_run else 'deletion'}")
    for s in report.steps:
        until = f" until {s.retained_until:%Y-%m-%d}" if s.retained_until else ""
        print(f"  {s.step:>2}. {s.object:<22} {s.action:<28} {s.affected:>6} rows{until}")
        for ref in s.refs:
            print(f"        {ref}")
    if report.complete:
        tail = "the tenant is gone"
    else:
        until = f" until {report.retained_until:%Y-%m-%d}" if report.retained_until else ""
        tail = f"audit events are retained{until}; run again then to finish"
    print(f"{verb}: {tail}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentdb import demo

    return demo.main(args)


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="postgresql:// URL (default: $DATABASE_URL)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls")
    p.add_argument("--no-listen", action="store_true", help="poll only (no LISTEN/NOTIFY)")
    p.add_argument("--retry-base", type=float, default=1.0, help="first retry delay, seconds")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


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

    p = sub.add_parser("status", help="tasks, leases, operations, outbox, inbox, purge backlog")
    _add_target(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS")
    p.add_argument("--migrations", action="store_true", help="list migrations and whether applied")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("purge", help="delete what is past retention, in small batches")
    _add_target(p)
    p.add_argument("--batch", type=int, default=1000, help="rows per statement (default 1000)")
    p.add_argument(
        "--older-than",
        action="append",
        metavar="CLASS=DAYS",
        help="age for outbox_delivered, inbox, operations, tasks (repeatable)",
    )
    p.add_argument("--only", help="comma-separated classes to purge (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_purge)

    p = sub.add_parser("sql", help="print the complete DDL for pasting or piping into psql")
    p.add_argument("--schema", help="create and fill this schema instead of the default")
    p.add_argument("--roles", action="store_true", help="print only the CREATE ROLE statements")
    p.set_defaults(func=_cmd_sql)

    p = sub.add_parser("grant", help="grant to agentdb roles created after migrating")
    _add_target(p)
    p.set_defaults(func=_cmd_grant)

    from agentdb import audit, bench

    audit.register(sub)
    bench.register(sub)

    p = sub.add_parser("tenant", help="tenant administration")
    tenant_sub = p.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    p = tenant_sub.add_parser("delete", help="apply the tenant deletion policy (G17)")
    p.add_argument("tenant_id", help="the tenant's id")
    p.add_argument("--dsn", help="postgresql:// URL of the schema owner (default: $DATABASE_URL)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", action="store_true", help="report what would happen, change nothing"
    )
    mode.add_argument("--yes", action="store_true", help="do it")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_tenant_delete)

    p = sub.add_parser("worker", help="run a worker: claim due tasks and run their handlers")
    p.add_argument("handlers", metavar="MODULE:HANDLERS", help="dict of task type -> async handler")
    _add_runtime(p)
    p.add_argument("--concurrency", type=int, default=4, help="jobs at a time (default 4)")
    p.add_argument("--lease-ttl", type=float, help="lease seconds (default: each task's own)")
    p.add_argument("--shutdown-grace", type=float, default=5.0, help="seconds jobs get on SIGTERM")
    p.add_argument("--worker-id", help="lease owner name (default host:pid:random)")
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser("relay", help="run an outbox relay: publish pending messages")
    p.add_argument("publisher", metavar="MODULE:PUBLISHER", help="async def publish(message)")
    _add_runtime(p)
    p.add_argument("--batch", type=int, default=100, help="messages per claim (default 100)")
    p.add_argument("--visibility", type=float, default=30.0, help="claim visibility, seconds")
    p.add_argument("--relay-id", help="lease owner name (default relay:host:pid:random)")
    p.set_defaults(func=_cmd_relay)

    p = sub.add_parser("demo", help="run a multi-tenant agent workload with crashes and report")
    p.add_argument("--dsn", help="run against this Postgres (default: an embedded one)")
    p.add_argument("--tasks", type=int, default=300, help="tasks to run (default 300)")
    p.add_argument("--tenants", type=int, default=5, help="tenants (default 5)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--relays", type=int, default=2, help="relay processes (default 2)")
    p.add_argument(
        "--kill-every", type=float, default=0.5, help="mean seconds between SIGKILLs (0: none)"
    )
    p.add_argument("--timeout", type=float, default=100.0, help="give up after this many seconds")
    p.add_argument("--seed", type=int, help="random seed for kills and provider faults")
    p.set_defaults(func=_cmd_demo)
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
