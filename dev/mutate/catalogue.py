"""The mutants: small, realistic breakages of a guard, each with the tests that must catch it.

Every mutant is one exact edit: ``find`` must occur exactly once in ``path``
and is replaced by ``replace``. ``tests`` are the pytest targets that should
kill it (a fast subset, not the whole suite). A mutant that cannot change
behaviour is declared ``equivalent`` with the reason; it is still applied
and run, so the report shows the claim holds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mutant", "all_mutants", "m"]


@dataclass(frozen=True, slots=True)
class Mutant:
    id: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...]
    what: str
    equivalent: str = ""
    # A mutant of a statement only a distributed schema runs (_citus/queries/routed.sql):
    # its tests run on Citus (make mutate-citus), where they reach it.
    citus: bool = False


T = "tests/"
TASKS_SQL = "agentdb/queries/tasks.sql"
LEASES_SQL = "agentdb/queries/leases.sql"
OPS_SQL = "agentdb/queries/operations.sql"
OUTBOX_SQL = "agentdb/queries/outbox.sql"
# The migrations, one per concept (sql/migrations/): a mutant names the file that
# defines what it edits - each routine, trigger and policy is defined in one.
MIGRATIONS = "sql/migrations/"
M_FOUNDATION = MIGRATIONS + "0001.foundation.sql"
M_TASKS = MIGRATIONS + "0002.tasks.sql"
M_OPERATIONS = MIGRATIONS + "0003.operations.sql"
M_EVENTS = MIGRATIONS + "0004.events.sql"
M_DELIVERY = MIGRATIONS + "0005.delivery.sql"
M_CONTROL_FLOW = MIGRATIONS + "0006.control_flow.sql"
M_SCHEDULES = MIGRATIONS + "0007.schedules.sql"
M_STEPS = MIGRATIONS + "0008.steps.sql"
M_BUDGETS = MIGRATIONS + "0009.budgets.sql"
M_ACCESS = MIGRATIONS + "0010.access.sql"
M_RETENTION = MIGRATIONS + "0011.retention.sql"
M_CITUS = MIGRATIONS + "0012.citus.sql"
M_PARTIAL_KEYS = MIGRATIONS + "0016.partial_keys.sql"
M_WAKE = MIGRATIONS + "0017.wake_after_commit.sql"
M_ROOM = MIGRATIONS + "0018.room_to_update.sql"
ATTACKS = T + "test_attacks.py"
FENCES = T + "test_fences.py"
TENANTS = T + "test_tenant_isolation.py"


def m(
    id: str,
    path: str,
    find: str,
    replace: str,
    tests: tuple[str, ...] | str,
    what: str,
    equivalent: str = "",
    *,
    citus: bool = False,
) -> Mutant:
    targets = (tests,) if isinstance(tests, str) else tests
    return Mutant(id, path, find, replace, targets, what, equivalent, citus)


def all_mutants() -> tuple[Mutant, ...]:
    """Every mutant of the catalogue, in report order."""
    from dev.mutate import (
        mutants_budgets,
        mutants_cancel,
        mutants_children,
        mutants_code,
        mutants_edges,
        mutants_hashes,
        mutants_operator,
        mutants_production,
        mutants_reclaim,
        mutants_routed,
        mutants_schedules,
        mutants_schema,
        mutants_signals,
        mutants_statements,
        mutants_steps,
        mutants_windows,
    )

    return (
        mutants_statements.MUTANTS
        + mutants_schema.MUTANTS
        + mutants_code.MUTANTS
        + mutants_production.MUTANTS
        + mutants_budgets.MUTANTS
        + mutants_cancel.MUTANTS
        + mutants_signals.MUTANTS
        + mutants_schedules.MUTANTS
        + mutants_routed.MUTANTS
        + mutants_steps.MUTANTS
        + mutants_operator.MUTANTS
        + mutants_children.MUTANTS
        + mutants_reclaim.MUTANTS
        + mutants_hashes.MUTANTS
        + mutants_edges.MUTANTS
        + mutants_windows.MUTANTS
    )
