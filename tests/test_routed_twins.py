"""Every Citus statement against its single-node twin, from one table.

On a distributed schema the runtime runs the per-tenant statements of
``agentdb/_citus/queries/routed.sql`` instead of its one-statement forms
(:mod:`agentdb._citus.routing`). Each routed statement is the whole or a part
of a single-node statement, and must keep what that one keeps:

* **guards** - the fences and rules a write or a read applies (the lease,
  the version, the state it moves from, what makes a task due ...), named
  here as the text both statements carry (comments, casts and table aliases
  left out, ``$n`` read as its parameter's name);
* **columns** - an UPDATE sets what its twin sets, the same way; an INSERT
  inserts the columns its twin's part inserts; a statement that returns rows
  returns its twin's columns, plus the ones it needs to write what its twin
  wrote in the same statement (an event's workflow version, a claim's
  previous state);
* **the tenant** - a write names ``tenant_id = $tenant_id``, so Citus routes it
  whole to one worker.

And every single-node form in the library that gives way to a routed one
does so with the same signature (:data:`agentdb._citus.routing.TWINS`).
"""

from __future__ import annotations

import inspect
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from agentdb import _db
from agentdb._citus import routing

# The modules whose single-node forms have routed twins: imported, they register them.
from agentdb import budgets, leases, operations, outbox, tasks, tenancy  # noqa: F401  isort: skip


@dataclass(frozen=True)
class Twin:
    """A routed statement, the single-node statement it stands in for, and what they share."""

    routed: str
    single: str
    guards: tuple[str, ...]
    # What is compared besides the guards: "sets" (the SET list of the UPDATE of
    # `table`), "inserts" (the column list of the INSERT INTO `table`), or "" (a
    # discovery read or a lock, which has only its guards).
    compare: str = ""
    table: str = ""
    # Whether it returns its twin's result columns (a part of a statement that
    # returns something else - a budget's hold inside a reservation - does not).
    rows: bool = False
    # SET assignments that differ on purpose (their starts), with the reason in a comment.
    differs: tuple[str, ...] = ()


_DUE = ("attempts < max_attempts", "deadline_at IS NULL", "deadline_at > now()")
_EXHAUSTED = (
    "attempts >= max_attempts",
    "state = 'running' AND lease_expires_at <= now()",
    "wake_at <= now()",
)
_LATE = (
    "deadline_at <= now()",
    "deadline_at IS NOT NULL",
    "state IN ('pending', 'waiting', 'running')",
)

TWINS: tuple[Twin, ...] = (
    # ---- budgets (G19) ---------------------------------------------------------------------
    Twin(
        "routed_budget_hold",
        "operation_reserve",
        ("unit = unit", "task_id IS NULL OR task_id = $task_id"),
        "sets",
        "agent_budgets",
    ),
    Twin("routed_budget_hold_row", "budget_hold", (), "inserts", "agent_budget_holds"),
    Twin(
        "routed_budget_lock",
        "operation_reserve",
        ("task_id IS NULL OR task_id = $task_id", "tenant_id = $tenant_id"),
    ),
    Twin(
        "routed_budget_settle",
        "operation_settle",
        ("spent + settled", "held - amount"),
        "sets",
        "agent_budgets",
    ),
    Twin(
        "routed_budget_settle_holds",
        "operation_settle",
        ("state = 'held'", "unit = unit", "operation_id ="),
        "sets",
        "agent_budget_holds",
        # The routed form runs after the operation's UPDATE committed its state in this
        # transaction: it is passed the new state; the one statement reads it from the row.
        differs=("state = CASE WHEN", "settled = CASE WHEN"),
    ),
    # ---- the sweeps (G6, G21) ---------------------------------------------------------------
    Twin(
        "routed_bury",
        "lease_bury_exhausted",
        (*_EXHAUSTED, "FOR UPDATE SKIP LOCKED"),
        "sets",
        "agent_tasks",
        rows=True,
    ),
    Twin("routed_exhausted_tenants", "lease_bury_exhausted", _EXHAUSTED),
    Twin(
        "routed_expire_deadlines",
        "lease_expire_deadlines",
        (*_LATE, "FOR UPDATE SKIP LOCKED"),
        "sets",
        "agent_tasks",
        rows=True,
    ),
    Twin("routed_deadline_tenants", "lease_expire_deadlines", _LATE),
    # ---- the claim (G18, G12) ---------------------------------------------------------------
    Twin(
        "routed_claim",
        "lease_claim",
        (
            *_DUE,
            "max_running IS NOT NULL",
            "state = 'running'",
            "lease_expires_at <= now()",
            "wake_at <= now()",
            "$task_types IS NULL OR task_type = ANY ($task_types)",
            "FOR UPDATE SKIP LOCKED",
            "lease_token = lease_token + 1",
        ),
        "sets",
        "agent_tasks",
        rows=True,
    ),
    Twin(
        "routed_due_tenants",
        "lease_claim",
        (
            *_DUE,
            "lease_expires_at <= now()",
            "wake_at <= now()",
            "$task_types IS NULL OR task_type = ANY ($task_types)",
        ),
    ),
    Twin(
        "routed_release",
        "lease_release",
        ("lease_owner = $lease_owner AND lease_token = $lease_token", "id = $id"),
        "sets",
        "agent_tasks",
        rows=True,
        # Citus refuses now() inside COALESCE: the routed form takes greatest().
        differs=("wake_at = ",),
    ),
    # ---- tasks (G3, G4, G7, G12) ------------------------------------------------------------
    Twin(
        "routed_task_insert",
        "task_create",
        (
            "ON CONFLICT (tenant_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING",
            # Citus plans a WITH ... INSERT as a COPY, which row-level security refuses: the
            # routed form is task_create's INSERT alone, its values made the same way.
            "coalesce($wake_at, CASE WHEN $state = 'waiting' THEN 'infinity' ELSE now() END)",
        ),
        "inserts",
        "agent_tasks",
        rows=True,
    ),
    Twin("routed_task_by_key", "task_create", ("dedupe_key = $dedupe_key",), rows=True),
    Twin(
        "routed_transition",
        "task_transition",
        (
            "state_version = $expected_version",
            "lease_owner = $lease_owner",
            "lease_token = $lease_token",
            "$lease_owner IS NULL",
            "id = $id",
        ),
        "sets",
        "agent_tasks",
        rows=True,
        # Citus refuses now() inside CASE: the routed form reads "now" once, in prior.
        differs=("wake_at = ",),
    ),
    Twin("routed_task_event", "task_transition", (), "inserts", "agent_events"),
    # ---- operations (G3, G4, G7, G12, G13) --------------------------------------------------
    Twin(
        "routed_operation_fence",
        "operation_reserve",
        (
            "lease_owner = $lease_owner",
            "lease_token = $lease_token",
            "$lease_owner IS NULL",
            "id = $task_id",
            "FOR SHARE",
        ),
    ),
    Twin(
        "routed_operation_insert",
        "operation_reserve",
        ("ON CONFLICT (tenant_id, idempotency_key) DO NOTHING",),
        "inserts",
        "agent_operations",
        rows=True,
    ),
    Twin(
        "routed_operation_by_key",
        "operation_reserve",
        ("idempotency_key = $idempotency_key",),
        rows=True,
    ),
    Twin("routed_operation_event", "operation_reserve", (), "inserts", "agent_events"),
    Twin(
        "routed_operation_settle",
        "operation_settle",
        (
            "state_version = $expected_version",
            "array_position($from_states, state) IS NOT NULL",
            "lease_owner = $lease_owner AND lease_token = $lease_token",
            "$lease_owner IS NULL",
            "id = $id",
        ),
        "sets",
        "agent_operations",
        rows=True,
    ),
    Twin(
        "routed_task_retry",
        "task_retry",
        ("state IN ('failed', 'dead')", "state_version = $expected_version", "id = $id"),
        "sets",
        "agent_tasks",
        rows=True,
    ),
    # ---- tenant names (G2): unique in agent_tenant_names on Citus -------------------------
    Twin("routed_tenant_insert", "tenant_create", (), "inserts", "agent_tenants", rows=True),
    Twin("routed_tenant_by_id", "tenant_create", (), rows=True),
    Twin("routed_tenant_name_claim", "tenant_create", ("ON CONFLICT (name) DO NOTHING",)),
    Twin("routed_tenant_name_holder", "tenant_create", ()),
    Twin("routed_tenant_name_take", "tenant_create", ()),
    # ---- the outbox (G10, G11) --------------------------------------------------------------
    Twin(
        "routed_outbox_claim",
        "outbox_claim",
        (
            "state = 'pending' AND next_attempt_at <= now()",
            "attempts >= max_attempts",
            "FOR UPDATE SKIP LOCKED",
            "lease_token = CASE WHEN exhausted THEN lease_token ELSE lease_token + 1 END",
        ),
        "sets",
        "agent_outbox",
        rows=True,
    ),
    Twin(
        "routed_outbox_due_tenants",
        "outbox_claim",
        ("state = 'pending'", "next_attempt_at <= now()"),
    ),
    Twin(
        "routed_outbox_retry",
        "outbox_retry",
        ("state = 'dead'", "id = $id"),
        "sets",
        "agent_outbox",
        rows=True,
    ),
    Twin(
        "routed_outbox_delivered",
        "outbox_mark_delivered",
        ("lease_token = lease_token", "state NOT IN ('delivered', 'dead')"),
        "sets",
        "agent_outbox",
        rows=True,
    ),
)

# Result columns a routed form returns beyond its twin's, to write what its twin
# wrote in the same statement (an event, a message), by statement.
_EXTRA: dict[str, frozenset[str]] = {
    "routed_claim": frozenset({"from_state", "ord"}),
    "routed_operation_settle": frozenset({"policy_version"}),
    "routed_task_retry": frozenset({"from_state", "prior_attempts"}),
    "routed_outbox_retry": frozenset(
        {"task_id", "trace_id", "span_id", "prior_attempts", "policy_version"}
    ),
    "routed_release": frozenset({"tenant_id", "id", "workflow_version", "trace_id", "span_id"}),
    "routed_bury": frozenset(
        {
            "attempts",
            "from_state",
            "span_id",
            "state",
            "state_version",
            "trace_id",
            "workflow_version",
        }
    ),
    "routed_expire_deadlines": frozenset(
        {
            "deadline",
            "from_state",
            "holder",
            "span_id",
            "state",
            "state_version",
            "trace_id",
            "workflow_version",
        }
    ),
}


# Routed statements that are one call of a function Citus delegates to the tenant's
# node (0021.delegated_writes): the function's body holds the statement, its
# parameters in the call's order, and is what is held against the twin.
_DELEGATED = {
    "routed_claim": "agentdb_routed_claim",
    "routed_transition": "agentdb_routed_transition",
}
_SCHEMA = Path(__file__).resolve().parent.parent / "sql" / "schema.sql"


def _body(routine: str) -> str:
    """The body of ``routine`` as sql/schema.sql (the current state) defines it."""
    text = _SCHEMA.read_text(encoding="utf-8")
    start = text.index(f"CREATE OR REPLACE FUNCTION {routine}(")
    body = text.index("AS $function$", start) + len("AS $function$")
    return text[body : text.index("$function$;", body)]


def _named(name: str) -> str:
    """A statement's SQL with each ``$n`` replaced by its parameter's name (``$tenant_id``):
    twins that number their parameters differently compare equal."""
    q = _db.QUERIES[name]
    names = {p.position: p.name for p in q.params}
    sql = _body(_DELEGATED[name]) if name in _DELEGATED else q.sql
    return re.sub(r"\$(\d+)\b", lambda m: "$" + names[int(m.group(1))], sql)


def _plain(sql: str) -> str:
    """Comments, casts and table aliases left out, whitespace squeezed."""
    sql = re.sub(r"--[^\n]*", "", sql)
    sql = re.sub(r"::[a-z0-9_]+(\[\])?", "", sql)
    sql = re.sub(r"\b[a-z]\w*\.(?=[a-z_])", "", sql)
    return " ".join(sql.split())


def _assignments(name: str, table: str) -> list[str]:
    """The SET list of the statement's UPDATE of ``table``, one assignment each (split at
    the commas that start one: ``, column =``)."""
    sql = _named(name)
    body = sql[sql.index("SET ", sql.index(f"UPDATE {table}")) + 4 :]
    ends = [
        i for i in (body.find("\nFROM"), body.find("\n    FROM "), body.find("WHERE ")) if i >= 0
    ]
    return re.split(r",\s+(?=[a-z_]+ = )", _plain(body[: min(ends)]))


def _inserted(name: str, table: str) -> list[list[str]]:
    """The column list of each INSERT INTO ``table`` in the statement."""
    found = re.findall(rf"INSERT INTO {table}\s*\(([^)]*)\)", _named(name))
    return [[c.strip() for c in cols.split(",")] for cols in found]


def test_every_routed_statement_is_in_the_table() -> None:
    routed = {n for n in _db.queries("agentdb._citus.routed")}
    assert routed == {t.routed for t in TWINS}
    assert len(TWINS) == len({t.routed for t in TWINS})


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.routed)
def test_the_routed_statement_keeps_its_twins_guards(twin: Twin) -> None:
    mine, theirs = _plain(_named(twin.routed)), _plain(_named(twin.single))
    for guard in twin.guards:
        assert guard in mine, f"{twin.routed} lacks {guard!r}"
        assert guard in theirs, f"{twin.single} lacks {guard!r} (the table is wrong)"
    # A write names the tenant, so Citus routes it to one worker.
    if any(p.name == "tenant_id" for p in _db.QUERIES[twin.routed].params):
        names = "tenant_id = $tenant_id" in mine or re.search(r"VALUES \([^)]*\$tenant_id", mine)
        assert names, twin.routed


@pytest.mark.parametrize("twin", [t for t in TWINS if t.compare == "sets"], ids=lambda t: t.routed)
def test_the_routed_update_sets_what_its_twin_sets(twin: Twin) -> None:
    def kept(name: str) -> list[str]:
        return [
            a for a in _assignments(name, twin.table) if not a.startswith(twin.differs or ("\0",))
        ]

    assert len(_assignments(twin.single, twin.table)) >= 2  # a whole SET list was read
    assert kept(twin.routed) == kept(twin.single)


@pytest.mark.parametrize(
    "twin", [t for t in TWINS if t.compare == "inserts"], ids=lambda t: t.routed
)
def test_the_routed_insert_inserts_what_its_twin_inserts(twin: Twin) -> None:
    [mine] = _inserted(twin.routed, twin.table)
    assert mine in _inserted(twin.single, twin.table)


@pytest.mark.parametrize("twin", [t for t in TWINS if t.rows], ids=lambda t: t.routed)
async def test_the_routed_statement_returns_its_twins_columns(
    twin: Twin, runtime_conn: asyncpg.Connection
) -> None:
    """The routed form returns every column its twin returns (the caller reads the same
    row either way), and only the extras it needs to write what its twin wrote."""

    async def columns(name: str) -> set[str]:
        stmt = await runtime_conn.prepare(_db.QUERIES[name].sql)
        return {a.name for a in stmt.get_attributes()}

    expected = await columns(twin.single) | _EXTRA.get(twin.routed, frozenset())
    assert await columns(twin.routed) == expected


def test_every_single_node_form_and_its_routed_twin_take_the_same_arguments() -> None:
    assert len(routing.TWINS) >= 14
    for name, (single, routed) in routing.TWINS.items():
        a, b = inspect.signature(single), inspect.signature(routed)
        assert list(a.parameters)[1:] == list(b.parameters)[1:], name
        assert [p.kind for p in a.parameters.values()] == [p.kind for p in b.parameters.values()], (
            name
        )
        assert a.return_annotation == b.return_annotation, name


async def test_a_create_through_the_routed_form_takes_what_tasks_create_gives_it(
    pool: asyncpg.Pool, agentdb_tenant: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tasks.create hands its routed form task_create's parameters - ``wake_after``, the
    single-node create's NOTIFY switch that Citus has no trigger for, included. Run on
    plain Postgres (the routed statements run here too) by answering "distributed"."""

    async def distributed(db: object) -> bool:
        return True

    monkeypatch.setattr(routing, "distributed", distributed)
    monkeypatch.setattr(tasks, "distributed", distributed)
    first = await tasks.create(pool, agentdb_tenant, "t", dedupe_key="k")
    again = await tasks.create(pool, agentdb_tenant, "t", dedupe_key="k")
    assert first.created
    assert not again.created
    assert again.id == first.id
