"""The driver layer: the only package that imports asyncpg.

Everything that runs SQL goes through here: the static statements of
``agentdb/queries`` (loaded once, each file read by the module of the same
name), the executor that binds parameters by name, checks the declared row
count and maps errors (:mod:`agentdb._db.execute`), the connection and pool
factory (:mod:`agentdb._db.pool`) and the LISTEN connection
(:mod:`agentdb._db.listen`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from agentdb._db.execute import (
    Conn,
    Executor,
    Pool,
    Record,
    StatementBug,
    by_ord,
    connection,
    execute_each,
    execute_rows,
    fetch_many,
    fetch_one,
    fetch_optional,
    is_pool,
    raw_connection,
    transaction,
    translate,
)
from agentdb._db.pool import connect, create_pool
from agentdb._db.sqlfile import Query, load

__all__ = [
    "QUERIES",
    "Conn",
    "Executor",
    "Pool",
    "Query",
    "Record",
    "StatementBug",
    "by_ord",
    "connect",
    "connection",
    "create_pool",
    "execute_each",
    "execute_rows",
    "fetch_many",
    "fetch_one",
    "fetch_optional",
    "is_pool",
    "queries",
    "raw_connection",
    "transaction",
    "translate",
]

_PACKAGE = Path(__file__).resolve().parent.parent
# The Citus path keeps its statements in its own package (agentdb/_citus/queries), and
# this package the few its pool runs on a new connection (agentdb/_db/queries).
_FILES = load(_PACKAGE / "queries", _PACKAGE / "_citus" / "queries", _PACKAGE / "_db" / "queries")
#: Every statement, by name (for tools and tests; library modules use :func:`queries`).
QUERIES: Mapping[str, Query] = MappingProxyType(
    {name: q for found in _FILES.values() for name, q in found.items()}
)


def queries(module: str) -> Mapping[str, Query]:
    """The statements of ``queries/<stem>.sql`` for the module named ``module``.

    A module runs only the statements of the file named after it
    (``agentdb.tasks`` -> ``queries/tasks.sql``; ``agentdb._citus.routed`` ->
    ``_citus/queries/routed.sql``), so the file a reader opens next to a module
    holds exactly what that module runs.

    Raises:
        KeyError: there is no such file.
    """
    return MappingProxyType(_FILES[module.rsplit(".", 1)[-1]])
