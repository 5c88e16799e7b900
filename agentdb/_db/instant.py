"""Instants bound for timestamptz parameters, checked before sending."""

from __future__ import annotations

from datetime import datetime

from agentdb.errors import ConfigurationError

__all__ = ["aware"]


def aware(what: str, instant: datetime | None) -> None:
    """Refuse ``instant`` unless it is ``None`` or a datetime with a time zone.

    asyncpg reads a naive datetime in the client machine's local time zone, so
    two workers in two zones would write two different instants.

    Raises:
        ConfigurationError: ``instant`` is not a datetime, or has no time zone
            (named by ``what``).
    """
    if instant is None:
        return
    if not isinstance(instant, datetime):
        raise ConfigurationError(f"{what} must be a datetime, not {type(instant).__name__}")
    if instant.utcoffset() is None:
        raise ConfigurationError(f"{what} {instant.isoformat()} has no time zone")
