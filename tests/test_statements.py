"""Every runtime statement prepares against the schema with the parameters its header declares."""

from __future__ import annotations

import asyncpg
import pytest

from agentdb import _db


@pytest.mark.parametrize("name", sorted(_db.QUERIES))
async def test_statement_prepares_with_declared_params(
    name: str, runtime_conn: asyncpg.Connection
) -> None:
    q = _db.QUERIES[name]
    stmt = await runtime_conn.prepare(q.sql)
    actual = [t.name for t in stmt.get_parameters()]
    declared = [p.type for p in q.params]
    # Postgres names arrays _uuid, _text...
    actual = [f"{a[1:]}[]" if a.startswith("_") else a for a in actual]
    assert actual == declared, name
