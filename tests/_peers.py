"""The schemas of real queue/workflow libraries, created from their registry packages.

Each peer is a pinned package from PyPI or npm, downloaded once into a cache
directory (``$AGENTDB_PEERS_CACHE``, default ``~/.cache/agentdb-audit-peers``)
with the registry's own client (``pip download``, ``npm pack``), unpacked,
and asked for its DDL the way the library itself produces it: procrastinate
ships ``schema.sql``; PgQueuer renders its install script in Python; pg-boss
builds its plan in JavaScript (and partitions its job table per queue when a
queue is created); graphile-worker ships numbered migrations; DBOS runs its
own system-database migrations (installed with its dependencies into the
cache, never into this environment). Nothing here
is copied from the libraries: a peer that cannot be fetched fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PEERS", "Peer", "PeerUnavailable", "create", "fetch", "scripts"]


class PeerUnavailable(RuntimeError):
    """A peer package could not be downloaded or asked for its DDL."""


@dataclass(frozen=True)
class Peer:
    """One library: where it comes from and which schema its DDL fills."""

    name: str
    registry: str  # "pypi" or "npm"
    package: str
    version: str
    schema: str
    ddl: Callable[[Path], list[str]]  # unpacked package -> scripts, one transaction each
    # The library creates its schema itself (given the unpacked package and an
    # admin DSN) instead of handing over scripts; it then needs its dependencies.
    create: Callable[[Path, str], None] | None = None

    @property
    def pin(self) -> str:
        return (
            f"{self.package}=={self.version}"
            if self.registry == "pypi"
            else (f"{self.package}@{self.version}")
        )


def _cache() -> Path:
    root = os.environ.get("AGENTDB_PEERS_CACHE") or str(
        Path.home() / ".cache" / "agentdb-audit-peers"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{' '.join(cmd[:3])}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PeerUnavailable(f"{' '.join(cmd[:4])} exited {done.returncode}: {' | '.join(tail)}")
    return done.stdout


def fetch(peer: Peer) -> Path:
    """The unpacked package, downloaded into the cache the first time.

    Raises:
        PeerUnavailable: the registry client failed or is not installed.
    """
    target = _cache() / f"{peer.package}-{peer.version}"
    if (target / ".complete").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    download = _cache() / "downloads"
    download.mkdir(exist_ok=True)
    if peer.registry == "pypi" and peer.create is not None:
        # Run as a program: the package and its dependencies, in the cache only.
        _run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
             "--disable-pip-version-check", "--only-binary=:all:", "--target", str(target),
             peer.pin],
        )  # fmt: skip
    elif peer.registry == "pypi":
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--disable-pip-version-check", "--dest", str(download),
             peer.pin],
        )  # fmt: skip
        wheels = sorted(download.glob(f"{peer.package}-{peer.version}-*.whl"))
        if not wheels:
            raise PeerUnavailable(f"pip download {peer.pin} left no wheel in {download}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(target)
    else:
        npm = shutil.which("npm")
        if npm is None:
            raise PeerUnavailable(f"npm is not installed: cannot fetch {peer.pin}")
        out = _run([npm, "pack", "--silent", "--pack-destination", str(download), peer.pin])
        tarball = download / out.strip().splitlines()[-1]
        with tarfile.open(tarball) as tar:
            tar.extractall(target, filter="data")
    (target / ".complete").touch()
    return target


def create(peer: Peer, admin_dsn: str) -> None:
    """Create the peer's schema in the database at ``admin_dsn``, as the library does.

    Raises:
        PeerUnavailable: the package cannot be fetched, or its migrations failed.
    """
    root = fetch(peer)
    if peer.create is not None:
        peer.create(root, admin_dsn)
        return
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for script in peer.ddl(root):
            with conn.transaction():
                conn.execute(script.encode())  # the library's own DDL, one transaction each


def scripts(peer: Peer) -> list[str]:
    """The peer's DDL, as the scripts to run in order (each in its own transaction).

    Raises:
        PeerUnavailable: the package cannot be fetched or asked for its DDL.
    """
    return peer.ddl(fetch(peer))


def _procrastinate(root: Path) -> list[str]:
    return [(root / "procrastinate" / "sql" / "schema.sql").read_text()]


def _pgqueuer(root: Path) -> list[str]:
    # The install script PgQueuer's own `pgq install` runs, rendered by the
    # downloaded package (its dependencies come from this environment).
    code = (
        "from pgqueuer.adapters.persistence import qb\n"
        "print(qb.QueryBuilderEnvironment().build_install_query())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    return [_run([sys.executable, "-c", code], env=env)]


def _pg_boss(root: Path) -> list[str]:
    node = shutil.which("node")
    if node is None:
        raise PeerUnavailable("node is not installed: cannot render the pg-boss plan")
    package = root / "package"
    version = json.loads((package / "version.json").read_text())["schema"]
    code = (
        "const plans = require('./src/plans.js');"
        f"process.stdout.write(plans.create('pgboss', {int(version)}));"
    )
    plan = _run([node, "-e", code], cwd=package)
    # pg-boss creates a queue's job partition (and its unique indexes) on
    # createQueue(); one queue makes the partitioned shape real.
    return [plan, "SELECT pgboss.create_queue('email', '{\"policy\": \"standard\"}')"]


def _graphile_worker(root: Path) -> list[str]:
    # What graphile-worker's migrate() runs: its bootstrap, then each
    # migration in its own transaction with the schema placeholder filled.
    schema = "graphile_worker"
    boot = (
        f"CREATE SCHEMA IF NOT EXISTS {schema};"
        f"CREATE TABLE IF NOT EXISTS {schema}.migrations (id int PRIMARY KEY, "
        "ts timestamptz DEFAULT now() NOT NULL, breaking boolean NOT NULL DEFAULT false);"
    )
    files = sorted((root / "package" / "sql").glob("0*.sql"))
    if not files:
        raise PeerUnavailable(f"no migrations in {root / 'package' / 'sql'}")
    return [boot] + [f.read_text().replace(":GRAPHILE_WORKER_SCHEMA", schema) for f in files]


def _dbos(root: Path, admin_dsn: str) -> None:
    # DBOS migrates its system database itself (ensure_dbos_schema, then each
    # migration in order, the CONCURRENTLY ones outside a transaction).
    code = (
        "import sys\n"
        "import sqlalchemy as sa\n"
        "from dbos._migration import ensure_dbos_schema, run_dbos_migrations\n"
        "engine = sa.create_engine(sys.argv[1])\n"
        "ensure_dbos_schema(engine, 'dbos')\n"
        "run_dbos_migrations(engine, 'dbos', True)\n"
        "engine.dispose()\n"
    )
    url = admin_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    _run([sys.executable, "-c", code, url], env={**os.environ, "PYTHONPATH": str(root)})


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer("procrastinate", "pypi", "procrastinate", "3.10.0", "public", _procrastinate),
        Peer("pgqueuer", "pypi", "pgqueuer", "1.6.0", "public", _pgqueuer),
        Peer("pg-boss", "npm", "pg-boss", "10.1.6", "pgboss", _pg_boss),
        Peer("graphile-worker", "npm", "graphile-worker", "0.16.6", "graphile_worker",
             _graphile_worker),
        Peer("dbos", "pypi", "dbos", "3.4.0", "dbos", lambda _root: [], _dbos),
    )
}  # fmt: skip
