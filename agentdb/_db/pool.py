"""The one connection and pool factory: every tool, worker and relay connects through it."""

from __future__ import annotations

from typing import Any

import asyncpg

from agentdb import _dsn
from agentdb._db.execute import Pool
from agentdb.errors import DatabaseUnavailable

__all__ = ["connect", "create_pool"]

# Failures that mean "no usable database here": unreachable, refused, unknown
# database or role, bad password. Anything else is not a connection problem.
_UNAVAILABLE = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


def _settings(schema: str | None) -> dict[str, str] | None:
    return {"search_path": schema} if schema else None


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    schema: str | None = None,
    connect_timeout: float = 10.0,
) -> Pool:
    """Open an asyncpg pool on ``dsn`` (its sessions in ``schema`` when given).

    Raises:
        ConfigurationError: ``dsn`` is not a postgresql:// URL.
        DatabaseUnavailable: the server cannot be reached or refuses the login.
    """
    url = _dsn.libpq(dsn)
    try:
        pool: Pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=connect_timeout,
            server_settings=_settings(schema),
        )
    except _UNAVAILABLE as exc:
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {exc}") from exc
    return pool


async def connect(
    dsn: str, *, schema: str | None = None, connect_timeout: float = 10.0
) -> asyncpg.Connection[Any]:
    """Open one connection on ``dsn`` (for LISTEN, peers' benchmarks, tools).

    Raises:
        ConfigurationError, DatabaseUnavailable: as for :func:`create_pool`.
    """
    url = _dsn.libpq(dsn)
    try:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(
            url, timeout=connect_timeout, server_settings=_settings(schema)
        )
    except _UNAVAILABLE as exc:
        raise DatabaseUnavailable(f"cannot connect to {_dsn.redact(dsn)}: {exc}") from exc
    return conn
