"""A throwaway PgBouncer in transaction pooling mode in front of a Postgres (tests, bench).

It needs the ``pgbouncer`` binary (Debian: ``apt-get install pgbouncer``; 1.18 has no
protocol-level prepared statements - the common production case). It listens on a
free loopback port, proxies every database of the upstream server, lets every
given user in (``auth_type = trust``, loopback only) and connects upstream as
that user. As root it runs as the ``postgres`` (or ``nobody``) user, because
PgBouncer refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from agentdb.errors import ConfigurationError
from agentdb.tools._process import stop

__all__ = ["Bouncer", "find_binary", "pgbouncer"]

_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")


def find_binary() -> str | None:
    """The pgbouncer executable, or ``None``."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((c for c in _CANDIDATES if Path(c).is_file()), None)


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: rewrite an upstream DSN with :meth:`url` to go through it."""

    host: str
    port: int
    workdir: Path

    def url(self, upstream_dsn: str) -> str:
        """``upstream_dsn`` pointed at this PgBouncer (same user, password and database)."""
        parts = urlsplit(upstream_dsn)
        user = parts.username or "postgres"
        auth = user if parts.password is None else f"{user}:{parts.password}"
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")]
        tail = "&".join(f"{k}={v}" for k, v in query)
        return urlunsplit(("postgresql", f"{auth}@{self.host}:{self.port}", parts.path, tail, ""))

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _upstream(dsn: str) -> tuple[str, int]:
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = query.get("host") or parts.hostname or "127.0.0.1"
    port = int(query.get("port") or parts.port or 5432)
    return unquote(host), port


def _runs_as(upstream_host: str) -> str | None:
    if os.geteuid() != 0:
        return None
    if upstream_host.startswith("/"):
        # A Unix socket in a data directory only its server's user may enter
        # (an embedded Postgres run as root): run as that user.
        owner = pwd.getpwuid(os.stat(upstream_host).st_uid).pw_name
        if owner != "root":
            return owner
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise ConfigurationError("pgbouncer will not run as root and there is no postgres/nobody user")


@contextlib.contextmanager
def pgbouncer(
    upstream_dsn: str,
    users: Mapping[str, str],
    *,
    pool_size: int = 4,
    binary: str | None = None,
) -> Iterator[Bouncer]:
    """Run a transaction-pooling PgBouncer in front of ``upstream_dsn`` while the block runs.

    ``users`` maps each login the clients use to the password PgBouncer presents
    upstream (``""`` where the upstream trusts it). ``pool_size`` server
    connections per (database, user) pair: small, so that consecutive
    transactions of one client really do land on different server connections.

    Raises:
        ConfigurationError: no pgbouncer binary, or it did not start (its log is quoted).
    """
    exe = binary or find_binary()
    if exe is None:
        raise ConfigurationError(
            "pgbouncer is not installed (Debian: apt-get install -y pgbouncer)"
        )
    host, port = _upstream(upstream_dsn)
    listen = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="agentdb-pgbouncer-"))
    os.chmod(workdir, 0o777)  # the unprivileged user it runs as writes its log and pid here
    userlist = "".join(f'"{u}" "{pw}"\n' for u, pw in sorted(users.items()))
    (workdir / "userlist.txt").write_text(userlist)
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {listen}\n"
        f"unix_socket_dir = {workdir}\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        # Hand each transaction the next server connection, not the last one used: a
        # client that wrongly relies on its session sees a different one every time.
        "server_round_robin = 1\n"
        f"default_pool_size = {pool_size}\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        "max_client_conn = 500\n"
        "server_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    for name in ("pgbouncer.ini", "userlist.txt"):
        os.chmod(workdir / name, 0o644)
    user = _runs_as(host)
    cmd = [exe, *(["-u", user] if user else []), str(workdir / "pgbouncer.ini")]
    # Its stderr goes to a file, never to a pipe: PgBouncer logs every login
    # there too, and a pipe nobody drains fills after ~64 KiB and freezes the
    # proxy mid-run, with every client waiting on it.
    err_path = workdir / "pgbouncer.stderr"
    with open(err_path, "wb") as err_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file)
    bouncer = Bouncer("127.0.0.1", listen, workdir)
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen), 0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                err = err_path.read_text(errors="replace")
                raise ConfigurationError(
                    f"pgbouncer did not start: {err.strip() or bouncer.log().strip()}"
                )
            time.sleep(0.05)
        yield bouncer
    finally:
        stop(proc, signal.SIGINT)  # PgBouncer's immediate shutdown
        shutil.rmtree(workdir, ignore_errors=True)
