"""The demo's one deadline, the signals that end a run early, and how a run ends then.

``--timeout`` bounds the whole run - migrations, seeding, the workload, the
counts - not only the workload's loop: whatever the database or a proxy in
front of it does, a run ends by its deadline plus the fleet's shutdown
(:data:`STOP_GRACE`, then SIGKILL), with one line saying where it was and
what it left unfinished (:class:`DemoTimeout`). SIGTERM and SIGINT end it
the same way, at once (:class:`DemoStopped`). Each kind of wait has its own
way of being cut short:

* Blocking code (starting the embedded Postgres, the migrations over
  psycopg) runs under :meth:`Limits.interruptible`: SIGALRM at the deadline,
  SIGTERM and SIGINT raise in the main thread, and psycopg, which waits in
  steps of 0.1 s, lets the exception through and closes its connection.
* The event loop (connecting, seeding, the workload, the counts) runs under
  :meth:`Limits.watch`: at the deadline, or on SIGTERM or SIGINT, the run's
  asyncpg pool is terminated, then the run is cancelled and stops its
  processes as it unwinds. Cancelling alone would not do: a statement that
  waits in PgBouncer's queue for a server connection does not return from a
  cancellation until PgBouncer runs it (asyncpg waits for its cancel request
  to be answered), which in a pool held by others is never; a terminated
  connection's waits end at once.
* :meth:`Limits.guard` (the whole command) records a signal that comes
  between two steps, for the next step to act on, and starts the backstop:
  a watchdog thread that, should any wait escape the two above, SIGKILLs the
  fleet and ends the process :data:`HARD_GRACE` seconds after the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeAlias

from agentdb.errors import AgentDBError

__all__ = [
    "HARD_GRACE",
    "REAP_WAIT",
    "REPORT_GRACE",
    "STOP_GRACE",
    "DemoStopped",
    "DemoTimeout",
    "Limits",
]

#: Seconds the fleet gets between SIGTERM and SIGKILL (a worker's jobs get 1 s of them).
STOP_GRACE = 5.0
#: Seconds a SIGKILLed process gets to be reaped (it only takes longer when the kernel holds it).
REAP_WAIT = 5.0
#: Seconds past the deadline the counts of a run that finished in time may take.
REPORT_GRACE = 10.0
#: Seconds past the deadline (or a signal) after which the watchdog ends the process.
HARD_GRACE = REPORT_GRACE + STOP_GRACE + REAP_WAIT + 10.0

_STOPPING = (signal.SIGTERM, signal.SIGINT)
_TIMEOUT = "timeout"
_Handler: TypeAlias = "Callable[[int, FrameType | None], Any] | int | None"


def _restore(previous: dict[signal.Signals, _Handler]) -> None:
    for sig, handler in previous.items():
        if handler is not None:  # None: set outside Python, and not ours to put back
            signal.signal(sig, handler)


class DemoTimeout(AgentDBError):
    """The run passed its ``--timeout``; the message says where and what it left unfinished."""


class DemoStopped(AgentDBError):
    """SIGTERM or SIGINT ended the run early, after its processes were stopped."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class _Interrupt(BaseException):
    """What the deadline or a signal raises in blocking code, turned into the run's error.

    A BaseException, so that no ``except Exception`` on the way swallows it; not a
    KeyboardInterrupt, which psycopg answers by cancelling the query and waiting for
    that - the very wait being cut short.
    """


class Limits:
    """One run's deadline, the step it is at, and what stopping there leaves unfinished."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.stage = "starting"
        self.unfinished = "nothing was run"
        self.log_path: Path | None = None
        self.stopped_by: str | None = None  # "timeout", or the name of the signal
        self._signum = 0
        self._interruptible = False
        self._processes: Callable[[], Iterable[subprocess.Popen[bytes]]] = lambda: ()
        self._on_stop: list[Callable[[], object]] = []
        self._rearm: Callable[[], None] | None = None

    def at(self, stage: str, unfinished: str) -> None:
        """Say which step the run is at, and what stopping now would leave unfinished."""
        self.stage, self.unfinished = stage, unfinished

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def extend(self, grace: float) -> None:
        """Give what follows at least ``grace`` seconds, past the deadline if need be."""
        if self.stopped_by is None:
            self.deadline = max(self.deadline, time.monotonic() + grace)
            if self._rearm is not None:
                self._rearm()

    def track(self, processes: Callable[[], Iterable[subprocess.Popen[bytes]]]) -> None:
        """The processes the watchdog SIGKILLs should the orderly stop hang."""
        self._processes = processes

    def on_stop(self, action: Callable[[], object]) -> None:
        """Run ``action`` when :meth:`watch` stops the run, before cancelling it."""
        self._on_stop.append(action)

    def error(self) -> DemoTimeout | DemoStopped:
        """The one line the run ends with."""
        where = f"while {self.stage}: {self.unfinished}"
        if self.log_path is not None:
            where += f" (worker and relay logs: {self.log_path})"
        if self.stopped_by in (None, _TIMEOUT):
            return DemoTimeout(f"demo timed out after {self.timeout:g}s {where}")
        elapsed = time.monotonic() - self.started
        return DemoStopped(
            f"demo stopped by {self.stopped_by} after {elapsed:.1f}s {where}", self._signum
        )

    def check(self) -> None:
        """Raise the run's error if it is past its deadline or a signal came.

        Raises:
            DemoTimeout, DemoStopped: as said.
        """
        if self.stopped_by is None and self.remaining() <= 0:
            self._stop(_TIMEOUT)
        if self.stopped_by is not None:
            raise self.error()

    def _stop(self, reason: str, signum: int = 0) -> bool:
        """Record why the run ends; ``False`` when it was ending already (the first reason wins)."""
        if self.stopped_by is not None:
            return False
        self.stopped_by, self._signum = reason, signum
        if signum:  # the run ends now: the watchdog's grace counts from here
            self.deadline = min(self.deadline, time.monotonic())
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        alarm = signum == signal.SIGALRM
        reason = _TIMEOUT if alarm else signal.Signals(signum).name
        # Only the first one raises: a second Ctrl-C must not cut the stop short.
        if self._stop(reason, 0 if alarm else signum) and self._interruptible:
            raise _Interrupt

    @contextlib.contextmanager
    def interruptible(self, stage: str, unfinished: str) -> Iterator[None]:
        """Run blocking code that the deadline, SIGTERM and SIGINT interrupt (main thread).

        Raises:
            DemoTimeout, DemoStopped: the deadline passed, or a signal came, before or
                during the block.
        """
        self.at(stage, unfinished)
        self.check()
        watched = (signal.SIGALRM, *_STOPPING)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in watched}
        self._interruptible = True
        try:
            signal.setitimer(signal.ITIMER_REAL, max(self.remaining(), 0.001))
            yield
        except _Interrupt:
            raise self.error() from None
        finally:
            self._interruptible = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            _restore(previous)

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[None]:
        """Run the block until the deadline, SIGTERM or SIGINT, then stop it.

        Stopping runs the :meth:`on_stop` actions, then cancels the block, whose
        own cleanup (the fleet's stop) runs as it unwinds.

        Raises:
            DemoTimeout, DemoStopped: in place of whatever the block raised once stopped.
        """
        self.check()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stopped = False

        def stop(reason: str, signum: int = 0) -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            self._stop(reason, signum)
            for action in self._on_stop:
                action()
            task.cancel()

        timer = loop.call_at(loop.time() + self.remaining(), stop, _TIMEOUT)

        def rearm() -> None:
            nonlocal timer
            timer.cancel()
            timer = loop.call_at(loop.time() + self.remaining(), stop, _TIMEOUT)

        # Through the loop, not signal.signal: its wakeup fd wakes a loop that waits on
        # a socket with no timer, whichever thread the kernel delivered the signal to.
        previous: dict[signal.Signals, _Handler] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in _STOPPING:
                previous[sig] = signal.getsignal(sig)
                loop.add_signal_handler(sig, stop, signal.Signals(sig).name, sig)
        self._rearm = rearm
        try:
            yield
        except BaseException:
            if not stopped:
                raise
            task.uncancel()
            raise self.error() from None
        else:
            if stopped:  # stopped as the block ended: its cancellation is still pending
                task.uncancel()
                raise self.error()
        finally:
            self._rearm = None
            timer.cancel()
            for sig in previous:
                loop.remove_signal_handler(sig)  # which sets the default, not what was there
            _restore(previous)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Hold a whole command to the deadline: signals, and the watchdog.

        Raises:
            DemoTimeout, DemoStopped: a signal raised outside :meth:`interruptible`'s
                own handling (in the instant it restores the handlers).
        """
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOPPING}
        done = threading.Event()
        threading.Thread(
            target=self._watchdog, args=(done,), name="agentdb-demo-watchdog", daemon=True
        ).start()
        try:
            yield
        except _Interrupt:
            raise self.error() from None
        finally:
            done.set()
            _restore(previous)

    def _watchdog(self, done: threading.Event) -> None:
        # Leave the signals to the main thread, where their handlers run and where
        # the kernel's delivery interrupts the blocking call they are meant to end.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, *_STOPPING})
        while not done.wait(min(1.0, max(0.0, self.deadline + HARD_GRACE - time.monotonic()))):
            if time.monotonic() >= self.deadline + HARD_GRACE:
                break
        else:
            return
        # The orderly stop hung: end what it should have ended, and the process with it.
        # os._exit runs no cleanup - that is what hung - so an embedded Postgres, if
        # any, is left running: the price of ending at all.
        self._stop(_TIMEOUT)
        procs = list(self._processes())
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(Exception):
                p.wait(1)
        line = f"agentdb: {self.error()}; the orderly stop hung, its processes were SIGKILLed\n"
        os.write(2, line.encode(errors="replace"))
        os._exit(128 + self._signum if self._signum else 1)
