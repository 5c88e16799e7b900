"""The one module that talks to asyncpg.

Runs the statements loaded from ``agentdb/queries`` (asyncpg prepares and
caches each static text per connection), checks the row count each header
declares, and turns database errors into agentdb's typed errors by SQLSTATE
and constraint name - never by message text.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from agentdb._sqlfile import Query, load
from agentdb.errors import (
    CONSTRAINTS,
    SQLSTATES,
    AgentDBError,
    DuplicateKey,
    InvariantViolation,
    PayloadTooLarge,
    SecretInPayload,
    TenantMismatch,
    TransientError,
)

__all__ = [
    "QUERIES",
    "Conn",
    "Executor",
    "Record",
    "Rerun",
    "connection",
    "execute_rows",
    "fetch_many",
    "fetch_one",
    "parse_status",
    "translate",
]

Record: TypeAlias = asyncpg.Record
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
#: Anything that can run one statement: a pool (it acquires), or a connection.
Executor: TypeAlias = "asyncpg.Pool[Any] | asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

QUERIES: dict[str, Query] = load(Path(__file__).parent / "queries")

_RETRYABLE = {
    "40001": "serialization failure",
    "40P01": "deadlock detected",
    "55P03": "lock not available",
    "57P01": "server shutting down",
    "57P02": "crash shutdown",
    "57P03": "server starting up",
}
_PAYLOAD_SIZE = {
    "agent_tasks_params_valid",
    "agent_operations_result_valid",
    "agent_events_payload_size",
    "agent_outbox_payload_size",
}
_STATUS = re.compile(r"^(?:INSERT \d+|UPDATE|DELETE|SELECT|MERGE|COPY|FETCH|MOVE) (\d+)$")


def parse_status(status: str) -> int:
    """Return the row count of a command status such as ``INSERT 0 1`` or ``UPDATE 3``.

    Raises:
        ValueError: the status has no row count (e.g. ``BEGIN``) or an unknown shape.
    """
    m = _STATUS.fullmatch(status)
    if m is None:
        raise ValueError(f"command status without a row count: {status!r}")
    return int(m.group(1))


def translate(exc: BaseException) -> BaseException:
    """Map a database or connection error to agentdb's hierarchy.

    Unknown database errors come back unchanged: agentdb never hides what it
    does not understand.
    """
    if isinstance(exc, AgentDBError):
        return exc
    if isinstance(exc, asyncpg.InvalidCachedStatementError):
        return TransientError(
            "a cached statement was invalidated by a schema change", sqlstate=exc.sqlstate
        )
    if isinstance(exc, asyncpg.PostgresError):
        state: str = exc.sqlstate or ""
        constraint: str | None = getattr(exc, "constraint_name", None)
        message = f"{getattr(exc, 'message', str(exc))}"
        if state in SQLSTATES:
            return SQLSTATES[state](message, sqlstate=state, constraint=constraint)
        if state in _RETRYABLE or state.startswith("08"):
            return TransientError(
                f"{_RETRYABLE.get(state, 'connection failure')}: {message}", sqlstate=state
            )
        if constraint in CONSTRAINTS:
            if state == "23503":
                return TenantMismatch(message, sqlstate=state, constraint=constraint)
            if state == "23505":
                return DuplicateKey(message, sqlstate=state, constraint=constraint)
            if state == "23514" and constraint in _PAYLOAD_SIZE:
                return PayloadTooLarge(message, sqlstate=state, constraint=constraint)
            if state == "23514" and constraint == "agent_events_payload_no_secrets":
                return SecretInPayload(message, sqlstate=state, constraint=constraint)
            if state.startswith("23"):
                return InvariantViolation(message, sqlstate=state, constraint=constraint)
        return exc
    if isinstance(exc, (asyncpg.ConnectionDoesNotExistError, ConnectionError, TimeoutError)):
        return TransientError(f"lost the database connection: {exc}")
    return exc


def _reraise(exc: BaseException, db: Executor) -> NoReturn:
    mapped = translate(exc)
    # asyncpg reports use of a connection it already saw die as a plain
    # InterfaceError; ask the connection rather than read the message.
    if (
        mapped is exc
        and isinstance(exc, asyncpg.InterfaceError)
        and not isinstance(db, asyncpg.Pool)
        and db.is_closed()
    ):
        mapped = TransientError(f"lost the database connection: {exc}")
    if mapped is exc:
        raise exc
    raise mapped from exc


async def fetch_many(db: Executor, q: Query, *args: Any) -> list[Record]:
    """Run a ``:many`` statement."""
    try:
        return await db.fetch(q.sql, *args)
    except Exception as exc:
        _reraise(exc, db)


def connection(db: Executor) -> AbstractAsyncContextManager[Conn]:
    """A connection from ``db``: acquired from a pool (and released), or ``db`` itself."""
    if isinstance(db, asyncpg.Pool):
        return db.acquire()
    return nullcontext(db)


class Rerun(TransientError):
    """Returned by an ``on_zero`` callback: the statement lost a race with a
    concurrent commit its snapshot could not see; a new statement will."""


async def fetch_one(
    db: Executor,
    q: Query,
    *args: Any,
    on_zero: Callable[[], Awaitable[AgentDBError]],
    reruns: int = 0,
) -> Record:
    """Run a ``:one`` statement and return its row.

    ``on_zero`` builds the error for an empty result (it may query to explain
    why). If it builds a :class:`Rerun` the statement runs again, at most
    ``reruns`` more times, and the last :class:`Rerun` is raised after that.

    Raises:
        whatever ``on_zero`` builds; RuntimeError if more than one row comes
        back (a bug in the statement, never silently truncated); mapped
        database errors.
    """
    while True:
        try:
            rows = await db.fetch(q.sql, *args)
        except Exception as exc:
            _reraise(exc, db)
        if len(rows) == 1:
            row: Record = rows[0]
            return row
        if rows:
            raise RuntimeError(f"{q.name} is declared :one but returned {len(rows)} rows")
        why = await on_zero()
        if not isinstance(why, Rerun) or reruns <= 0:
            raise why
        reruns -= 1


async def execute_rows(db: Executor, q: Query, *args: Any) -> int:
    """Run an ``:execrows`` statement and return how many rows it touched."""
    try:
        status = await db.execute(q.sql, *args)
    except Exception as exc:
        _reraise(exc, db)
    return parse_status(status)
