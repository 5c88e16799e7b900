"""How the worker and the relay wait: a LISTEN hint, polling always, stopping on signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from collections.abc import AsyncIterator, Callable

import asyncpg

log = logging.getLogger("agentdb.listen")


async def listen(
    dsn: str | None, channel: str, wake: asyncio.Event, poll_interval: float
) -> asyncpg.Connection | None:
    """Open a dedicated connection that sets ``wake`` on each NOTIFY to ``channel``.

    Returns ``None`` (and logs one line) when there is no DSN or LISTEN is
    unavailable: the caller's polling then carries on alone.
    """
    if dsn is None:
        return None
    try:
        conn: asyncpg.Connection = await asyncpg.connect(dsn, timeout=10)
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


@contextlib.asynccontextmanager
async def wakeups(
    *,
    dsn: str | None,
    channel: str,
    wake: asyncio.Event,
    poll_interval: float,
    stop: Callable[[], None],
    install_signals: bool,
) -> AsyncIterator[None]:
    """While the body runs: SIGTERM/SIGINT call ``stop``; NOTIFY on ``channel`` sets ``wake``."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if install_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop)
    listener = await listen(dsn, channel, wake, poll_interval)
    try:
        yield
    finally:
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close()
        for sig in signals:
            loop.remove_signal_handler(sig)


async def nap(wake: asyncio.Event, poll_interval: float) -> None:
    """Wait for a wake-up or one poll interval (jittered so processes drift apart)."""
    wake.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), poll_interval * random.uniform(0.8, 1.2))
