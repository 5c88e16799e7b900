"""One guarantee id, threaded through every layer - kept true by these tests, not by care.

The registry (agentdb/guarantees.py) is the source; each test below reads
another layer and compares: the ``-- Gn`` comments beside constraints,
triggers and indexes in sql/, the ``-- guarantee:`` headers of the runtime
statements, the ``.guarantee`` of the error classes, the test names, and
the guarantee tables of the README and the docs. (The attacks assert the mapped error class and its
guarantee per object: tests/test_attacks.py.)
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from agentdb import _db, errors
from agentdb._db import errormap
from agentdb.guarantees import CATALOGUE, CONSTRAINTS, GUARANTEES, RULES, guarantee_of
from dev import docs

ROOT = Path(__file__).resolve().parent.parent
_TAG = re.compile(r"^(\s*)-- (G\d+(?:, G\d+)*)(?::|$)")
_OBJECT = re.compile(
    r"^\s*(?:CONSTRAINT (\w+)|CREATE (?:UNIQUE )?INDEX (\w+)|CREATE (?:CONSTRAINT )?TRIGGER (\w+))"
)
# A migration's own top-level drop retires an object an earlier file tagged
# (0023 drops the two event indexes 0004 created); a later CREATE of the same
# name tags it again. Drops inside function bodies are indented and do not count.
_DROP = re.compile(
    r"^(?:DROP (?:INDEX|TRIGGER) (?:IF EXISTS )?(\w+)"
    r"|ALTER TABLE \w+ DROP CONSTRAINT (?:IF EXISTS )?(\w+))"
)


def sql_comment_tags() -> dict[str, tuple[set[str], str]]:
    """Object name -> (the guarantee ids of the ``-- Gn`` comment directly above it, where).

    A tag comment governs the object lines that follow it at the same
    indentation (continuation lines are indented deeper); a blank line or any
    other line at that indentation ends it, and a top-level CREATE takes only
    the tag right above it. Files are read in migration order, so an object a
    later migration drops for good is not expected in the catalogue.
    """
    found: dict[str, tuple[set[str], str]] = {}
    for path in sorted((ROOT / "sql" / "migrations").glob("0*.sql")):
        if path.name.endswith(".rollback.sql"):
            continue
        tags: set[str] | None = None
        tag_indent = 0
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                tags = None
                continue
            dropped = _DROP.match(line)
            if dropped:
                found.pop(next(g for g in dropped.groups() if g), None)
            tagged = _TAG.match(line)
            if tagged:
                tags = set(re.findall(r"G\d+", tagged.group(2)))
                tag_indent = len(tagged.group(1))
                continue
            if line.lstrip().startswith("--") or tags is None:
                continue
            indent = len(line) - len(line.lstrip())
            if indent > tag_indent:
                continue
            obj = _OBJECT.match(line)
            if obj is None:
                tags = None
                continue
            name = next(g for g in obj.groups() if g)
            found[name] = (tags, f"{path.name}:{n}")
            if indent == 0:
                tags = None
    return found


def _catalogued(name: str) -> set[str]:
    ids = {CONSTRAINTS.get(name)} | {r.guarantee for r in RULES if r.name == name}
    return {g for g in ids if g is not None}


def test_every_tagged_sql_object_carries_its_catalogue_guarantees() -> None:
    tags = sql_comment_tags()
    # The scanner must keep seeing the files: a format change cannot turn this vacuous.
    assert len(tags) >= 75
    wrong = {
        name: (sorted(ids), sorted(_catalogued(name)), where)
        for name, (ids, where) in tags.items()
        if ids != _catalogued(name)
    }
    assert not wrong


def test_every_tagged_sql_object_is_in_the_catalogue() -> None:
    assert set(sql_comment_tags()) <= set(CONSTRAINTS)


def test_the_registry_is_numbered_in_order() -> None:
    assert list(GUARANTEES) == [f"G{i}" for i in range(1, len(GUARANTEES) + 1)]
    assert len(GUARANTEES) >= 25
    for gid, g in GUARANTEES.items():
        assert g.id == gid
        assert g.title
        assert g.statement.endswith(".")
        assert g.enforced_by


def test_catalogue_and_rules_name_known_guarantees_once() -> None:
    names = [e.name for e in CATALOGUE]
    assert len(names) == len(set(names))
    assert {e.guarantee for e in CATALOGUE} - {None} <= set(GUARANTEES)
    assert {r.guarantee for r in RULES} <= set(GUARANTEES)
    for r in RULES:
        assert r.name in CONSTRAINTS, r
        assert r.sqlstate in errors.SQLSTATES, r
    assert len({(r.name, r.sqlstate) for r in RULES}) == len(RULES)


@pytest.mark.parametrize("name", sorted(_db.QUERIES))
def test_every_statement_header_names_known_guarantees(name: str) -> None:
    q = _db.QUERIES[name]
    assert set(q.guarantees) <= set(GUARANTEES), q.guarantees
    if not q.guarantees:
        # Only read-only diagnostics may say none.
        assert not re.search(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", q.sql), name


def test_every_rule_maps_to_its_error_class_and_guarantee() -> None:
    for r in RULES:
        cls = errors.SQLSTATES[r.sqlstate]
        err = errormap.error_for(r.sqlstate, r.name, "x")
        assert type(err) is cls
        assert isinstance(err, errors.InvariantViolation)
        assert err.guarantee == r.guarantee, r
        assert r.guarantee == guarantee_of(r.name, r.sqlstate), r
        # The class's own guarantee is that of its rule: one id, whichever way it is read.
        assert cls.guarantee == r.guarantee, r


def _agentdb_errors() -> list[type[errors.AgentDBError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.AgentDBError) and cls.__module__ == errors.__name__
    ]


def test_every_guarded_error_class_names_its_guarantee_in_its_docstring() -> None:
    guarded = [c for c in _agentdb_errors() if getattr(c, "guarantee", "")]
    assert len(guarded) >= 18
    for cls in guarded:
        doc = inspect.getdoc(cls) or ""
        assert doc.startswith(f"{getattr(cls, 'guarantee', '')}:"), cls


def test_fence_errors_carry_their_guarantee() -> None:
    assert errors.LeaseLost.guarantee == "G12"
    assert errors.OutboxLeaseLost.guarantee == "G10"
    assert issubclass(errors.OutboxLeaseLost, errors.LeaseLost)
    assert errors.StaleVersion.guarantee == "G7"
    assert errors.NotFound.guarantee == "G2"
    assert errors.IdempotencyConflict.guarantee == errors.OperationInFlight.guarantee == "G4"
    for code, cls in errors.SQLSTATES.items():
        assert cls.sqlstate_code == code
        assert cls.guarantee in GUARANTEES, cls


def test_every_guarantee_has_a_test_named_after_it() -> None:
    names = {
        m.group(1)
        for path in (ROOT / "tests").glob("test_*.py")
        for m in re.finditer(r"^(?:async )?def test_(G\d+)_", path.read_text(), flags=re.M)
    }
    assert names == set(GUARANTEES)


@pytest.mark.parametrize("path", docs.MARKED, ids=lambda p: p.name)
def test_the_guarantee_tables_are_generated_from_the_registry(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert docs.render_readme(text) == text, f"{path.name} is stale: run `make readme`"
    for g in GUARANTEES.values():
        assert f"| {g.id} | **{g.title}**" in text


def test_the_errors_page_names_every_error_with_its_sqlstate_and_guarantee() -> None:
    text = (ROOT / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    assert text == docs.errors_page(), "docs/reference/errors.md is stale: run `make readme`"
    for code, cls in errors.SQLSTATES.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{cls.__name__}` |"))
        assert f"| {code} |" in row
        assert cls.guarantee in row


def test_the_audit_table_in_the_docs_lists_the_registry() -> None:
    text = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    section = text[text.index("| ID | enforced when |") :]
    ids = re.findall(r"^\| (G\d+) \|", section[: section.index("\n\n")], flags=re.M)
    assert ids == list(GUARANTEES)
