"""The one connection and pool factory: every tool, worker and relay connects through it.

``pooler="transaction"`` (or ``AGENTDB_POOLER=transaction``) is for a
transaction-pooling proxy such as PgBouncer in ``pool_mode = transaction``:
consecutive transactions of one client may run on different server
connections, so nothing may outlive a transaction. Under it asyncpg keeps no
named prepared statements (each statement is parsed unnamed, in the same
exchange that runs it) and no session setting is sent at connect time. No
pool resets the sessions it never changed (asyncpg's reset query is a round
trip per release: as much as the statement itself). LISTEN is not used (the
worker and relay poll), tenant scope is ``set_config(..., true)`` as always,
and advisory locks are transaction-scoped (see :mod:`agentdb.migrate`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import asyncpg

from agentdb import _dsn
from agentdb._db.execute import Pool
from agentdb._db.sqlfile import Query
from agentdb.errors import ConfigurationError, DatabaseUnavailable

__all__ = ["POOLERS", "Pooler", "connect", "create_pool", "pooler_mode"]

Pooler = Literal["none", "transaction"]
#: The values ``pooler=`` / ``AGENTDB_POOLER`` / ``--pooler`` take.
POOLERS: tuple[Pooler, ...] = ("none", "transaction")
_ALIASES: dict[str, Pooler] = {
    "": "none",
    "none": "none",
    "session": "none",
    "transaction": "transaction",
}

# Failures that mean "no usable database here": unreachable, refused, unknown
# database or role, bad password. Anything else is not a connection problem.
_UNAVAILABLE = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


def pooler_mode(pooler: str | None = None) -> Pooler:
    """``pooler``, else ``$AGENTDB_POOLER``, else ``"none"`` (``"session"`` means ``"none"``:
    a session pooler keeps session state, like a direct connection).

    Raises:
        ConfigurationError: an unknown value.
    """
    value = pooler if pooler is not None else os.environ.get("AGENTDB_POOLER", "")
    found = _ALIASES.get(value.strip().lower())
    if found is None:
        raise ConfigurationError(
            f"unknown pooler {value!r}: AGENTDB_POOLER / --pooler is 'transaction' "
            "(behind PgBouncer in transaction mode) or 'none'"
        )
    return found


def _options(schema: str | None, pooler: Pooler) -> dict[str, Any]:
    if pooler == "transaction":
        if schema:
            raise ConfigurationError(
                "behind a transaction pooler a schema cannot be a session setting: give the "
                "login role its default instead (ALTER ROLE <role> SET search_path TO "
                f"{schema}) and leave --schema out"
            )
        return {"statement_cache_size": 0}
    return {"server_settings": {"search_path": schema} if schema else None}


async def _no_reset(conn: asyncpg.Connection[Any]) -> None:
    """agentdb leaves no session state on a pooled connection - no session SET (but the
    plan cache mode a ``generic_plans`` pool gives each connection for its life, on
    purpose), advisory lock, LISTEN, cursor or temp table - so asyncpg's reset query on
    release (one round trip per statement a helper runs on the pool) would undo nothing
    it should. An open transaction
    is still rolled back: asyncpg does that before it calls this. Behind a transaction
    pooler the reset would also run on whichever server connection the proxy picks."""


def _Q() -> Mapping[str, Query]:
    # Looked up when first used: agentdb._db, which loads the statement files, imports
    # this module first.
    from agentdb import _db

    return _db.queries(__name__)


async def _plan_generically(conn: asyncpg.Connection[Any]) -> None:
    # The simple query protocol: no prepared statement of the pool's own, so behind a
    # transaction pooler named without the switch the first statement of the caller's
    # still meets the proxy, and says which switch is missing (docs/deploy/pgbouncer.md).
    await conn.execute(_Q()["pool_generic_plans"].sql)


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    schema: str | None = None,
    pooler: str | None = None,
    connect_timeout: float = 10.0,
    application_name: str | None = None,
    generic_plans: bool = False,
) -> Pool:
    """Open an asyncpg pool on ``dsn`` (its sessions in ``schema`` when given).

    ``pooler``: ``"transaction"`` behind a transaction-pooling proxy, ``"none"``
    otherwise; default ``$AGENTDB_POOLER``, else ``"none"``. ``application_name``
    names the sessions (``agentdb status`` lists workers and relays by it) unless
    ``dsn`` names them itself.

    ``generic_plans``: each new connection is set to plan each prepared
    statement once (``plan_cache_mode = force_generic_plan``, statement
    ``pool_generic_plans``) - for a worker's or relay's pool, which runs the
    same few statements on every connection all day. Left to itself PostgreSQL
    plans a statement afresh for its first five executions on each connection,
    and then again on every execution whose custom plan it prices below the
    generic one: the batched statements (an ``unnest`` of array parameters,
    whose length only a custom plan sees) and most writes by key were
    re-planned on nearly every call, a quarter to a third of the worker's
    statement time (docs/benchmarks.md, "Planning"). agentdb's statements do
    not depend on a custom plan for their guarantees or for their reads under
    a held snapshot (each names its index in its form, see
    ``agentdb/queries/leases.sql``); the test suite was run with every session
    forced generic (docs/benchmarks.md). Left as it was where Citus is installed (it cannot plan a
    multi-shard statement with parameters generically) and behind a
    transaction pooler (a session setting would leak to other clients, and
    there every statement is unnamed, planned at each execution anyway).

    Raises:
        ConfigurationError: ``dsn`` is not a postgresql:// URL, an unknown ``pooler``,
            or a ``schema`` behind a transaction pooler.
        DatabaseUnavailable: the server cannot be reached or refuses the login.
    """
    url = _dsn.libpq(dsn)
    mode = pooler_mode(pooler)
    extra = _options(schema, mode)
    if application_name is not None and "application_name=" not in url:
        extra["server_settings"] = {
            **(extra.get("server_settings") or {}),
            "application_name": application_name,
        }
    if generic_plans and mode != "transaction":
        extra["init"] = _plan_generically
    try:
        pool: Pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=connect_timeout,
            reset=_no_reset,
            **extra,
        )
    except _UNAVAILABLE as exc:
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {exc}") from exc
    return pool


async def connect(
    dsn: str,
    *,
    schema: str | None = None,
    pooler: str | None = None,
    connect_timeout: float = 10.0,
) -> asyncpg.Connection[Any]:
    """Open one connection on ``dsn`` (for LISTEN, peers' benchmarks, tools).

    Raises:
        ConfigurationError, DatabaseUnavailable: as for :func:`create_pool`.
    """
    url = _dsn.libpq(dsn)
    extra = _options(schema, pooler_mode(pooler))
    try:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(url, timeout=connect_timeout, **extra)
    except _UNAVAILABLE as exc:
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {exc}") from exc
    return conn
