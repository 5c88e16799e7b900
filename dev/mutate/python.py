"""``make mutate-python``: mechanical mutants of the library's Python, made and run by mutmut.

python -m dev.mutate.python agentdb/hashing.py [agentdb/redaction.py ...] [--tests T ...]

mutmut (the ecosystem's mutation tool for Python) mutates each function of the
named modules - operators, comparisons, constants, strings, arguments, return
values - and runs, for each mutant, the tests that call the function it lives
in (it records which tests reach which function in a first run). The run is
made in a scratch copy of the checkout, so neither mutmut's ``mutants/`` folder
nor its configuration ever lands in the repository. A module's tests are
``tests/test_<module>.py`` unless ``_TESTS`` below or ``--tests`` says
otherwise; the whole suite would find more, at the cost of a full run per
module for mutmut's first pass.

A survivor, or a mutant no selected test reaches, is either a gap - a test
is owed that fails on it - or a mutant that cannot change behaviour, declared
in ``dev/mutate/equivalent_python.txt`` (``name: reason``; mutmut names a
mutant by module, function and number, so a change to the function renumbers
its mutants and the declaration must be looked at again - the report lists a
declared name that no longer came out alive).
Exit status 0 when every live mutant is declared. Only the library is in scope:
``agentdb/tools`` is the repository's and the CLI's, tested by their own
suites, and mutmut is not a dependency of the wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from dev.mutate.run import _database, _root, _scratch

__all__ = ["main"]

EQUIVALENT_FILE = "dev/mutate/equivalent_python.txt"
# A module whose tests are not (only) tests/test_<module>.py.
_TESTS: dict[str, tuple[str, ...]] = {
    "agentdb/_db/errormap.py": ("tests/test_exec.py", "tests/test_attacks.py"),
    "agentdb/_dsn.py": ("tests/test_cli.py", "tests/test_testing_kit.py"),
}
# mutmut's verdict for each exit code of a mutant's run (mutmut.stats.status_by_exit_code).
_KILLED = {1, 3}
_SURVIVED = 0
_UNTESTED = {5, 33}  # no selected test reaches the mutant's function
_LIVE = {_SURVIVED, *_UNTESTED}  # not killed: a gap unless declared equivalent
_TIMEOUT = {24, -24, 36, 152, 255}
_CAUGHT_BY_TYPES = 37


def _tests_of(module: str) -> tuple[str, ...]:
    if module in _TESTS:
        return _TESTS[module]
    own = f"tests/test_{Path(module).stem.lstrip('_')}.py"
    if not Path(own).is_file():
        raise SystemExit(f"agentdb mutate-python: no {own}; name the tests with --tests")
    return (own,)


def _config(modules: Sequence[str], tests: Sequence[str]) -> str:
    """mutmut's section of the scratch copy's pyproject.toml."""
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["agentdb/"]\n'
        f"only_mutate = {json.dumps(list(modules))}\n"
        'also_copy = ["sql/", "dev/", "docs/", "examples/", "README.md"]\n'
        f"pytest_add_cli_args_test_selection = {json.dumps(list(tests))}\n"
        # Random order would make mutmut's first pass and its per-mutant runs disagree.
        'pytest_add_cli_args = ["-p", "no:randomly", "-q", "-p", "no:cacheprovider"]\n'
    )


def read_equivalent(root: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    path = root / EQUIVALENT_FILE
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else ():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(":")
            found[name.strip()] = reason.strip()
    return found


def _verdicts(copy: Path, modules: Sequence[str]) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for module in modules:
        meta = copy / "mutants" / f"{module}.meta"
        if meta.exists():
            codes.update(json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"])
    return codes


def _diff(copy: Path, name: str) -> str:
    shown = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", name],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return "\n".join(
        line
        for line in shown.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )


def _report(
    codes: dict[str, int | None],
    diffs: dict[str, str],
    equivalent: dict[str, str],
    modules: Sequence[str],
    tests: Sequence[str],
    wall: float,
) -> str:
    tally = Counter(
        "killed"
        if c in _KILLED
        else "survived"
        if c == _SURVIVED
        else "timeout"
        if c in _TIMEOUT
        else "caught by type check"
        if c == _CAUGHT_BY_TYPES
        else "not reached by the tests"
        if c in _UNTESTED
        else f"other ({c})"
        for c in codes.values()
    )
    gaps = sorted(n for n, c in codes.items() if c in _LIVE and n not in equivalent)
    declared = sorted(n for n, c in codes.items() if c in _LIVE and n in equivalent)
    lines = [
        f"# mutmut on {', '.join(modules)}",
        "",
        f"Tests: {', '.join(tests)}. Wall time {wall:.0f}s.",
        "",
        f"{len(codes)} mutants: "
        + ", ".join(f"{n} {verdict}" for verdict, n in sorted(tally.items()))
        + f"; {len(declared)} of the survivors declared equivalent, {len(gaps)} not.",
        "",
    ]
    for title, names in (
        ("Survivors and unreached (gaps)", gaps),
        ("Declared equivalent", declared),
    ):
        if names:
            lines += [f"## {title}", ""]
            for name in names:
                why = f" - {equivalent[name]}" if name in equivalent else ""
                lines += [f"### `{name}`{why}", "", "```diff", diffs.get(name, ""), "```", ""]
    stale = sorted(
        n for n in equivalent if n.startswith(_prefixes(modules)) and codes.get(n) not in _LIVE
    )
    if stale:
        lines += ["## Declared equivalent, but not a survivor of this run", ""]
        lines += [f"- `{n}`" for n in stale] + [""]
    return "\n".join(lines)


def _prefixes(modules: Sequence[str]) -> tuple[str, ...]:
    return tuple(m.removesuffix(".py").replace("/", ".") + "." for m in modules)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.mutate.python", description=__doc__)
    parser.add_argument("modules", nargs="+", help="library modules, e.g. agentdb/hashing.py")
    parser.add_argument("--tests", nargs="+", help="the tests to run (default: by module)")
    parser.add_argument("--dsn", help="Postgres for the tests (default: $AGENTDB_TEST_DSN)")
    parser.add_argument("--out", type=Path, default=Path("mutation-results/python"))
    args = parser.parse_args(argv)
    root = _root()
    os.chdir(root)
    for module in args.modules:
        if not module.startswith("agentdb/") or module.startswith("agentdb/tools/"):
            parser.error(f"{module}: only the library's modules (agentdb/, not agentdb/tools/)")
        if not (root / module).is_file():
            parser.error(f"{module}: no such file")
    tests = args.tests or sorted({t for m in args.modules for t in _tests_of(m)})
    for target in tests:
        if not (root / target.split("::")[0]).is_file():
            parser.error(f"{target}: no such test file")
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="agentdb-mutmut-") as tmp,
        _database(args.dsn) as dsn,
    ):
        copy = _scratch(root, Path(tmp) / "checkout")
        with (copy / "pyproject.toml").open("a", encoding="utf-8") as f:
            f.write(_config(args.modules, tests))
        env = dict(os.environ, AGENTDB_TEST_DSN=dsn)
        ran = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", "2"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        codes = _verdicts(copy, args.modules)
        if not codes or None in codes.values():  # mutmut stopped before it checked them all
            print(ran.stdout[-3000:], ran.stderr[-3000:], sep="\n", file=sys.stderr)
            print("agentdb mutate-python: mutmut did not check every mutant", file=sys.stderr)
            return 2
        diffs = {n: _diff(copy, n) for n, c in codes.items() if c in _LIVE}
    equivalent = read_equivalent(root)
    text = _report(codes, diffs, equivalent, args.modules, tests, time.monotonic() - started)
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "report.md"
    report.write_text(text, encoding="utf-8")
    print(text.split("\n## ")[0].strip())
    print(f"report: {report}")
    gaps = any(c in _LIVE and n not in equivalent for n, c in codes.items())
    return 1 if gaps else 0


if __name__ == "__main__":
    raise SystemExit(main())
