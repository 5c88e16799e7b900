"""The dedicated LISTEN connection that turns a NOTIFY into a wake-up (only ever a hint)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from agentdb._db.pool import connect

__all__ = ["listen"]

log = logging.getLogger("agentdb.listen")


async def listen(
    dsn: str | None, channel: str, wake: asyncio.Event, poll_interval: float
) -> asyncpg.Connection[Any] | None:
    """Open a dedicated connection that sets ``wake`` on each NOTIFY to ``channel``.

    Returns ``None`` (and logs one line) when there is no DSN or LISTEN is
    unavailable: the caller's polling then carries on alone.
    """
    if dsn is None:
        return None
    try:
        conn = await connect(dsn)
        await conn.add_listener(channel, lambda *_: wake.set())
    except Exception as exc:
        log.warning(
            "LISTEN %s unavailable (%s: %s); polling every %.1fs",
            channel,
            type(exc).__name__,
            exc,
            poll_interval,
        )
        return None
    return conn
