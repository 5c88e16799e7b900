"""Cheaper event writes, the same guarantees (G8, G9).

The secret CHECK runs the function's own prefilter regex inline and calls
agentdb_jsonb_has_secrets only for a payload that matches: the two regex
texts must stay equal, and the CHECK must answer as the function does for
any payload. The merged unique keys still allow one event per version and
any number of events without one.
"""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import factories as F
from tests.conftest import Tenants

_PREFILTER = re.compile(r"!~\*\s*'((?:[^']|'')+)'")

# Fragments that make the prefilter match (or nearly): keys and values the function
# then walks, with and without a real secret.
_NEAR = [
    "password", "passw", "secretary", "api_key", "apikey", "Authorization", "bearer",
    "session_token", "token", "tokens_used", "cookie", "sk-", "sk-abcdefghijklmnopqrstuvwx",
    "AKIAABCDEFGHIJKLMNOP", "ghp_" + "a" * 36, "xoxb-1-2", "eyJhbGciOiJIUzI1.eyJz.sig",
    "[redacted]", "-----BEGIN", "model", "note", "n",
]  # fmt: skip
# Any text jsonb can hold (no NUL, no lone surrogate).
_TEXT = st.characters(exclude_characters="\x00", exclude_categories=["Cs"])
_KEYS = st.one_of(st.sampled_from(_NEAR), st.text(_TEXT, max_size=8))
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from(_NEAR),
    st.text(_TEXT, max_size=12),
)
_DOCS = st.dictionaries(
    _KEYS,
    st.recursive(
        _LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)
        ),
        max_leaves=6,
    ),
    max_size=4,
)


async def _check_text(conn: asyncpg.Connection) -> str:
    text: str = await conn.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'agent_events'::regclass AND conname = 'agent_events_payload_no_secrets'"
    )
    return text


async def test_G9_the_checks_prefilter_is_the_functions_own(admin_conn: asyncpg.Connection) -> None:
    check = _PREFILTER.findall(await _check_text(admin_conn))
    function = _PREFILTER.findall(
        await admin_conn.fetchval("SELECT pg_get_functiondef('agentdb_jsonb_has_secrets'::regproc)")
    )
    assert len(check) == 1, "the CHECK runs one prefilter regex"
    assert function, "the function starts with a prefilter regex"
    assert check == function[:1]


async def test_G9_the_secret_check_is_validated(admin_conn: asyncpg.Connection) -> None:
    """The check is validated: it holds for every row."""
    validated = await admin_conn.fetchval(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'agent_events_payload_no_secrets'"
    )
    assert validated is True


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=_DOCS)
async def test_G9_the_check_answers_as_the_function_for_any_payload(
    admin_conn: asyncpg.Connection, doc: dict[str, Any]
) -> None:
    expression = (await _check_text(admin_conn)).removeprefix("CHECK ")
    row = await admin_conn.fetchrow(
        f"SELECT {expression} AS accepted, NOT agentdb_jsonb_has_secrets(payload) AS clean"  # noqa: S608 - the catalogue's own text
        " FROM (SELECT $1::jsonb AS payload) AS e",
        json.dumps(doc),
    )
    assert row is not None
    assert row["accepted"] == row["clean"], doc


async def test_G8_one_event_per_version_any_number_without_one(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """The merged keys cover every row of a task (and of an operation): events without
    a version share it freely (control), a second event for a version is refused."""
    task = await F.create_task(admin_conn, tenants.a)
    op = await F.create_operation(admin_conn, tenants.a, task)
    async with admin_conn.transaction():
        for _ in range(2):  # no task version, no operation version: both accepted
            await F.event(admin_conn, tenants.a, task, operation_id=op)
    with pytest.raises(asyncpg.UniqueViolationError) as twice:
        await F.event(admin_conn, tenants.a, task, task_state_version=0)
    assert twice.value.constraint_name == "agent_events_task_version_key"
    with pytest.raises(asyncpg.UniqueViolationError) as again:
        await F.event(admin_conn, tenants.a, task, operation_id=op, operation_state_version=0)
    assert again.value.constraint_name == "agent_events_operation_version_key"
