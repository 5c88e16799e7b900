"""The mutation catalogue stays applicable: every mutant's edit finds its text exactly once.

A mutant whose text was rewritten away would be reported by `make mutate` as
an error at best; here the suite fails first, in the change that moved it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentdb.tools.mutate.catalogue import Mutant, all_mutants

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
