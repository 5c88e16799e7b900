"""The house rules, checked: the library apart from its tools, one driver layer,
each query file read by the module of its name, static SQL only in statement files. (No
cap on a module's lines: size follows the concept.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agentdb import _db

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentdb"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _library_modules() -> list[Path]:
    # The tools and the testing kit are layers above the library (they may import it all).
    above = ("tools", "testing")
    return [p for p in _modules() if not set(above) & set(p.relative_to(PACKAGE).parts)]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_import_contract_lists_every_library_module() -> None:
    """import-linter checks what it is told to: every library module must be in the list."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if "tools" in c["forbidden_modules"][0])
    listed = set(contract["source_modules"])
    tops = {
        "agentdb." + (p.stem if p.parent == PACKAGE else p.relative_to(PACKAGE).parts[0])
        for p in _library_modules()
        if p.name not in ("__init__.py", "__main__.py") or p.parent != PACKAGE
    }
    assert tops == listed
    # The root package itself is not in the list (it would cover its tools): check it here.
    assert not {m for m in _imports(PACKAGE / "__init__.py") if m.startswith("agentdb.tools")}


_PROBE = """
import contextlib, io, sys
from agentdb.tools.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print("usage:" in out.getvalue())
print("\\n".join(sorted(m for m in sys.modules if m.startswith("agentdb"))))
"""


def _loaded_by(*argv: str) -> tuple[bool, set[str]]:
    """Run the CLI in a fresh interpreter; return (it printed usage, every agentdb module loaded).

    sys.modules is read after the command ran: -X importtime would miss modules loaded
    through importlib.import_module, which is how the CLI loads a tool.
    """
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    first, *modules = out.stdout.splitlines()
    return first == "True", set(modules)


def test_migrate_help_imports_neither_the_audit_nor_the_bench() -> None:
    usage, loaded = _loaded_by("migrate", "--help")
    assert usage
    assert "agentdb.tools.migrations" in loaded  # the probe sees the tool it runs
    assert not {m for m in loaded if m.startswith(("agentdb.tools.audit", "agentdb.tools.bench"))}
    # Control: the probe would see them if they were loaded.
    _, everything = _loaded_by("--help")
    assert {"agentdb.tools.audit.command", "agentdb.tools.bench.command"} <= everything
    assert not {m for m in everything if m.startswith("agentdb.tools.audit.checks")}


# Each package's statement files and the modules that read them: agentdb/queries/x.sql
# is agentdb/x.py's, agentdb/_citus/queries/x.sql agentdb/_citus/x.py's (and _db's alike).
_QUERY_FILES = sorted(
    p.relative_to(PACKAGE).as_posix()
    for folder in (PACKAGE / "queries", PACKAGE / "_citus" / "queries", PACKAGE / "_db" / "queries")
    for p in folder.glob("*.sql")
)


@pytest.mark.parametrize("path", _QUERY_FILES)
def test_each_query_file_is_read_by_the_module_of_its_name(path: str) -> None:
    *package, _, file = Path(path).parts  # [_citus,] queries, x.sql
    stem = file.removesuffix(".sql")
    module = PACKAGE.joinpath(*package, f"{stem}.py")
    assert module.is_file(), f"{path} has no module {module.relative_to(ROOT)}"
    source = module.read_text()
    assert "_db.queries(__name__)" in source
    dotted = ".".join(["agentdb", *module.relative_to(PACKAGE).with_suffix("").parts])
    statements = list(_db.queries(dotted))
    assert statements == sorted(statements), "statements in alphabetical order"
    for name in statements:
        assert f'"{name}"' in source, f"{name} is never run by {module.relative_to(ROOT)}"


# The migrations (psycopg, yoyo's side) keep their few statements beside their code.
_MIGRATIONS = {"migrate.py", "_citus/migrate.py"}
_SQL = re.compile(r"\bSELECT\s+[\w*(]|\bINSERT INTO\s|\bUPDATE \w+ SET\b|\bDELETE FROM\s")


@pytest.mark.parametrize(
    "path",
    [p for p in _library_modules() if p.relative_to(PACKAGE).as_posix() not in _MIGRATIONS],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_library_keeps_its_sql_in_statement_files(path: Path) -> None:
    """migrate.py is the one exception: its catalog look-ups run before any schema exists."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            assert not _SQL.search(node.value), node.value


def test_only_the_driver_layer_imports_asyncpg() -> None:
    """The import-linter contract, restated over the files (it also covers indirect imports)."""
    for path in _modules():
        if "_db" in path.relative_to(PACKAGE).parts:
            continue
        assert not {m for m in _imports(path) if m.split(".")[0] == "asyncpg"}, path
