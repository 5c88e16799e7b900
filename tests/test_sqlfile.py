"""The statement loader refuses malformed files at import; the status parser is strict."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentdb import _db
from agentdb._db import execute
from agentdb._db.sqlfile import QueryFileError, parse

GOOD = """-- name: thing_get :one
-- Read a thing.
-- guarantee: G2
-- zero rows: no such thing.
-- params: $1 tenant_id uuid, $2 id uuid
SELECT 1 FROM t WHERE tenant_id = $1 AND id = $2;
"""


def test_a_well_formed_statement_parses() -> None:
    [q] = parse(GOOD, "t.sql")
    assert (q.name, q.cardinality, q.guarantees, q.zero_rows) == (
        "thing_get",
        ":one",
        ("G2",),
        "no such thing.",
    )
    assert [p.name for p in q.params] == ["tenant_id", "id"]
    assert q.sql.endswith("id = $2")


@pytest.mark.parametrize(
    ("mutation", "complaint"),
    [
        (("thing_get :one", "thing_get :single"), "unknown cardinality"),
        (("thing_get :one", "thing_get"), "expected '-- name"),
        (("-- zero rows: no such thing.\n", ""), "must say what zero rows means"),
        (("-- guarantee: G2\n", ""), "guarantee"),
        (("-- params: $1 tenant_id uuid, $2 id uuid", "-- params: $1 tenant_id uuid"), "uses $2"),
        (("$2 id uuid", "$3 id uuid"), "malformed params"),
        (("-- params: $1 tenant_id uuid, $2 id uuid\n", ""), "missing '-- params:'"),
    ],
)
def test_malformed_headers_are_refused(mutation: tuple[str, str], complaint: str) -> None:
    with pytest.raises(QueryFileError, match=re.escape(complaint)):
        parse(GOOD.replace(*mutation), "t.sql")


def test_duplicate_names_are_refused(tmp_path: object) -> None:
    from pathlib import Path

    from agentdb._db.sqlfile import load

    folder = Path(str(tmp_path))
    (folder / "a.sql").write_text(GOOD)
    (folder / "b.sql").write_text(GOOD)
    with pytest.raises(QueryFileError, match="duplicate statement name thing_get"):
        load(folder)


def test_shipped_statements_all_declare_a_guarantee_and_cardinality() -> None:
    assert len(_db.QUERIES) >= 15
    for q in _db.QUERIES.values():
        read_only = ("status_", "schema_", "routing_", "task_count")  # diagnostics
        hints = ("task_wake_listeners",)  # a NOTIFY: listeners poll anyway
        assert q.guarantees or q.name.startswith(read_only + hints), q.name
        assert q.doc, q.name


@given(st.sampled_from(["INSERT 0", "UPDATE", "DELETE", "SELECT", "MERGE"]), st.integers(0, 10**9))
def test_status_parser_reads_counts(command: str, count: int) -> None:
    assert execute.parse_status(f"{command} {count}") == count


@given(st.text(max_size=30))
def test_status_parser_refuses_anything_else(status: str) -> None:
    if re.fullmatch(r"(INSERT \d+|UPDATE|DELETE|SELECT|MERGE|COPY|FETCH|MOVE) \d+", status):
        return
    with pytest.raises(ValueError, match="without a row count"):
        execute.parse_status(status)


@pytest.mark.parametrize("status", ["BEGIN", "COMMIT", "INSERT 0", "UPDATE one", "update 1", ""])
def test_status_parser_refuses_known_shapes_without_counts(status: str) -> None:
    with pytest.raises(ValueError, match="without a row count"):
        execute.parse_status(status)
