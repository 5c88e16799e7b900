"""The statement loader refuses malformed files at import; the status parser is strict."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentdb import _db
from agentdb._db import execute
from agentdb._db.sqlfile import Param, Query, QueryFileError, load, parse

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
        settings = ("pool_generic_plans",)  # how a session plans, not what it writes
        assert q.guarantees or q.name.startswith(read_only + hints + settings), q.name
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


# Every field a header can carry, in the forms the format allows: a doc line
# without a space after "--" (and a non-ASCII dash, for the file encoding), two
# guarantees, a field continued on a second line, SQL over several lines.
MOVE = """-- name: thing_move :execrows
-- Move a thing
--to another tenant — all of it.
-- guarantee: G2, G7
-- zero rows: no such thing,
-- zero rows: or it moved already.
-- params: $1 tenant_id uuid,
-- params: $2 id uuid, $3 to_tenant uuid
UPDATE t
SET tenant_id = $3
WHERE tenant_id = $1 AND id = $2;
"""
MOVED = Query(
    name="thing_move",
    cardinality=":execrows",
    sql="UPDATE t\nSET tenant_id = $3\nWHERE tenant_id = $1 AND id = $2",
    params=(Param(1, "tenant_id", "uuid"), Param(2, "id", "uuid"), Param(3, "to_tenant", "uuid")),
    guarantees=("G2", "G7"),
    zero_rows="no such thing, or it moved already.",
    doc="Move a thing to another tenant — all of it.",
    source="t.sql",
)
# The other end: no guarantee, no parameters, no zero rows line. Its SQL ends in
# an upper-case X, which checks that only the semicolon is stripped from its end.
COUNT = """-- name: thing_count :many
-- Count things by kind.
-- guarantee: none
-- params: none
SELECT kind AS X, count(*) FROM t GROUP BY X;
"""
COUNTED = Query(
    name="thing_count",
    cardinality=":many",
    sql="SELECT kind AS X, count(*) FROM t GROUP BY X",
    params=(),
    guarantees=(),
    zero_rows="",
    doc="Count things by kind.",
    source="t.sql",
)


@pytest.mark.parametrize(("text", "query"), [(MOVE, MOVED), (COUNT, COUNTED)])
def test_every_header_field_reaches_the_query(text: str, query: Query) -> None:
    """Kills mutmut's _one mutants 17, 18, 23 (header lines taken for SQL or
    skipped), 32, 34-38 (a continued field), 43 (a doc line without a
    space), 48, 49 (SQL text), 67, 114, 119, 120 ("none" guarantees), 90, 92, 95
    (no placeholders), 104, 134 (doc), 105 (source), 122, 125 (two guarantees),
    127, 129, 132 (no zero rows line); _parse_params mutants 2, 3 ("none"), 22, 24
    (position and type); parse mutant 15 (source)."""
    assert parse(text, "t.sql") == [query]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GOOD.replace("thing_get :one", "thing_get"),
            "t.sql: expected '-- name: <name> <:tag>', got '-- name: thing_get'",
        ),
        (
            GOOD.replace("thing_get :one", "thing_get :single"),
            "t.sql:thing_get: unknown cardinality :single",
        ),
        (
            GOOD.replace("SELECT 1 FROM t WHERE tenant_id = $1 AND id = $2;\n", ""),
            "t.sql:thing_get: no SQL after the header",
        ),
        (
            GOOD.replace("-- params: $1 tenant_id uuid, $2 id uuid\n", ""),
            "t.sql:thing_get: missing '-- params:' line (write 'none' if there are none)",
        ),
        (
            GOOD.replace("-- guarantee: G2", "-- guarantee: G2,G3"),
            "t.sql:thing_get: missing or malformed '-- guarantee: G<n>' line",
        ),
        (
            GOOD.replace("-- zero rows: no such thing.\n", ""),
            "t.sql:thing_get: :one statements must say what zero rows means",
        ),
        (
            GOOD.replace(":one", ":execrows").replace("-- zero rows: no such thing.\n", ""),
            "t.sql:thing_get: :execrows statements must say what zero rows means",
        ),
        (
            GOOD.replace("$2 id uuid", "$3 id uuid"),
            "t.sql:thing_get: malformed params entry '$3 id uuid'",
        ),
        (
            GOOD.replace(", $2 id uuid", ""),
            "t.sql:thing_get: SQL uses $2 but params declares 1",
        ),
        ("SELECT 1;\n" + GOOD, "t.sql: SQL before the first '-- name:' header"),
    ],
)
def test_refusals_name_the_file_the_statement_and_the_fault(text: str, message: str) -> None:
    """Kills mutmut's _one mutants 6 (the wrong line quoted), 8 (no statement name),
    13, 51 (a header without SQL), 75, 76 (:execrows without zero rows), 83 (the
    params complaint unnamed); parse mutants 10 and 13 (SQL before the header)."""
    with pytest.raises(QueryFileError) as refused:
        parse(text, "t.sql")
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "preamble", ["-- Things: what they are.\n", "\n", "-- A file note.\n\n--\n"]
)
def test_comments_and_blank_lines_may_precede_the_first_statement(preamble: str) -> None:
    """Kills mutmut's parse mutants 9, 10, 11 and 12 (a blank or comment line before
    the first header refused)."""
    assert [q.name for q in parse(preamble + GOOD, "t.sql")] == ["thing_get"]


def test_load_keys_statements_by_file_stem_and_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills mutmut's load mutants 11 (source lost), 14 (the locale's encoding),
    17 (every name a duplicate), 20 and 21 (statements or files lost)."""
    # The files are UTF-8 whatever the machine's locale (cp1252 on Windows, a C
    # locale Python does not coerce): stand in for such a machine by making
    # Latin-1 the default text encoding pathlib falls back to.
    monkeypatch.setattr(io, "text_encoding", lambda encoding, stacklevel=2: encoding or "latin-1")
    (tmp_path / "things.sql").write_text(GOOD + "\n" + MOVE, encoding="utf-8")
    (tmp_path / "counts.sql").write_text(COUNT, encoding="utf-8")
    (tmp_path / "notes.txt").write_text(COUNT, encoding="utf-8")  # not a statement file
    [good] = parse(GOOD, "things.sql")
    assert load(tmp_path) == {
        "counts": {"thing_count": dataclasses.replace(COUNTED, source="counts.sql")},
        "things": {
            "thing_get": good,
            "thing_move": dataclasses.replace(MOVED, source="things.sql"),
        },
    }


def test_two_statement_files_with_one_stem_are_refused(tmp_path: Path) -> None:
    """Kills mutmut's load mutant 8 (the message replaced by None)."""
    for folder in ("agentdb", "citus"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "things.sql").write_text(GOOD, encoding="utf-8")
    with pytest.raises(QueryFileError) as refused:
        load(tmp_path / "agentdb", tmp_path / "citus")
    assert str(refused.value) == "things.sql: two statement files named things"


def test_bind_orders_values_by_declared_name() -> None:
    """Kills mutmut's Query.bind mutants 1, 2, 5 and 6 (a correct call refused)."""
    [q] = parse(GOOD, "t.sql")
    assert q.bind({"id": "the id", "tenant_id": "the tenant"}) == ("the tenant", "the id")


@pytest.mark.parametrize(
    ("values", "wrong"),
    [
        ({"tenant_id": 1}, "missing parameter(s) ['id'], unknown parameter(s) []"),
        # Every declared name is there: only the count of values shows the extra one.
        (
            {"tenant_id": 1, "id": 2, "ids": 3},
            "missing parameter(s) [], unknown parameter(s) ['ids']",
        ),
        (
            {"tenant_id": 1, "tenant": 2},
            "missing parameter(s) ['id'], unknown parameter(s) ['tenant']",
        ),
    ],
)
def test_bind_refuses_missing_and_unknown_names(values: dict[str, int], wrong: str) -> None:
    """Kills mutmut's Query.bind mutants 3, 4 and 7-15 (the check or its message
    broken)."""
    [q] = parse(GOOD, "t.sql")
    with pytest.raises(TypeError) as refused:
        q.bind(values)
    assert str(refused.value) == f"thing_get: {wrong}"
