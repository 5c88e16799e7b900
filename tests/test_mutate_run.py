"""dev/mutate/run.py: a mutant's test run that runs out of time leaves nothing behind, and
the test that killed a mutant last time runs first."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from dev.mutate.catalogue import Mutant, all_mutants
from dev.mutate.generate import generated_mutants, sample
from dev.mutate.run import (
    _TIMED_OUT,
    _baseline_targets,
    _end_run,
    _judge,
    _over_unix_socket,
    _run_one,
    failed_test,
    read_ids,
    read_killers,
    write_killers,
)
from tests.conftest import Database

_SLEEPING = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)'"


async def test_a_run_out_of_time_is_killed_and_its_queries_ended(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    """A hanging mutant (a query that never ends) must not stall the next one: the run's
    process tree - a grandchild here, as pgbouncer or a worker is - is killed, and the
    session it held, whose query would go on running without its client, is ended."""
    client = (
        "import psycopg, sys; c = psycopg.connect(sys.argv[1], autocommit=True);"
        " c.execute('SELECT pg_sleep(600)')"
    )
    shell = f"{sys.executable} -c \"{client}\" '{db.admin_dsn}'; exit 0"
    proc = await asyncio.to_thread(
        subprocess.Popen,
        ["sh", "-c", shell],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while await admin_conn.fetchval(_SLEEPING) == 0:
        assert time.monotonic() < deadline, "the client never started its query"
        await asyncio.sleep(0.1)
    said = await asyncio.to_thread(_end_run, proc, db.admin_dsn, False)
    assert proc.returncode is not None
    if _over_unix_socket(db.admin_dsn):
        # The embedded server listens on a Unix socket only: the tool says it cannot
        # tell the run's session apart (and leaves it), rather than claiming none.
        assert "cannot be told apart" in said, said
        await admin_conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query = 'SELECT pg_sleep(600)'"
        )
        return
    assert "ended 1 session(s)" in said, said
    assert await admin_conn.fetchval(_SLEEPING) == 0


def test_a_timeout_is_a_kill_counted_apart() -> None:
    m = Mutant("m", "sql/x.sql", "a", "b", ("tests/test_x.py",), "what")
    assert _judge(m, _TIMED_OUT, "timed out")[0] == "timeout"
    assert _judge(m, 1, "1 failed")[0] == "killed"
    declared = Mutant("m", "sql/x.sql", "a", "b", ("tests/test_x.py",), "what", "because")
    assert _judge(declared, _TIMED_OUT, "timed out")[0] == "equivalent-killed"


def test_the_killers_file_reads_back_what_was_written_and_names_a_bad_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "killers.txt"
    assert read_killers(path) == {}  # no file: no killers, every mutant runs its tests
    write_killers({"b": "tests/test_b.py::test_y[1]", "a": "tests/test_a.py::test_x"}, path)
    write_killers({"a": "tests/test_a.py::test_z"}, path)  # a later run's killer wins
    assert read_killers(path) == {
        "a": "tests/test_a.py::test_z",
        "b": "tests/test_b.py::test_y[1]",
    }
    lines = path.read_text().splitlines()
    assert [ln.split(":")[0] for ln in lines if not ln.startswith("#")] == ["a", "b"]
    path.write_text("a: tests/test_a.py::test_x\nb tests/test_b.py\n")
    with pytest.raises(ValueError, match=r"killers.txt:2: not `mutant id"):
        read_killers(path)
    path.write_text("a: tests/test_a.py\n")  # a file is not one test
    with pytest.raises(ValueError, match=r":1: "):
        read_killers(path)


def test_the_test_that_failed_is_read_from_pytest_s_summary() -> None:
    out = (
        "..F\n=== short test summary info ===\n"
        "FAILED tests/test_a.py::test_x[a-1] - AssertionError: assert 1 == 2\n"
        "!!!!! stopping after 1 failures !!!!!\n1 failed, 2 passed in 0.1s\n"
    )
    assert failed_test(out) == "tests/test_a.py::test_x[a-1]"
    assert (
        failed_test("ERROR tests/test_b.py::test_y - RuntimeError\n") == "tests/test_b.py::test_y"
    )
    assert failed_test("FAILED tests/test_c.py::test_z\n") == "tests/test_c.py::test_z"
    spaced = "FAILED tests/test_d.py::test_w[tasks-every tenant] - assert 0 == 1\n"
    assert failed_test(spaced) == "tests/test_d.py::test_w[tasks-every tenant]"
    assert failed_test("FAILED tests/test_d.py::test_w[one tenant]\n") == (
        "tests/test_d.py::test_w[one tenant]"
    )
    assert failed_test("3 passed in 0.2s\n") == ""


def test_the_baseline_runs_each_mutant_s_killer_or_its_tests(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (tmp_path / "tests" / name).write_text("")
    with_killer = Mutant("k", "x.sql", "a", "b", ("tests/test_a.py",), "what")
    without = Mutant("n", "x.sql", "a", "b", ("tests/test_b.py",), "what")
    stale = Mutant("s", "x.sql", "a", "b", ("tests/test_c.py",), "what")
    killers = {"k": "tests/test_a.py::test_x", "s": "tests/test_gone.py::test_y"}
    assert _baseline_targets(tmp_path, [with_killer, without, stale], killers) == [
        "tests/test_a.py::test_x", "tests/test_b.py", "tests/test_c.py",
    ]  # fmt: skip
    # A killer inside a file the baseline runs whole is not run twice.
    also = Mutant("w", "x.sql", "a", "b", ("tests/test_a.py",), "what")
    assert _baseline_targets(tmp_path, [with_killer, also], killers) == ["tests/test_a.py"]


_MODULE = "VALUE = 1\n"
_TESTS = """\
import mod


def test_broken_without_the_mutant_too():
    assert mod.VALUE == 3


def test_unrelated():
    pass


def test_value():
    assert mod.VALUE == 1
"""


def _tiny_checkout(at: Path) -> Path:
    (at / "tests").mkdir(parents=True)
    (at / "mod.py").write_text(_MODULE)
    (at / "tests" / "test_a.py").write_text(_TESTS)
    return at


def test_a_killer_runs_first_a_stale_one_falls_back_and_an_unproven_kill_is_an_error(
    tmp_path: Path,
) -> None:
    """End to end on a tiny checkout, real pytest runs: the killer alone kills; a killer
    that passes (the tests changed) leaves the mutant to its own tests, whose failing
    test becomes the new killer; a kill by a test that also fails without the mutant,
    when the baseline did not run it, is an error, not a kill."""
    root, copy = _tiny_checkout(tmp_path / "root"), _tiny_checkout(tmp_path / "copy")
    m = Mutant("m", "mod.py", "VALUE = 1", "VALUE = 2", ("tests/test_a.py::test_value",), "w")
    first = _run_one(root, copy, m, "postgresql://unused", 120, "tests/test_a.py::test_value")
    assert (first.verdict, first.killer) == ("killed", "tests/test_a.py::test_value")
    assert "its killer" in first.detail
    assert (copy / "mod.py").read_text() == _MODULE  # the copy is restored

    stale = _run_one(root, copy, m, "postgresql://unused", 120, "tests/test_a.py::test_unrelated")
    assert (stale.verdict, stale.killer) == ("killed", "tests/test_a.py::test_value")
    assert "its killer" not in stale.detail

    whole = Mutant("w", "mod.py", "VALUE = 1", "VALUE = 2", ("tests/test_a.py",), "w")
    proven = frozenset({"tests/test_a.py"})
    assert _run_one(root, copy, whole, "postgresql://unused", 120, None, proven).verdict == (
        "killed"
    )
    unproven = _run_one(root, copy, whole, "postgresql://unused", 120, None, frozenset())
    assert unproven.verdict == "error", unproven
    assert "test_broken_without_the_mutant_too fails without the mutant too" in unproven.detail


def test_every_recorded_killer_names_a_mutant_and_a_test_file_that_exist() -> None:
    """A killer left behind by a renamed mutant or a moved test would only cost time (the
    mutant's own tests run when it cannot), but the file should say what is true."""
    killers = read_killers()
    assert len(killers) >= 90  # CI's sample (100, seed 1) runs on them
    known = {m.id for m in generated_mutants()} | {m.id for m in all_mutants()}
    assert sorted(set(killers) - known) == []
    root = Path(__file__).resolve().parents[1]
    missing = {t for t in killers.values() if not (root / t.split("::")[0]).is_file()}
    assert sorted(missing) == []


def test_an_ids_file_lists_each_mutant_once(tmp_path: Path) -> None:
    path = tmp_path / "ids.txt"
    path.write_text("# CI's list\ngen-a  # the first\n\ngen-b\n")
    assert read_ids(path) == ["gen-a", "gen-b"]
    path.write_text("gen-a\ngen-b\ngen-a\n")
    with pytest.raises(ValueError, match="listed twice: gen-a"):
        read_ids(path)
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no mutant ids"):
        read_ids(path)


def test_ci_s_mutation_gate_is_100_generated_mutants_each_killed_before_or_declared() -> None:
    """CI runs the seeded sample (make mutate-ci: --sample 100 --seed 1): 100 plain
    generated mutants, and each one either has the killer it will try first or is a
    declared equivalent - so the gate stays minutes long, and a survivor in it is news.
    A change that moves mutants into the sample (a statement edited, a routine redefined
    by a new migration: its ids change) fails here until a run records their killers
    (``make mutate-ci MUTATE_ARGS=--record``)."""
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "--generated --sample 100 --seed 1 " in makefile.split("\nmutate-ci:")[1]
    plain = [m for m in generated_mutants() if not m.citus]
    picked = sample(plain, 100, 1)
    assert len(picked) == 100
    killers = read_killers()
    unkilled = sorted(m.id for m in picked if m.id not in killers and not m.equivalent)
    assert unkilled == []
