"""The mutation catalogue stays applicable: every mutant's edit lands where its anchor says.

A mutant whose text was rewritten away would be reported by `make mutate` as
an error at best; here the suite fails first, in the change that moved it.
A mutant inside a routine, a statement or a function is anchored by it
(``within``), so a routine a later migration redefines whole takes its
mutants along - as long as the text they change is still in it.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from dev.mutate.catalogue import MIGRATIONS, Mutant, Unanchored, all_mutants, apply, locate, m

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", all_mutants(), ids=lambda m: m.id)
def test_each_mutant_applies_exactly_once(mutant: Mutant) -> None:
    locate(ROOT, mutant)  # Unanchored: its text is not once where its anchor says
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
    "mutant",
    [m for m in all_mutants() if _migration_number(m.path) or m.path == MIGRATIONS],
    ids=lambda m: m.id,
)
def test_no_mutant_edits_a_function_a_later_migration_replaces(mutant: Mutant) -> None:
    """A mutant inside a function body that a later migration defines again never reaches
    the schema: the tests would pass and report it survived (or, worse, killed by chance)."""
    site = locate(ROOT, mutant)
    text = (ROOT / site.path).read_text()
    at = site.at
    defined = list(_FUNCTION.finditer(text[:at]))
    if not defined:
        return  # before any function: a table, a trigger, a policy
    opens = text.index("$$", defined[-1].end())
    if not opens < at < text.index("$$", opens + 2):
        return  # after that function's body: not inside one
    name = defined[-1].group(1)
    # Run by its own migration, what it did there stays (grants, rows) - unless a later
    # migration that defines it again runs it again too: agentdb_grant_roles, run again
    # by 0013, drops and recreates every policy the first run made.
    run_here = re.search(rf"\b(?:CALL|SELECT|PERFORM) {name}\(", text[at:]) is not None
    number = _migration_number(site.path)
    assert number is not None
    for p in sorted((ROOT / "sql" / "migrations").glob("*.sql")):
        if p.name.endswith(".rollback.sql") or int(p.name[:4]) <= number:
            continue
        later = p.read_text()
        redefined = re.search(rf"CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE) {name}\(", later)
        run_again = re.search(rf"\b(?:CALL|SELECT|PERFORM) {name}\(", later)
        assert not (redefined and (run_again or not run_here)), (
            f"{mutant.id} edits {name}, which {p.name} defines again: move it there"
        )


def _unit_at(path: str, text: str, at: int) -> str | None:
    """The routine, statement or function the offset is inside, if any."""
    if _migration_number(path):
        defined = list(_FUNCTION.finditer(text[:at]))
        if defined:
            opens = text.index("$$", defined[-1].end())
            if at < text.index("$$", opens + 2):
                return defined[-1].group(1)
        return None
    if path.endswith(".sql"):
        heads = re.findall(r"^-- name: (\w+) ", text[:at], re.M)
        return heads[-1] if heads else None
    if path.endswith(".py"):
        line = text[:at].count("\n") + 1
        inside = [
            n.name
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.lineno <= line <= (n.end_lineno or 0)
        ]
        return inside[-1] if inside else None
    return None


def test_a_mutant_inside_a_routine_a_statement_or_a_function_is_anchored_by_it() -> None:
    """Unanchored, its exact text must stay unique in the whole file, and it is the
    catalogue edit every change to the file breaks (issue 35: 68 of 156 commits).
    An edit that reaches across the end of one unit into the next stays loose."""
    loose = []
    for mutant in all_mutants():
        if mutant.within or mutant.path.endswith(".rollback.sql"):
            continue
        text = (ROOT / mutant.path).read_text()
        at = text.index(mutant.find)
        unit = _unit_at(mutant.path, text, at)
        if unit is not None and unit == _unit_at(mutant.path, text, at + len(mutant.find) - 1):
            loose.append(f"{mutant.id}: inside {unit}")
    assert not loose, "anchor these with within=...:\n" + "\n".join(loose)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(body))
    return tmp_path


_F1 = """
    CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
    BEGIN
        RETURN 1;
    END
    $$;
"""
_F2 = """
    CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
    BEGIN
        IF true THEN RETURN 2; END IF;
        RETURN 1;
    END
    $$;
"""


def test_a_routine_s_mutant_lands_in_the_latest_migration_that_defines_it(
    tmp_path: Path,
) -> None:
    root = _tree(
        tmp_path,
        {
            "sql/migrations/0001.a.sql": _F1,
            "sql/migrations/0002.b.sql": _F2 + "SELECT 'RETURN 1;';",
            "sql/migrations/0002.b.rollback.sql": _F1,
        },
    )
    mutant = m("x", MIGRATIONS, "RETURN 1;", "RETURN 0;", "tests/t.py", "x", within="f")
    path, before, after = apply(root, mutant)
    assert path == "sql/migrations/0002.b.sql"  # not the rollback, not 0001
    assert after == before.replace("        RETURN 1;", "        RETURN 0;", 1)
    assert after.endswith("SELECT 'RETURN 1;';")  # outside f: the same text is left alone
    # The latest body no longer has the text: the catalogue is stale, and says so.
    (root / "sql/migrations/0003.c.sql").write_text(_F1.replace("RETURN 1;", "RETURN 3;"))
    with pytest.raises(Unanchored, match="occurs 0 times in f"):
        locate(root, mutant)
    with pytest.raises(Unanchored, match="no migration defines g"):
        locate(root, m("y", MIGRATIONS, "RETURN", "", "tests/t.py", "y", within="g"))


def test_a_statement_s_or_a_function_s_mutant_is_looked_for_in_it_alone(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "q.sql": """
                -- name: one :one
                SELECT 1 FROM t WHERE a = $1 AND b = $1 AND c = $1 FOR UPDATE;

                -- name: two :one
                SELECT 2 FROM t WHERE a = $1 FOR UPDATE SKIP LOCKED;
            """,
            "p.py": """
                from typing import overload

                class C:
                    @overload
                    def f(self, x: int) -> int: ...
                    @overload
                    def f(self, x: str) -> str: ...
                    def f(self, x):
                        return x + x

                def f(x):
                    return x + x
            """,
        },
    )
    two = m("s", "q.sql", "FOR UPDATE", "", "tests/t.py", "s", within="two")
    _, before, after = apply(root, two)
    assert after == before.replace("$1 FOR UPDATE SKIP", "$1  SKIP")
    with pytest.raises(Unanchored, match="occurs 3 times in one"):
        locate(root, m("w", "q.sql", "$1", "$2", "tests/t.py", "w", within="one"))
    with pytest.raises(Unanchored, match="has 3 of `find`, not 4"):
        locate(root, m("w", "q.sql", "$1", "$2", "tests/t.py", "w", within="one", occurrence=4))
    second = m("o", "q.sql", "$1", "$2", "tests/t.py", "o", within="one", occurrence=2)
    assert locate(root, second).at == before.index("b = $1") + len("b = ")
    method = m("p", "p.py", "x + x", "x", "tests/t.py", "p", within="C.f")
    _, before, after = apply(root, method)
    assert after.count("return x + x") == 1  # the method's body, not the module's f
    assert after.index("return x\n") < after.index("def f(x)")
    with pytest.raises(Unanchored, match=r"has no C\.g"):
        locate(root, m("q", "p.py", "x", "y", "tests/t.py", "q", within="C.g"))
