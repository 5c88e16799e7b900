"""The functions frequent statements call are PL/pgSQL, not SQL.

Every agentdb function is pinned to its schema's search_path, and PostgreSQL
never inlines a SQL function with a SET clause: each statement that calls
one parses and plans its body again (about 190 us per event insert for the
G9 secret check, measured when it was SQL). A PL/pgSQL function keeps its plans
for the session. These tests find, in the catalogue, every function that a
CHECK of a table the task cycle writes, a row-level policy or a runtime
statement calls, and refuse a SQL one among them.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

QUERIES = Path(__file__).resolve().parents[1] / "agentdb" / "queries"

# The tables each task cycle writes (claim, reserve, complete, finish, relay).
CYCLE_TABLES = ("agent_tasks", "agent_operations", "agent_events", "agent_outbox")

# Read once when a worker or relay starts, a constant: planning it is no cost.
COLD = {"agentdb_schema_version"}

_CALL = re.compile(r"\b(agentdb_[a-z0-9_]+)\s*\(")


async def _sql_functions(conn: asyncpg.Connection) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT p.proname, l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'agentdb%'"
    )
    return {r["proname"]: r["lanname"] for r in rows}


async def _called_by_checks_and_policies(conn: asyncpg.Connection) -> set[str]:
    texts = await conn.fetch(
        "SELECT pg_get_constraintdef(c.oid) AS t FROM pg_constraint c"
        " WHERE c.contype = 'c' AND c.conrelid = ANY($1::regclass[])"
        " UNION ALL SELECT coalesce(qual, '') || ' ' || coalesce(with_check, '') FROM pg_policies"
        " WHERE schemaname = current_schema()",
        list(CYCLE_TABLES),
    )
    return {name for r in texts for name in _CALL.findall(r["t"])}


def _called_by_statements() -> set[str]:
    return {name for f in QUERIES.glob("*.sql") for name in _CALL.findall(f.read_text())}


async def test_the_functions_hot_statements_call_are_plpgsql(
    admin_conn: asyncpg.Connection,
) -> None:
    languages = await _sql_functions(admin_conn)
    called = (await _called_by_checks_and_policies(admin_conn)) | _called_by_statements()
    called &= set(languages)  # what the statements call, not what they define
    # The checks and policies do call functions: the search is not empty by accident.
    expected = {"agentdb_jsonb_has_secrets", "agentdb_current_tenant", "agentdb_running_count"}
    assert expected <= called
    sql = sorted(f for f in called - COLD if languages[f] == "sql")
    assert sql == [], f"SQL functions a frequent statement calls (make them PL/pgSQL): {sql}"


async def test_the_fan_in_count_is_plpgsql(admin_conn: asyncpg.Connection) -> None:
    # G23: called by the trigger every finishing child fires.
    languages = await _sql_functions(admin_conn)
    assert languages["agentdb_children_done"] == "plpgsql"


async def test_G9_an_erased_payload_has_no_secret(admin_conn: asyncpg.Connection) -> None:
    # The retention job erases payloads to NULL; the CHECK must keep accepting those rows.
    assert await admin_conn.fetchval("SELECT agentdb_jsonb_has_secrets(NULL)") is False
    assert await admin_conn.fetchval("""SELECT agentdb_jsonb_has_secrets('{"n": 1}')""") is False
    assert (
        await admin_conn.fetchval("""SELECT agentdb_jsonb_has_secrets('{"password": "x"}')""")
        is True
    )


async def test_hot_functions_stay_pinned_to_their_schema(admin_conn: asyncpg.Connection) -> None:
    # CREATE OR REPLACE drops SET clauses: every migration pins the search paths again.
    rows = await admin_conn.fetch(
        "SELECT p.proname, p.proconfig FROM pg_proc p"
        " WHERE p.pronamespace = current_schema()::regnamespace AND p.proname = ANY($1::text[])",
        [
            "agentdb_jsonb_has_secrets",
            "agentdb_current_tenant",
            "agentdb_running_count",
            "agentdb_children_done",
        ],
    )
    assert len(rows) == 4
    for r in rows:
        assert any(c.startswith("search_path=") for c in r["proconfig"] or []), r["proname"]
