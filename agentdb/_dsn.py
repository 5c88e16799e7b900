"""Database URLs: where they come from, how they are shown, how libpq gets them.

One place for the rules every entry point shares, so the CLI, the migrations,
the audit and the pool factory say the same thing about a missing or
malformed DSN and never print a password.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agentdb.errors import ConfigurationError

__all__ = ["from_env", "libpq", "redact", "require", "with_query"]

_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


def require(dsn: str | None) -> str:
    """Return ``dsn`` if it is a ``postgresql://`` URL.

    Raises:
        ConfigurationError: no DSN, or not a postgresql:// URL.
    """
    if not dsn:
        raise ConfigurationError("no database given: pass --dsn or set DATABASE_URL")
    if urlsplit(dsn).scheme not in _SCHEMES:
        raise ConfigurationError(
            "the DSN must be a URL such as postgresql://user:password@host:5432/dbname"
        )
    return dsn


def from_env(dsn: str | None) -> str:
    """``dsn``, else ``$DATABASE_URL``.

    Raises:
        ConfigurationError: as for :func:`require`.
    """
    return require(dsn or os.environ.get("DATABASE_URL"))


def redact(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``, for messages."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def libpq(dsn: str) -> str:
    """Return ``dsn`` as a plain ``postgresql://`` URL for libpq (and asyncpg).

    Raises:
        ConfigurationError: as for :func:`require`.
    """
    parts = urlsplit(require(dsn))
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))


def with_query(dsn: str, scheme: str, **args: str | None) -> str:
    """Return ``dsn`` with ``scheme`` and its query arguments set (``None`` removes one)."""
    parts = urlsplit(require(dsn))
    kept = [(k, v) for k, v in parse_qsl(parts.query) if k not in args]
    kept += [(k, v) for k, v in args.items() if v is not None]
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(kept), ""))
