"""The generated SQL mutants (dev/mutate/generate.py) stay sound: no database needed.

Deterministic ids; each edit applies exactly once and leaves SQL Postgres' parser
accepts (the statement, the migration, the PL/pgSQL body it edits); every operator
yields mutants; no mutant edits a routine a later migration replaces; the reviewed
equivalent list names only mutants that exist.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from pglast import parser as pg

from agentdb._db import sqlfile
from dev.mutate.catalogue import Mutant
from dev.mutate.generate import (
    EQUIVALENT_FILE,
    OPERATORS,
    Generated,
    _generate,
    generate,
    read_equivalent,
    sample,
)
from dev.mutate.run import check_catalogue
from tests.test_mutants import (
    test_no_mutant_edits_a_function_a_later_migration_replaces as _no_later_definition,
)

ROOT = Path(__file__).resolve().parent.parent


def _mutated(m: Mutant) -> tuple[str, int]:
    """The file after the edit, and where the edit starts in it."""
    text = (ROOT / m.path).read_text(encoding="utf-8")
    at = text.index(m.find)
    prefix = next(
        (i for i, (a, b) in enumerate(zip(m.find, m.replace, strict=False)) if a != b),
        min(len(m.find), len(m.replace)),
    )
    return text.replace(m.find, m.replace, 1), at + prefix


def _parse_problem(m: Mutant) -> str | None:
    """What Postgres' parser refuses in the mutated file, if anything."""
    new, at = _mutated(m)
    try:
        if m.path.startswith("agentdb/"):
            for q in sqlfile.parse(new, m.path):
                pg.parse_sql_json(q.sql)
            return None
        raw = new.encode()
        start = len(new[:at].encode())
        for stmt in json.loads(pg.parse_sql_json(new))["stmts"]:
            loc = stmt.get("stmt_location", 0)
            if loc <= start < loc + stmt["stmt_len"] and "CreateFunctionStmt" in stmt["stmt"]:
                source = raw[loc : loc + stmt["stmt_len"]].decode()
                options = stmt["stmt"]["CreateFunctionStmt"].get("options", [])
                language = [
                    o["DefElem"]["arg"]["String"]["sval"]
                    for o in options
                    if o["DefElem"]["defname"] == "language"
                ]
                body = [
                    o["DefElem"]["arg"]["List"]["items"][0]["String"]["sval"]
                    for o in options
                    if o["DefElem"]["defname"] == "as"
                ]
                if language == ["plpgsql"]:
                    pg.parse_plpgsql_json(source)
                elif language == ["sql"] and body:
                    pg.parse_sql_json(body[0])
    except (pg.ParseError, sqlfile.QueryFileError) as e:
        return f"{m.id}: {e}"
    return None


def test_the_generator_is_deterministic() -> None:
    first = _generate(ROOT)
    again = _generate(ROOT)
    assert [g.mutant for g in first] == [g.mutant for g in again]
    assert [g.mutant for g in first] == [g.mutant for g in generate()]
    ids = [g.mutant.id for g in first]
    assert len(ids) == len(set(ids))
    assert all(
        i.startswith(f"gen-{Path(g.mutant.path).stem}-{g.unit}-{g.op}-")
        for g, i in zip(first, ids, strict=True)
    )


def test_each_edit_applies_exactly_once_and_still_parses() -> None:
    mutants = [g.mutant for g in generate()]
    assert check_catalogue(ROOT, mutants) == []  # once each, a change, test files that exist
    problems = [p for p in map(_parse_problem, mutants) if p]
    assert problems == []


def test_every_operator_yields_mutants() -> None:
    generated = generate()
    by_op = Counter(g.op for g in generated)
    assert set(by_op) == set(OPERATORS), by_op
    whats = [g.mutant.what for g in generated]
    for flip in ("`<` -> `<=`", "`<=` -> `<`", "`>` -> `>=`", "`>=` -> `>`", "`=` -> `<>`"):
        assert any(flip in w for w in whats), flip
    assert any("`<>` -> `=`" in w or "`!=` -> `=`" in w for w in whats)
    for kind in (
        "IN element",
        "ARRAY element",
        "`SKIP LOCKED` removed",
        "`FOR UPDATE",
        "`FOR SHARE",
    ):
        assert any(kind in w for w in whats), kind
    assert any(g.op == "int" and " -> -1 " not in g.mutant.what for g in generated)
    # Each source: the statement files, and each kind of migration object.
    assert {g.kind for g in generated} == {"statement", "routine", "check", "trigger"}
    assert {g.mutant.path for g in generated if g.kind == "statement"} >= {
        "agentdb/queries/tasks.sql",
        "agentdb/queries/leases.sql",
        "agentdb/_citus/queries/routed.sql",
    }


def test_no_generated_mutant_edits_a_routine_a_later_migration_replaces() -> None:
    for g in generate():
        if g.mutant.path.startswith("sql/migrations/"):
            _no_later_definition(g.mutant)


def test_every_mutant_has_tests_and_citus_ones_only_run_on_citus() -> None:
    for g in generate():
        assert g.mutant.tests, g.mutant.id
        routed = (
            g.mutant.path.startswith("agentdb/_citus/")
            or g.unit.endswith("_citus")
            or g.unit.startswith("agentdb_routed_")  # 0021.delegated_writes
        )
        assert g.mutant.citus == routed or g.unit.startswith("agentdb_distribute"), g.mutant.id


def test_the_equivalent_list_names_only_generated_mutants() -> None:
    text = (ROOT / EQUIVALENT_FILE).read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            mid, sep, reason = line.partition(":")
            assert sep, f"malformed line: {line!r}"
            assert mid.strip(), f"no id: {line!r}"
            assert reason.strip(), f"no reason: {line!r}"
    equivalent = read_equivalent(ROOT)
    by_id: dict[str, Generated] = {g.mutant.id: g for g in generate()}
    assert set(equivalent) <= set(by_id), sorted(set(equivalent) - set(by_id))
    for mid, reason in equivalent.items():
        assert by_id[mid].mutant.equivalent == reason


def test_a_sample_is_seeded() -> None:
    mutants = [g.mutant for g in generate()]
    picked = [m.id for m in sample(mutants, 40, 1)]
    assert picked == [m.id for m in sample(list(reversed(mutants)), 40, 1)]
    assert len(picked) == 40
    assert picked != [m.id for m in sample(mutants, 40, 2)]
    assert len(sample(mutants[:5], 40, 1)) == 5
    # A mutant more or less elsewhere leaves the others' places: removing one that was
    # not picked changes nothing, removing a picked one lets exactly one other in.
    left_out = next(m for m in mutants if m.id not in picked)
    assert [m.id for m in sample([m for m in mutants if m is not left_out], 40, 1)] == picked
    gone = next(m for m in mutants if m.id == picked[0])
    after = [m.id for m in sample([m for m in mutants if m is not gone], 40, 1)]
    assert len(set(picked) - set(after)) == 1
    assert len(set(after) - set(picked)) == 1
