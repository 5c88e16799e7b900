"""Run one static statement: bind its parameters by name, check its row count, map its errors.

asyncpg prepares and caches each statement text per connection. The row count
a header declares is checked here, not by each caller: a ``:one`` statement
that returns two rows is a bug in the statement and raises, it is never
silently truncated. Database errors become agentdb's typed errors through
:func:`agentdb._db.errormap.error_for` (SQLSTATE and constraint name, never the
message text).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any, NoReturn, TypeAlias, TypeGuard

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from agentdb._db.errormap import error_for
from agentdb._db.sqlfile import Query
from agentdb.errors import AgentDBError, TransientError

__all__ = [
    "Conn",
    "Executor",
    "Pool",
    "Record",
    "StatementBug",
    "by_ord",
    "connection",
    "execute_each",
    "execute_rows",
    "fetch_many",
    "fetch_one",
    "fetch_optional",
    "is_pool",
    "parse_status",
    "raw_connection",
    "transaction",
    "translate",
]

Record: TypeAlias = asyncpg.Record
Pool: TypeAlias = "asyncpg.Pool[Any]"
Conn: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
#: Anything that can run one statement: a pool (it acquires), or a connection.
Executor: TypeAlias = "asyncpg.Pool[Any] | asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

# Citus re-raises a worker's error with its SQLSTATE and message but without
# the constraint field, and the name in the message carries the shard id
# (agent_tenants_pkey_102156). The name is recovered from that one quoted
# spot and accepted only if, without its shard suffix, it is one of ours
# (error_for checks the catalogue): the mapping is still by constraint name.
_CITUS_CONSTRAINT = re.compile(r'constraint "([a-z0-9_]+?)(?:_[0-9]+)?"')
_STATUS = re.compile(r"^(?:INSERT \d+|UPDATE|DELETE|SELECT|MERGE|COPY|FETCH|MOVE) (\d+)$")


class StatementBug(AgentDBError):
    """A statement broke its own declared contract (a bug in agentdb, never the caller's).

    For example, a ``:one`` statement returned two rows, or a statement whose
    header says zero rows never happen returned none.
    """


def parse_status(status: str) -> int:
    """Return the row count of a command status such as ``INSERT 0 1`` or ``UPDATE 3``.

    Raises:
        ValueError: the status has no row count (e.g. ``BEGIN``) or an unknown shape.
    """
    m = _STATUS.fullmatch(status)
    if m is None:
        raise ValueError(f"command status without a row count: {status!r}")
    return int(m.group(1))


def translate(exc: BaseException, *, tenant_id: uuid.UUID | None = None) -> BaseException:
    """Map a database or connection error to agentdb's hierarchy.

    ``tenant_id``: the tenant the statement was given (see
    :func:`agentdb._db.errormap.error_for`). Unknown database errors come back
    unchanged: agentdb never hides what it does not understand.
    """
    if isinstance(exc, AgentDBError):
        return exc
    if isinstance(exc, asyncpg.InvalidCachedStatementError):
        return TransientError(
            "a cached statement was invalidated by a schema change", sqlstate=exc.sqlstate
        )
    if isinstance(exc, asyncpg.PostgresError):
        # asyncpg's own (client-side) errors carry no server message.
        message = str(getattr(exc, "message", None) or exc)
        constraint = getattr(exc, "constraint_name", None)
        sqlstate = exc.sqlstate or ""
        if constraint is None and sqlstate.startswith("23"):
            found = _CITUS_CONSTRAINT.search(message)
            constraint = found.group(1) if found else None
        mapped = error_for(sqlstate, constraint, message, tenant_id=tenant_id)
        return exc if mapped is None else mapped
    if isinstance(exc, (asyncpg.ConnectionDoesNotExistError, ConnectionError, TimeoutError)):
        return TransientError(f"lost the database connection: {exc}")
    return exc


def _tenant_of(params: dict[str, Any]) -> uuid.UUID | None:
    tenant = params.get("tenant_id")
    return tenant if isinstance(tenant, uuid.UUID) else None


def _reraise(exc: BaseException, db: Executor, tenant_id: uuid.UUID | None = None) -> NoReturn:
    mapped = translate(exc, tenant_id=tenant_id)
    # asyncpg reports use of a connection it already saw die as a plain
    # InterfaceError - or, when the server's goodbye (pg_terminate_backend, a
    # failover) arrived while the connection sat idle, as an InternalClientError
    # ("cannot switch to state ..."; seen on Citus); ask the connection rather
    # than read the message.
    if (
        mapped is exc
        and isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError)
        and not isinstance(db, asyncpg.Pool)
        and db.is_closed()
    ):
        mapped = TransientError(f"lost the database connection: {exc}")
    if mapped is exc:
        raise exc
    raise mapped from exc


def _expect(q: Query, cardinality: str) -> None:
    if q.cardinality != cardinality:
        raise StatementBug(f"{q.name} is declared {q.cardinality}, not {cardinality}")


async def _rows(db: Executor, q: Query, params: dict[str, Any]) -> list[Record]:
    args = q.bind(params)
    try:
        return await db.fetch(q.sql, *args)
    except Exception as exc:
        _reraise(exc, db, _tenant_of(params))


async def fetch_many(db: Executor, q: Query, /, **params: Any) -> list[Record]:
    """Run a ``:many`` statement and return its rows.

    Raises:
        TypeError: a parameter is missing or unknown (see :meth:`Query.bind`).
        mapped database errors (:func:`translate`).
    """
    _expect(q, ":many")
    return await _rows(db, q, params)


async def fetch_optional(db: Executor, q: Query, /, **params: Any) -> Record | None:
    """Run a ``:one`` statement: its row, or ``None`` when it matched nothing.

    Zero rows means what the statement's ``zero rows`` header says; the caller
    turns it into the typed error (see :mod:`agentdb._explain`).

    Raises:
        StatementBug: more than one row came back.
        mapped database errors (:func:`translate`).
    """
    _expect(q, ":one")
    rows = await _rows(db, q, params)
    if len(rows) == 1:
        row: Record = rows[0]
        return row
    if rows:
        raise StatementBug(f"{q.name} is declared :one but returned {len(rows)} rows")
    return None


async def fetch_one(db: Executor, q: Query, /, **params: Any) -> Record:
    """Run a ``:one`` statement whose header says zero rows never happen.

    Raises:
        StatementBug: it returned no row, or more than one.
        mapped database errors (:func:`translate`).
    """
    row = await fetch_optional(db, q, **params)
    if row is None:
        raise StatementBug(f"{q.name} returned no row ({q.zero_rows})")
    return row


def by_ord(rows: list[Record], q: Query, size: int) -> dict[int, Record]:
    """The rows of a batch statement by their 1-based ``ord``: at most one per input element.

    Raises:
        StatementBug: two rows answer one element, or a row answers none.
    """
    found: dict[int, Record] = {}
    for row in rows:
        n: int = row["ord"]
        if n in found or not 1 <= n <= size:
            raise StatementBug(f"{q.name} answered element {n} of {size} twice or out of range")
        found[n] = row
    return found


async def execute_rows(db: Executor, q: Query, /, **params: Any) -> int:
    """Run an ``:execrows`` statement and return how many rows it touched."""
    _expect(q, ":execrows")
    args = q.bind(params)
    try:
        status = await db.execute(q.sql, *args)
    except Exception as exc:
        _reraise(exc, db, _tenant_of(params))
    return parse_status(status)


async def execute_each(db: Executor, q: Query, rows: list[dict[str, Any]]) -> None:
    """Run an ``:execrows`` statement once per element of ``rows``, in one round trip.

    For Citus: one single-row statement per row routes to one shard each,
    where one multi-row ``INSERT ... SELECT`` would be copied through the
    coordinator and commit with two-phase commit.

    Raises:
        TypeError: a parameter is missing or unknown (see :meth:`Query.bind`).
        mapped database errors (:func:`translate`).
    """
    _expect(q, ":execrows")
    if not rows:
        return
    args = [q.bind(r) for r in rows]
    try:
        await db.executemany(q.sql, args)
    except Exception as exc:
        tenants = {_tenant_of(r) for r in rows}
        _reraise(exc, db, tenants.pop() if len(tenants) == 1 else None)


def is_pool(db: Executor) -> TypeGuard[Pool]:
    """Whether ``db`` is a pool (it acquires a connection per statement)."""
    return isinstance(db, asyncpg.Pool)


def raw_connection(conn: Conn) -> asyncpg.Connection[Any]:
    """The connection under a pool's proxy (the proxy is new on every acquire)."""
    if isinstance(conn, PoolConnectionProxy):
        raw: asyncpg.Connection[Any] = conn._con  # type: ignore[attr-defined]  # unexported
        return raw
    return conn


def connection(db: Executor) -> AbstractAsyncContextManager[Conn]:
    """A connection from ``db``: acquired from a pool (and released), or ``db`` itself."""
    if isinstance(db, asyncpg.Pool):
        return db.acquire()
    return nullcontext(db)


@asynccontextmanager
async def transaction(db: Executor) -> AsyncIterator[Conn]:
    """A transaction on a connection from ``db``; commits when the block ends, else rolls back.

    On a connection already inside a transaction this is a savepoint.

    Raises:
        TransientError: the connection was lost (the server rolled the
            transaction back; a lost COMMIT's outcome is unknown).
        whatever the block raises.
    """
    async with connection(db) as conn:
        try:
            async with conn.transaction():
                yield conn
        except asyncpg.InterfaceError as exc:
            # Ending the transaction on a connection that died in the block: what
            # the block raised (already mapped) is the error, not asyncpg's
            # complaint about the closed connection.
            lost = exc.__context__
            if lost is not None and raw_connection(conn).is_closed():
                raise lost from None
            _reraise(exc, conn)
