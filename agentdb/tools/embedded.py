"""A throwaway PostgreSQL for demos, examples and tests: no server to install.

Uses ``pgserver`` (PostgreSQL binaries in a wheel; ``pip install
'agentdb[embedded]'``). Works as root: pgserver then runs the server as its
own system user.

The server and its data (a new ``agentdb-pg-*`` directory in the temp
folder) are gone however the block ends: normally, by an exception, by
Ctrl-C (``KeyboardInterrupt``) or by SIGTERM, which while the server is up
raises :class:`~agentdb.tools._signals.Terminated` in the main thread (where
SIGTERM still has its default action). Starting and stopping are not cut
short: a signal during either acts once it is over, so a start never leaves
a server whose directory is already gone, and a second Ctrl-C does not
abort the cleanup. A SIGKILL of the process runs nothing: it leaves the
server and its directory behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from agentdb.errors import ConfigurationError
from agentdb.tools._signals import deferred, sigterm_raises

__all__ = ["PREFIX", "embedded_postgres"]

#: The data directory's name starts with this (in :func:`tempfile.gettempdir`).
PREFIX = "agentdb-pg-"
#: Seconds a fast shutdown gets before the server's processes are SIGKILLed.
STOP_WAIT = 30


@contextlib.contextmanager
def embedded_postgres(*, migrate: bool = True) -> Iterator[str]:
    """Start a private PostgreSQL, yield its ``postgresql://`` DSN, then stop and delete it.

    Args:
        migrate: apply agentdb's migrations to the ``postgres`` database first.

    Raises:
        ConfigurationError: pgserver is not installed.
        MigrationError: the migrations failed.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (CI, root shells).
            warnings.simplefilter("ignore")
            from pgserver.postgres_server import get_server
    except ImportError as exc:
        raise ConfigurationError(
            "the embedded Postgres needs pgserver: pip install 'agentdb[embedded]'"
        ) from exc
    import psycopg

    with sigterm_raises():
        data = Path(tempfile.mkdtemp(prefix=PREFIX))
        try:
            with deferred():  # an interrupted start could leave the server running
                server = get_server(data, cleanup_mode="stop")
            dsn = str(server.get_uri())
            # fsync off: the data is thrown away anyway.
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET fsync = off")
                conn.execute("ALTER SYSTEM SET synchronous_commit = off")
                conn.execute("ALTER SYSTEM SET full_page_writes = off")
                conn.execute("SELECT pg_reload_conf()")
            if migrate:
                from agentdb.migrate import migrate as apply

                apply(dsn)
            yield dsn
        finally:
            _remove(data)


def _remove(data: Path) -> None:
    """Stop the server on ``data`` and delete the directory, SIGINT and SIGTERM held.

    A signal can land before they are held: a second Ctrl-C while the first one's
    ``KeyboardInterrupt`` is still unwinding towards this cleanup, on a loaded box
    that paused the process in between. That interrupt starts the cleanup again
    instead of ending it, and is raised once the directory is gone.

    Raises:
        KeyboardInterrupt: (or :class:`~agentdb.tools._signals.Terminated`) a signal
            that came during the cleanup, once it is done.
    """
    came: KeyboardInterrupt | None = None
    done = False
    while not done:
        try:
            with deferred():
                _stop(data)
                shutil.rmtree(data, ignore_errors=True)
                done = True
        except KeyboardInterrupt as exc:
            came = came or exc
    if came is not None:
        raise came


def _stop(data: Path) -> None:
    """Stop the server on ``data`` (fast shutdown), SIGKILL what is left of it, wait for it.

    Not pgserver's own cleanup: that one stops only the server a finished start
    handed over, and only while its list of client processes (kept in ``data``)
    says this is the last one.
    """
    if (data / "postmaster.pid").exists():
        from pgserver._commands import POSTGRES_BIN_PATH

        # pg_ctl refuses to run as root: run it as the data's owner (pgserver's user then).
        owner = data.stat().st_uid
        user = owner if os.geteuid() == 0 and owner != 0 else None
        pg_ctl = str(POSTGRES_BIN_PATH / "pg_ctl")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [pg_ctl, "-D", str(data), "-m", "fast", "-w", "-t", str(STOP_WAIT), "stop"],
                user=user,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=STOP_WAIT + 5,
                check=False,
            )
    left = _processes_in(data)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if _alive(pid)]


def _processes_in(data: Path) -> list[int]:
    """The processes of the server on ``data``: its directory in their command line, or
    their working directory (a backend's command line is its status, every one runs in
    its data directory). Without ``/proc``, the postmaster that ``postmaster.pid`` names.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((data / "postmaster.pid").read_text().split()[0])
            return [pid] if _alive(pid) else []
        return []
    where, found = str(data), []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if cwd == where or where.encode() in args:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead: it only waits for its parent to reap it.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
