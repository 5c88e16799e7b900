"""The error catalogue, the schema and the attack suite name the same objects.

Constraint, trigger, index and policy names are public API (errors map on
them). These tests fail when one of the three drifts from the others: a
constraint added without a catalogue entry or without an attack, or a
catalogue entry naming something the schema does not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

from agentdb.errors import CONSTRAINTS, SQLSTATES
from agentdb.guarantees import GUARANTEES
from tests import (
    test_access,
    test_attacks,
    test_children,
    test_indexes,
    test_notify,
    test_signals,
)

# Objects Postgres names for us; everything agentdb names itself is below. A partition
# of agent_events carries clones of its parent's objects (names Postgres makes up for
# the indexes): the parent's names are the ones errors and plans are read by.
_SCHEMA_NAMES = """
SELECT c.conname FROM pg_constraint c
  JOIN pg_class r ON r.oid = c.conrelid
 WHERE r.relname LIKE 'agent\\_%' AND c.contype IN ('c', 'f', 'p', 'u', 't')
   AND NOT r.relispartition
UNION
SELECT t.tgname FROM pg_trigger t JOIN pg_class r ON r.oid = t.tgrelid
 WHERE r.relname LIKE 'agent\\_%' AND (NOT t.tgisinternal OR t.tgconstraint <> 0)
   AND t.tgname NOT LIKE 'RI\\_ConstraintTrigger%'
UNION
SELECT i.relname FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_class r ON r.oid = x.indrelid
 WHERE r.relname LIKE 'agent\\_%' AND NOT r.relispartition
   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
UNION
SELECT p.polname FROM pg_policy p
"""

# Raised by name from PL/pgSQL (RAISE ... USING CONSTRAINT), not a catalog object.
_RAISED_NAMES = {"agentdb_tenant_scope"}


async def test_catalogue_matches_the_migrated_schema(admin_conn: asyncpg.Connection) -> None:
    in_schema = {r[0] for r in await admin_conn.fetch(_SCHEMA_NAMES)}
    assert set(CONSTRAINTS) - _RAISED_NAMES == in_schema


async def test_raised_names_appear_in_function_bodies(admin_conn: asyncpg.Connection) -> None:
    for name in _RAISED_NAMES:
        found = await admin_conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'agentdb\\_%' AND prosrc LIKE $1",
            f"%'{name}'%",
        )
        assert found >= 1, name


async def test_agentdb_sqlstates_are_raised_by_the_schema(admin_conn: asyncpg.Connection) -> None:
    bodies = " ".join(
        r[0]
        for r in await admin_conn.fetch(
            "SELECT prosrc FROM pg_proc WHERE proname LIKE 'agentdb\\_%'"
        )
    )
    for code in SQLSTATES:
        assert f"'{code}'" in bodies, code


def test_every_constraint_is_attacked() -> None:
    covered = (
        test_attacks.attacked_names()
        | test_access.POLICY_NAMES
        | set(test_indexes.INDEX_QUERIES)
        | test_notify.NOTIFY_NAMES
        | test_signals.BEHAVIOUR_NAMES
        | test_children.BEHAVIOUR_NAMES
    )
    assert covered == set(CONSTRAINTS)


def test_every_guarantee_in_the_catalogue_is_known() -> None:
    assert set(CONSTRAINTS.values()) - {None} <= set(GUARANTEES)


_PACKAGE = Path(__file__).resolve().parent.parent / "agentdb"


def _quoted_names(package: Path) -> set[str]:
    """Quoted agent_* names in the library (the tools and the testing kit name their own
    demo and recording tables)."""
    return {
        name
        for path in package.rglob("*.py")
        if not {"tools", "testing"} & set(path.relative_to(package).parts)
        for name in re.findall(r"[\"'](agent(?:db)?_[a-z0-9_]+)[\"']", path.read_text())
    }


async def test_every_name_the_code_refers_to_exists(admin_conn: asyncpg.Connection) -> None:
    """Quoted agent_* names in the package are tables or catalogue entries - never stale."""
    tables = {
        r[0]
        for r in await admin_conn.fetch(
            "SELECT relname FROM pg_class"
            " WHERE relname LIKE 'agent\\_%' AND relkind IN ('r', 'p', 'S')"
        )
    }
    functions = {
        r[0]
        for r in await admin_conn.fetch(
            "SELECT proname FROM pg_proc WHERE proname LIKE 'agentdb\\_%'"
        )
    }
    referenced = _quoted_names(_PACKAGE)
    roles = {"agentdb_runtime", "agentdb_agent", "agentdb_operator"}
    channels = {"agentdb_tasks", "agentdb_outbox"}  # the NOTIFY hints' channels
    unknown = referenced - tables - functions - set(CONSTRAINTS) - roles - channels
    assert not unknown
    assert "agent_events_payload_no_secrets" in referenced  # the scan sees the code


def test_public_api_is_small_and_explicit() -> None:
    import agentdb

    assert sorted(agentdb.__all__) == agentdb.__all__
    for name in agentdb.__all__:
        assert hasattr(agentdb, name), name
    assert not [n for n in agentdb.__all__ if n.startswith("_") and n != "__version__"]
