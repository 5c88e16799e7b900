"""Every runtime statement prepares against the schema with the parameters its header declares."""

from __future__ import annotations

import dataclasses
import re

import asyncpg
import pytest

from agentdb import _db
from agentdb.models import Operation, OutboxMessage, Task


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


def _named(name: str) -> str:
    """A statement's SQL with each ``$n`` replaced by its parameter's name (``$tenant_id``):
    twins that number their parameters differently compare equal."""
    q = _db.QUERIES[name]
    names = {p.position: p.name for p in q.params}
    return re.sub(r"\$(\d+)\b", lambda m: "$" + names[int(m.group(1))], q.sql)


def _assignments(name: str) -> list[str]:
    """The SET list of a statement's UPDATE, one assignment per line, spaces squeezed."""
    sql = _named(name)
    body = sql[sql.index("SET ") + 4 :]
    end = min(i for i in (body.find("\nFROM "), body.find("\n    FROM "), body.find("WHERE "))
              if i >= 0)  # fmt: skip
    lines = [" ".join(line.split()) for line in body[:end].splitlines()]
    return [line for line in lines if line]


@pytest.mark.parametrize(
    ("routed", "plain", "differs"),
    [
        # Citus refuses now() inside CASE: the routed form reads "now" once, in prior.
        ("routed_transition", "task_transition", ("THEN coalesce($wake_at, ",)),
        ("routed_operation_settle", "operation_settle", ()),
        # Citus refuses now() inside COALESCE: the routed form takes greatest().
        ("routed_release", "lease_release", ("wake_at = ",)),
    ],
)
def test_each_routed_update_sets_what_its_plain_twin_sets(
    routed: str, plain: str, differs: tuple[str, ...]
) -> None:
    """The Citus forms (queries/_routed.sql) write the same columns the same way."""
    mine = [a for a in _assignments(routed) if not (differs and a.startswith(differs))]
    theirs = [a for a in _assignments(plain) if not (differs and a.startswith(differs))]
    assert len(theirs) >= 5  # the whole SET list was read, not an empty prefix
    assert mine == theirs


def _task_insert(name: str) -> str:
    sql = _named(name)
    start = sql.index("INSERT INTO agent_tasks")
    end = sql.index("DO NOTHING", start)
    return " ".join(sql[start:end].split())


def test_the_routed_task_insert_is_task_create_s_insert() -> None:
    """routed_task_insert is task_create's INSERT alone (Citus plans a WITH ... INSERT as a
    COPY, which row-level security refuses): the two must insert the same way."""
    assert _task_insert("routed_task_insert") == _task_insert("task_create")
    assert "coalesce($wake_at," in _task_insert("task_create")  # the whole INSERT was read
