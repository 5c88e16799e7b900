"""Every runtime statement prepares against the schema with the parameters its header declares."""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from agentdb import _db
from agentdb.models import Operation, OutboxMessage, Task

# Statements of a table only a distributed schema has (agent_tenant_names: 0013.operator's
# agentdb_distribute); tests/citus prepares them on the cluster.
CITUS_ONLY = frozenset(
    {
        "routed_tenant_name_claim", "routed_tenant_name_holder", "routed_tenant_name_take",
        # citus_stat_activity and pg_dist_node: the citus extension's own views.
        "status_processes_citus",
    }
)  # fmt: skip


@pytest.mark.parametrize("name", sorted(set(_db.QUERIES) - CITUS_ONLY))
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


# Statements whose rows become a model: they return exactly its fields (plus the extras named),
# so "no RETURNING *" cannot drift from the dataclass.
_ROWS: dict[str, tuple[type, tuple[str, ...]]] = {
    "task_create": (Task, ("created",)),
    "task_get": (Task, ()),
    "task_transition": (Task, ()),
    "task_finish_many": (Task, ("ord",)),
    "lease_claim": (Task, ()),
    "operation_get": (Operation, ()),
    "operation_reserve": (Operation, ("created",)),
    "operation_settle": (Operation, ()),
    "operation_list_unsettled": (Operation, ()),
    "operation_reserve_many": (Operation, ("ord", "created")),
    "operation_complete_many": (Operation, ("ord",)),
    "outbox_claim": (OutboxMessage, ("buried",)),
}


@pytest.mark.parametrize("name", sorted(_ROWS))
async def test_row_statements_return_exactly_their_models_fields(
    name: str, runtime_conn: asyncpg.Connection
) -> None:
    model, extras = _ROWS[name]
    stmt = await runtime_conn.prepare(_db.QUERIES[name].sql)
    returned = [a.name for a in stmt.get_attributes()]
    wanted = {f.name for f in dataclasses.fields(model)} - {"created"}
    assert len(returned) == len(set(returned)), name
    assert set(returned) == wanted | set(extras), name
