"""What the worker and the relay share: backoff, waiting for work, stopping, naming themselves."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import random
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from agentdb._db.listen import listen

__all__ = [
    "backoff",
    "describe",
    "is_async_callable",
    "nap",
    "owner_id",
    "storable",
    "wakeups",
]

# How many functools.partial / __wrapped__ layers is_async_callable looks through.
_UNWRAP_LIMIT = 100


def storable(text: str) -> str:
    """``text`` as Postgres ``text`` accepts it: NUL bytes and lone surrogates escaped."""
    clean = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return clean.replace("\x00", "\\x00")


def describe(exc: BaseException) -> str:
    """``Type: message``, storable. A user's exception whose ``str()`` itself raises
    is named by its type: describing a failure must not fail."""
    try:
        text = str(exc)
    except Exception:
        text = "(its str() raised)"
    return storable(f"{type(exc).__name__}: {text}")


def backoff(
    attempt: int, *, base: float = 1.0, cap: float = 300.0, jitter: float = 0.2
) -> timedelta:
    """Exponential backoff for ``attempt`` (1-based) with +/- ``jitter`` spread, at most ``cap``."""
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return timedelta(seconds=delay * random.uniform(1 - jitter, 1 + jitter))


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns an awaitable, as far as can be told without calling it.

    True for an ``async def`` (also as a bound method or a :func:`functools.partial`),
    an object whose ``__call__`` is one, and a wrapper whose ``__wrapped__``
    (set by :func:`functools.wraps`) is one. Callers still check what the call returns.
    """
    for _ in range(_UNWRAP_LIMIT):
        if inspect.iscoroutinefunction(fn):
            return True
        if callable(fn) and inspect.iscoroutinefunction(type(fn).__call__):
            return True
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return False
    return False


def owner_id(prefix: str = "") -> str:
    """A lease owner name unique to this process: ``[prefix:]host:pid:random``."""
    base = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    return f"{prefix}:{base}" if prefix else base


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
    """Wait for a wake-up or at most one poll interval.

    Jittered downwards only (80-100 %), so processes drift apart and a task
    found by polling alone waits no longer than the interval promises.
    The caller clears ``wake`` *before* it looks for work, not here: a NOTIFY
    that arrives while it looks then cuts this nap short instead of being lost.
    """
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), poll_interval * random.uniform(0.8, 1.0))
