"""SIGTERM and SIGINT for the tools: an exception that unwinds, and steps they may not cut.

Python ends a process on SIGTERM at once, running no ``finally`` and no
``atexit`` hook: whatever a tool started outside itself (an embedded
Postgres, scratch databases) stays behind. :func:`sigterm_raises` turns
SIGTERM into :class:`Terminated` in the main thread, as Ctrl-C is turned
into ``KeyboardInterrupt``, so the tool's context managers unwind and it
exits with 143 (128 + 15) where Ctrl-C exits with 130.

:func:`deferred` holds both signals for a step that must finish once begun
(starting a server, whose process would outlive an interrupted start;
stopping it and removing its data): a signal that comes meanwhile acts
when the step is over, and a second Ctrl-C during the cleanup does not cut
it short.

Both only act in the main thread, where Python runs signal handlers; a
SIGKILL cannot be caught by anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

__all__ = [
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "Terminated",
    "deferred",
    "interrupted",
    "run_async",
    "sigterm_raises",
]

T = TypeVar("T")

#: Exit status after SIGINT (Ctrl-C): 128 + 2.
EXIT_SIGINT = 128 + signal.SIGINT
#: Exit status after SIGTERM: 128 + 15.
EXIT_SIGTERM = 128 + signal.SIGTERM

_STOPPING = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's ``KeyboardInterrupt``.

    A ``KeyboardInterrupt``, so that what already handles Ctrl-C (pytest ending the
    session and tearing its fixtures down, psycopg cancelling the running query)
    handles SIGTERM the same way, and no ``except Exception`` swallows it.
    """


def interrupted(exc: KeyboardInterrupt) -> tuple[str, int]:
    """How a command ended by ``exc`` says so, and its exit status (130 or 143)."""
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM)", EXIT_SIGTERM
    return "interrupted", EXIT_SIGINT


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread.

    Only where SIGTERM still has its default action (a handler someone installed
    is theirs to keep); the default comes back after the block unless the block
    put another handler in place itself.
    """
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during the block, then let the first that came act.

    The signal is raised again once the block is over and the handlers are back,
    so it does what it would have done (a ``KeyboardInterrupt``, a
    :class:`Terminated`, a tool's own handler), only later. Outside the main
    thread the block runs as is.
    """
    if not _main_thread():
        yield
        return
    came: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in _STOPPING:
            handler = signal.getsignal(sig)
            if handler is not None and handler is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, hold)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if came:
            signal.raise_signal(came[0])


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())``, with the event loop made while SIGINT and SIGTERM are held.

    A Ctrl-C landing inside the loop's constructor leaves a half-made loop whose
    finaliser prints a traceback as the process exits, after the command's one
    line; one landing between making the coroutine and handing it to the loop
    leaves a "never awaited" warning. Held, it acts once the loop exists, and the
    loop is closed as after any other interrupt.

    Raises:
        whatever ``main()`` raises; ``KeyboardInterrupt`` (or :class:`Terminated`)
        for a signal that came before it ran.
    """
    with contextlib.ExitStack() as stack:
        coro: Coroutine[Any, Any, T] | None = None
        try:
            with deferred():
                runner = stack.enter_context(asyncio.Runner())  # entering makes the loop
                coro = main()
            return runner.run(coro)
        finally:
            if coro is not None:
                coro.close()  # a no-op once it ran; silences "never awaited" if it did not
