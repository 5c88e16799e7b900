"""The mutation catalogue stays applicable: every mutant's edit finds its text exactly once.

A mutant whose text was rewritten away would be reported by `make mutate` as
an error at best; here the suite fails first, in the change that moved it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dev.mutate.catalogue import Mutant, all_mutants

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", all_mutants(), ids=lambda m: m.id)
def test_each_mutant_applies_exactly_once(mutant: Mutant) -> None:
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.find) == 1, mutant.id
    assert mutant.find != mutant.replace


def test_the_catalogue_keeps_its_size_and_unique_ids() -> None:
    ids = [m.id for m in all_mutants()]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 80


_FUNCTION = re.compile(r"CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE) (\w+)\(", re.I)


def _migration_number(path: str) -> int | None:
    m = re.fullmatch(r"sql/migrations/(\d{4})\.[\w]+\.sql", path)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize(
    "mutant", [m for m in all_mutants() if _migration_number(m.path)], ids=lambda m: m.id
)
def test_no_mutant_edits_a_function_a_later_migration_replaces(mutant: Mutant) -> None:
    """A mutant inside a function body that a later migration defines again never reaches
    the schema: the tests would pass and report it survived (or, worse, killed by chance)."""
    text = (ROOT / mutant.path).read_text()
    at = text.index(mutant.find)
    defined = list(_FUNCTION.finditer(text[:at]))
    if not defined:
        return  # before any function: a table, a trigger, a policy
    opens = text.index("$$", defined[-1].end())
    if not opens < at < text.index("$$", opens + 2):
        return  # after that function's body: not inside one
    name = defined[-1].group(1)
    if re.search(rf"\b(?:CALL|SELECT|PERFORM) {name}\(", text[at:]):
        return  # run by its own migration: what it did there stays (grants, rows)
    number = _migration_number(mutant.path)
    assert number is not None
    for p in sorted((ROOT / "sql" / "migrations").glob("*.sql")):
        if p.name.endswith(".rollback.sql") or int(p.name[:4]) <= number:
            continue
        later = p.read_text()
        assert not re.search(rf"CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE) {name}\(", later), (
            f"{mutant.id} edits {name}, which {p.name} defines again: move it there"
        )
