"""A throwaway PostgreSQL for demos, examples and tests: no server to install.

Uses ``pgserver`` (PostgreSQL binaries in a wheel; ``pip install
'agentdb[embedded]'``). Data lives in a temporary directory removed on exit.
Works as root: pgserver then runs the server as its own system user.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentdb.errors import ConfigurationError

__all__ = ["embedded_postgres"]


@contextmanager
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

    data = Path(tempfile.mkdtemp(prefix="agentdb-pg-"))
    try:
        server = get_server(data, cleanup_mode="stop")
        try:
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
            server.cleanup()
    finally:
        shutil.rmtree(data, ignore_errors=True)
