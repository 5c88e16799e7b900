"""The mutants: small, realistic breakages of a guard, each with the tests that must catch it.

Every mutant is one exact edit: ``find`` is replaced by ``replace``. Where it
is looked for is the mutant's anchor:

* ``within`` names the unit the edit is inside - a SQL routine, a statement of
  ``agentdb/queries`` (its ``-- name:``) or a Python function (``Class.method``)
  - and ``find`` must occur exactly once in that unit, or ``occurrence`` picks
  the n-th. A routine's ``path`` may be the migrations folder: the edit then
  lands in the latest migration that defines the routine, so a mutant follows
  a function that a later migration redefines whole (before this, 68 of 156
  commits edited the catalogue's texts to follow the code, most of them for
  that reason);
* without ``within``, ``find`` must occur exactly once in the whole file.

``tests`` are the pytest targets that should kill it (a fast subset, not the
whole suite). A mutant that cannot change behaviour is declared
``equivalent`` with the reason; it is still applied and run, so the report
shows the claim holds.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "Unanchored", "all_mutants", "apply", "locate", "m"]


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
    within: str = ""  # the routine, statement or function the edit is inside
    occurrence: int = 0  # 0: `find` occurs once in its anchor; n: the n-th of several


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
    within: str = "",
    occurrence: int = 0,
) -> Mutant:
    targets = (tests,) if isinstance(tests, str) else tests
    return Mutant(id, path, find, replace, targets, what, equivalent, citus, within, occurrence)


class Unanchored(Exception):
    """The mutant's edit does not land where its anchor says (the catalogue is stale)."""


@dataclass(frozen=True, slots=True)
class Site:
    path: str  # the file the edit lands in, relative to the checkout
    at: int  # where `find` starts in it


def _routine(name: str) -> re.Pattern[str]:
    return re.compile(rf"CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE) {re.escape(name)}\(", re.I)


def _routine_span(text: str, name: str) -> tuple[int, int] | None:
    """The last definition of routine `name` in a migration: its header through its body."""
    found = list(_routine(name).finditer(text))
    if not found:
        return None
    opens = text.index("$$", found[-1].end())
    closes = text.index("$$", opens + 2) + 2
    return found[-1].start(), closes + (text[closes : closes + 1] == ";")


def _statement_span(text: str, name: str) -> tuple[int, int] | None:
    header = re.search(rf"^-- name: {re.escape(name)} ", text, re.M)
    if header is None:
        return None
    following = re.compile(r"^-- name: ", re.M).search(text, header.end())
    return header.start(), following.start() if following else len(text)


def _python_span(text: str, qualname: str) -> tuple[int, int] | None:
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.stmt | None = None
    for part in qualname.split("."):
        # The last definition of the name: an @overload's stubs come before the body.
        named = [
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.name == part
        ]
        if not named:
            return None
        node = named[-1]
        body = node.body
    assert node is not None
    assert node.end_lineno is not None
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return starts[first - 1], starts[node.end_lineno]


def _anchor(root: Path, mutant: Mutant) -> tuple[str, tuple[int, int]]:
    """The file and the span of the unit `within` names."""
    if mutant.path.endswith("/"):  # a routine: the latest migration that defines it
        for p in sorted((root / mutant.path).glob("*.sql"), reverse=True):
            if p.name.endswith(".rollback.sql"):
                continue
            span = _routine_span(p.read_text(encoding="utf-8"), mutant.within)
            if span is not None:
                return str(p.relative_to(root)), span
        raise Unanchored(f"{mutant.id}: no migration defines {mutant.within}")
    text = (root / mutant.path).read_text(encoding="utf-8")
    if mutant.path.endswith(".py"):
        found = _python_span(text, mutant.within)
    elif mutant.path.startswith("sql/"):
        found = _routine_span(text, mutant.within)
    else:
        found = _statement_span(text, mutant.within)
    if found is None:
        raise Unanchored(f"{mutant.id}: {mutant.path} has no {mutant.within}")
    return mutant.path, found


def locate(root: Path, mutant: Mutant) -> Site:
    """Where the mutant's edit lands; Unanchored when its text is not where it says."""
    if not mutant.within:
        text = (root / mutant.path).read_text(encoding="utf-8")
        count = text.count(mutant.find)
        if count != 1:
            raise Unanchored(f"{mutant.id}: `find` occurs {count} times in {mutant.path}")
        return Site(mutant.path, text.index(mutant.find))
    path, (start, end) = _anchor(root, mutant)
    unit = (root / path).read_text(encoding="utf-8")[start:end]
    hits = [h.start() for h in re.finditer(re.escape(mutant.find), unit)]
    where = f"{mutant.within} ({path})"
    if mutant.occurrence == 0 and len(hits) != 1:
        raise Unanchored(f"{mutant.id}: `find` occurs {len(hits)} times in {where}")
    if mutant.occurrence > len(hits):
        raise Unanchored(f"{mutant.id}: {where} has {len(hits)} of `find`, not {mutant.occurrence}")
    return Site(path, start + hits[max(mutant.occurrence, 1) - 1])


def apply(root: Path, mutant: Mutant) -> tuple[str, str, str]:
    """The file the mutant edits, its text, and its text with the edit made."""
    site = locate(root, mutant)
    text = (root / site.path).read_text(encoding="utf-8")
    end = site.at + len(mutant.find)
    return site.path, text, text[: site.at] + mutant.replace + text[end:]


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
