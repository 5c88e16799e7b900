"""``agentdb worker`` and ``agentdb relay``: the two long-running processes."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from agentdb import _db
from agentdb._runtime import is_async_callable, owner_id
from agentdb.errors import ConfigurationError
from agentdb.tools._common import (
    add_dsn,
    dsn_from,
    exit_now,
    load,
    run_with_pool,
    setup_logging,
)

__all__ = ["add_relay", "add_worker"]


def _add_runtime(p: argparse.ArgumentParser) -> None:
    add_dsn(p)
    p.add_argument("--schema", help="schema agentdb lives in (default: first on the search_path)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls")
    p.add_argument("--no-listen", action="store_true", help="poll only (no LISTEN/NOTIFY)")
    p.add_argument("--retry-base", type=float, default=1.0, help="first retry delay, seconds")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _check_intervals(args: argparse.Namespace, **least: float) -> None:
    """Refuse, before connecting, an interval that would make the process spin or stall.

    Raises:
        ConfigurationError: ``--poll-interval`` or ``--retry-base`` of 0 or less (a busy
            loop), or an option of ``least`` under its minimum.
    """
    for flag in ("poll_interval", "retry_base"):
        if not getattr(args, flag) > 0:  # also NaN
            raise ConfigurationError(f"--{flag.replace('_', '-')} must be more than 0 seconds")
    for flag, minimum in least.items():
        if not getattr(args, flag) >= minimum:
            raise ConfigurationError(
                f"--{flag.replace('_', '-')} must be at least {minimum:g} seconds"
            )


def add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("worker", help="run a worker: claim due tasks and run their handlers")
    p.add_argument("handlers", metavar="MODULE:HANDLERS", help="dict of task type -> async handler")
    _add_runtime(p)
    p.add_argument("--concurrency", type=int, default=4, help="jobs at a time (default 4)")
    p.add_argument(
        "--pool-size", type=int, help="connections the jobs share (default: concurrency + 2)"
    )
    p.add_argument("--lease-ttl", type=float, help="lease seconds (default: each task's own)")
    p.add_argument("--shutdown-grace", type=float, default=5.0, help="seconds jobs get on SIGTERM")
    p.add_argument(
        "--retry-cap", type=float, default=300.0, help="longest retry delay, seconds (default 300)"
    )
    p.add_argument("--worker-id", help="lease owner name (default host:pid:random)")
    p.set_defaults(func=_worker)


def _handlers(
    target: Any, spec: str
) -> tuple[Mapping[str, Any], Mapping[str, Any], tuple[type[BaseException], ...]]:
    """The handlers, reconcile hooks (or MANUAL) and definite errors ``spec`` names, checked
    before any connection.

    Raises:
        ConfigurationError: not a non-empty dict (or an object with ``.handlers``),
            a handler or hook that is not an async callable (named), or ``.definite``
            that is not a tuple of exception classes.
    """
    from agentdb.worker.outcomes import check_handlers

    handlers = getattr(target, "handlers", target)
    reconcilers = getattr(target, "reconcilers", {})
    definite = getattr(target, "definite", ())
    if not isinstance(definite, tuple) or not all(
        isinstance(d, type) and issubclass(d, BaseException) for d in definite
    ):
        raise ConfigurationError(
            f"{spec}: .definite must be a tuple of exception classes (a provider's refusals)"
        )
    if not isinstance(handlers, Mapping) or not handlers:
        raise ConfigurationError(
            f"{spec} must be a non-empty dict of task type -> async handler "
            "(or an object with .handlers and optional .reconcilers and .definite)"
        )
    if not isinstance(reconcilers, Mapping):
        raise ConfigurationError(f"{spec}: .reconcilers must be a dict of action -> async hook")
    try:
        check_handlers(handlers, reconcilers)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{spec}: {exc}") from None
    return handlers, reconcilers, definite


def _worker(args: argparse.Namespace) -> int:
    from agentdb.worker import Worker

    dsn = dsn_from(args)
    if args.concurrency < 1:
        raise ConfigurationError("--concurrency must be at least 1")
    if args.pool_size is not None and args.pool_size < 1:
        raise ConfigurationError("--pool-size must be at least 1")
    if args.lease_ttl is not None and not 1 <= args.lease_ttl <= 86400:
        raise ConfigurationError("--lease-ttl must be between 1 second and 1 day")
    _check_intervals(args, shutdown_grace=0)
    if not args.retry_cap > 0:  # also NaN
        raise ConfigurationError("--retry-cap must be more than 0 seconds")
    handlers, reconcilers, definite = _handlers(load(args.handlers, "handler"), args.handlers)
    setup_logging(args)
    worker_id = args.worker_id or owner_id()

    async def body(pool: _db.Pool) -> None:
        worker = Worker(
            pool,
            handlers,
            reconcilers=reconcilers,
            definite=definite,
            worker_id=worker_id,
            concurrency=args.concurrency,
            lease_ttl=timedelta(seconds=args.lease_ttl) if args.lease_ttl else None,
            poll_interval=args.poll_interval,
            shutdown_grace=args.shutdown_grace,
            listen_dsn=None if args.no_listen else dsn,
            retry_base=args.retry_base,
            retry_cap=args.retry_cap,
            pooler=args.pooler,
        )
        await worker.run()
        if worker.abandoned:
            # Nothing stops a coroutine that swallows its cancellation, and the event
            # loop's close (and the pool's, should it hold a connection) waits for it
            # for ever. Its lease is released and its writes are fenced out (G12).
            logging.getLogger("agentdb.worker").warning(
                "exiting without %d handler(s) that ignore cancellation", len(worker.abandoned)
            )
            exit_now(0)

    # One connection per running job plus heartbeats and claims; each runs the
    # same statements all day, so each plans them once (create_pool's generic_plans).
    run_with_pool(
        dsn, args.pool_size or args.concurrency + 2, body, schema=args.schema,
        application_name=f"agentdb worker {worker_id}", generic_plans=True,
    )  # fmt: skip
    return 0


def add_relay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("relay", help="run an outbox relay: publish pending messages")
    p.add_argument("publisher", metavar="MODULE:PUBLISHER", help="async def publish(message)")
    _add_runtime(p)
    p.add_argument("--batch", type=int, default=100, help="messages per claim (default 100)")
    p.add_argument("--visibility", type=float, default=30.0, help="claim visibility, seconds")
    p.add_argument("--relay-id", help="lease owner name (default relay:host:pid:random)")
    p.set_defaults(func=_relay)


def _relay(args: argparse.Namespace) -> int:
    from agentdb.relay import Relay

    dsn = dsn_from(args)
    if args.batch < 1:
        raise ConfigurationError("--batch must be at least 1")
    _check_intervals(args, visibility=1)
    publisher = load(args.publisher, "publisher")
    if not is_async_callable(publisher):
        raise ConfigurationError(
            f"{args.publisher} is not an async callable (an async def publish(message))"
        )
    setup_logging(args)
    relay_id = args.relay_id or owner_id("relay")

    async def body(pool: _db.Pool) -> None:
        relay = Relay(
            pool,
            publisher,
            relay_id=relay_id,
            batch=args.batch,
            visibility=timedelta(seconds=args.visibility),
            poll_interval=args.poll_interval,
            listen_dsn=None if args.no_listen else dsn,
            retry_base=args.retry_base,
            pooler=args.pooler,
        )
        await relay.run()

    run_with_pool(
        dsn, 4, body, schema=args.schema, application_name=f"agentdb relay {relay_id}",
        generic_plans=True,
    )  # fmt: skip
    return 0
