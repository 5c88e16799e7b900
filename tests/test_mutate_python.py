"""dev/mutate/python.py: how mutmut's verdicts are read, declared and reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.mutate import python as mp

ROOT = Path(__file__).resolve().parent.parent


def test_a_survivor_or_an_unreached_mutant_is_a_gap_unless_declared() -> None:
    codes: dict[str, int | None] = {
        "agentdb.m.x_f__mutmut_1": 1,  # killed
        "agentdb.m.x_f__mutmut_2": 0,  # survived, declared
        "agentdb.m.x_f__mutmut_3": 0,  # survived
        "agentdb.m.x_g__mutmut_1": 33,  # no test reaches g
        "agentdb.m.x_f__mutmut_4": 36,  # timeout: killed
    }
    declared = {"agentdb.m.x_f__mutmut_2": "same codec", "agentdb.m.x_h__mutmut_9": "gone"}
    diffs = {n: f"-a\n+b  # {n}" for n in codes}
    text = mp._report(codes, diffs, declared, ["agentdb/m.py"], ["tests/test_m.py"], 1.0)
    head, _, rest = text.partition("## Survivors and unreached (gaps)")
    assert "5 mutants: 1 killed, 1 not reached by the tests, 2 survived, 1 timeout" in head
    assert "1 of the survivors declared equivalent, 2 not" in head
    gaps, _, tail = rest.partition("## Declared equivalent")
    assert "x_f__mutmut_3" in gaps
    assert "x_g__mutmut_1" in gaps
    assert "x_f__mutmut_2" not in gaps
    assert "x_f__mutmut_1" not in gaps
    assert "same codec" in tail
    stale = tail.partition("## Declared equivalent, but not a survivor of this run")[2]
    assert "x_h__mutmut_9" in stale  # declared, no longer made: the declaration needs a look


def test_the_declared_equivalents_name_library_mutants_with_a_reason() -> None:
    declared = mp.read_equivalent(ROOT)
    assert declared
    for name, reason in declared.items():
        assert name.startswith("agentdb."), name
        assert "__mutmut_" in name, name
        assert not name.startswith("agentdb.tools."), name
        assert reason, name


@pytest.mark.parametrize("module", ["agentdb/tools/cli.py", "dev/mutate/run.py", "nope.py"])
def test_only_the_library_s_modules_are_mutated(module: str) -> None:
    with pytest.raises(SystemExit) as ended:
        mp.main([module])
    assert ended.value.code == 2


def test_a_test_file_that_is_not_there_is_refused_before_mutmut_runs() -> None:
    with pytest.raises(SystemExit) as ended:
        mp.main(["agentdb/_dsn.py", "--tests", "tests/test_dsn_nope.py"])
    assert ended.value.code == 2
