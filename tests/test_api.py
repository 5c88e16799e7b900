"""The front door: what agentdb.__all__ promises imports, docs/api.md lists exactly it, and
the type checkers' view of the package (its TYPE_CHECKING block) names the same things."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentdb

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"


@pytest.mark.parametrize("name", agentdb.__all__)
def test_every_public_name_imports_from_the_package(name: str) -> None:
    assert getattr(agentdb, name) is not None
    assert name in dir(agentdb)


def test_star_import_gives_every_public_name_in_a_fresh_interpreter() -> None:
    probe = "from agentdb import *; import agentdb; print(set(agentdb.__all__) <= globals().keys())"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "True"


def test_a_handler_author_needs_nothing_but_the_package() -> None:
    from agentdb import worker
    from agentdb.errors import LeaseLost, StepConflict

    for name in ("Worker", "Job", "Succeed", "Fail", "Retry", "Wait", "create_pool"):
        assert name in agentdb.__all__, name
    assert agentdb.Worker is worker.Worker
    assert agentdb.LeaseLost is LeaseLost
    assert agentdb.StepConflict is StepConflict


def _documented() -> list[str]:
    return re.findall(r"^- `(\w+)` - ", PAGE.read_text(encoding="utf-8"), flags=re.M)


def test_the_api_page_lists_exactly_the_public_names_once() -> None:
    documented = _documented()
    assert len(documented) == len(set(documented)), "a name listed twice"
    assert sorted(documented) == agentdb.__all__


def test_the_type_checkers_see_exactly_the_public_names_from_their_homes() -> None:
    """The TYPE_CHECKING imports are the one place the names are written a second time
    (type checkers cannot follow __getattr__): they must re-export what _PUBLIC says."""
    tree = ast.parse((ROOT / "agentdb" / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        n
        for n in tree.body
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    )
    seen: dict[str, str] = {}
    for node in block.body:
        if not isinstance(node, ast.ImportFrom) or node.module == "typing":
            continue
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as itself"
            home = "" if node.module == "agentdb" else str(node.module)
            seen[alias.name] = home
    public = {name: home for home, names in agentdb._PUBLIC.items() for name in names}
    assert seen == public


def test_import_agentdb_loads_nothing_else() -> None:
    """The lazy loading stays: `import agentdb` (the CLI's first step) imports no module of
    its own, not asyncpg, not typing (``__future__``, for its annotations, is all)."""
    probe = (
        "import sys; before = set(sys.modules); import agentdb; "
        "print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "['__future__', 'agentdb']"
