"""Database URLs: where they come from, how they are shown, how libpq gets them.

One place for the rules every entry point shares, so the CLI, the migrations,
the audit and the pool factory say the same thing about a missing or
malformed DSN and never print a password.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from agentdb.errors import ConfigurationError

__all__ = ["QUERY_PARAMETERS", "from_env", "libpq", "redact", "require"]

_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


#: Query parameters libpq (psycopg, for migrations) and asyncpg (the runtime) both read
#: the same way. asyncpg would send any other one to the server as a setting.
QUERY_PARAMETERS = frozenset(
    {
        "host", "port", "dbname", "user", "password", "passfile", "service", "application_name",
        "sslmode", "sslcert", "sslkey", "sslrootcert", "sslcrl", "sslpassword",
        "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs",
        "krbsrvname", "gsslib",
    }
)  # fmt: skip
_EXAMPLE = "postgresql://user:password@host:5432/dbname"


def require(dsn: str | None) -> str:
    """Return ``dsn`` if it is a ``postgresql://`` URL naming a database.

    Raises:
        ConfigurationError: no DSN; not a postgresql:// URL; a malformed host or port;
            a query parameter both drivers would not read alike; no database name.
    """
    if not dsn:
        raise ConfigurationError("no database given: pass --dsn or set DATABASE_URL")
    try:
        parts = urlsplit(dsn)
        _ = parts.hostname, parts.port  # both parse lazily; a bad bracket or port raises here
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ConfigurationError(f"the DSN is not a valid URL ({exc}): use {_EXAMPLE}") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigurationError(f"the DSN must be a URL such as {_EXAMPLE}")
    unknown = sorted({k for k, _ in query} - QUERY_PARAMETERS)
    if unknown:
        raise ConfigurationError(
            f"the DSN has unknown parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(QUERY_PARAMETERS))}"
        )
    if not (parts.path.strip("/") or dict(query).get("dbname")):
        raise ConfigurationError(f"the DSN names no database: use {_EXAMPLE}")
    return dsn


def from_env(dsn: str | None) -> str:
    """``dsn``, else ``$DATABASE_URL``.

    Raises:
        ConfigurationError: as for :func:`require`.
    """
    return require(dsn or os.environ.get("DATABASE_URL"))


def redact(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``, for messages."""
    try:
        parts = urlsplit(dsn)
        if parts.password is None:
            return dsn
    except ValueError:
        return "<a malformed DSN>"
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def libpq(dsn: str) -> str:
    """Return ``dsn`` as a plain ``postgresql://`` URL for libpq (and asyncpg).

    Raises:
        ConfigurationError: as for :func:`require`.
    """
    parts = urlsplit(require(dsn))
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))
