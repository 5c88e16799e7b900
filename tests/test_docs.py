"""Every code block of the docs runs in a test: the README and every page under docs/.

The rules (as the README's were): a ``python`` block is a whole example file
(``examples/*.py``, which its own test runs), an excerpt of one a test runs (a
handler), an audit test for your suite (run on a fresh schema), or lines of the
API, run as written against a task of a test tenant claimed under a lease. A
``sh`` or ``bash`` block's ``agentdb`` lines are parsed by the real CLI parser,
its ``make`` targets exist, its ``pip install`` lines name this project, and the
first commands for a user's own database run in order on a fresh one. Blocks in
any other language (``text``, ``json``, ``sql``, none) are output or reference,
checked where they are generated or by their own tests. The site builds with
``mkdocs build --strict``, and every relative link and anchor resolves.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentdb import leases, tasks
from tests import _pg
from tests.conftest import Tenants

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
EXAMPLES = {p.name: p.read_text() for p in (ROOT / "examples").glob("*.py")}
#: The example files a test runs as written, whose excerpts a page may show.
RUN_EXAMPLES = ("handlers.py", "first_agent.py")


def page(relative: str) -> str:
    return (DOCS / relative).read_text()


def blocks(lang: str, pages: list[Path] = PAGES) -> list[tuple[Path, str]]:
    """Every ``lang`` block of the pages (``sh`` and ``bash`` alike), with its page."""
    langs = "sh|bash" if lang in ("sh", "bash") else re.escape(lang)
    return [
        (path, block)
        for path in pages
        for block in re.findall(rf"^```(?:{langs})\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    ]


def python_blocks_of(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


# ---- shell blocks ------------------------------------------------------------------------------


def _shell_lines() -> list[tuple[Path, str]]:
    """Every command line of the shell blocks, comments stripped."""
    lines: list[tuple[Path, str]] = []
    for path, block in blocks("sh"):
        for raw in block.splitlines():
            line = raw.split("  #")[0].split(" # ")[0].strip()
            if line and not line.startswith("#"):
                lines.append((path, line))
    return lines


def _agentdb_argv(line: str) -> list[str] | None:
    """The argv of an ``agentdb ...`` command on a line (before any pipe or redirect)."""
    command = re.split(r"\s[|>]\s", line)[0]
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]  # a leading VAR=value
    if not words or words[0] != "agentdb":
        return None
    return [w.replace("…", "0000") for w in words[1:]]


def test_every_agentdb_command_in_the_docs_is_accepted_by_the_cli() -> None:
    """Each is parsed by the real parser: a renamed command or flag fails here."""
    from agentdb.tools.cli import build_parser

    commands = [(p, argv) for p, line in _shell_lines() if (argv := _agentdb_argv(line))]
    assert len(commands) >= 40
    for path, argv in commands:
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"{path.name}: `agentdb {' '.join(argv)}` is refused") from exc


def test_every_make_target_in_the_docs_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    used = {
        m.group(1) for _, line in _shell_lines() for m in re.finditer(r"\bmake ([a-z-]+)", line)
    }
    assert {"demo", "test", "install"} <= used
    assert used <= targets, used - targets


def test_every_install_line_in_the_docs_installs_this_project() -> None:
    """On PyPI `agentdb` is an unrelated project: install lines name agentdb-pg or a path."""
    installs = [line for _, line in _shell_lines() if "pip install" in line]
    for path in PAGES:
        installs += re.findall(r"pip install [^`\n]+", path.read_text())
    assert installs
    for line in installs:
        words = line.split("pip install", 1)[1].split("#")[0].split()
        target = next(w for w in words if not w.startswith("-")).strip("'\")")
        assert target.startswith(("agentdb-pg", ".")), line


def _schema_commands(text: str, heading: str) -> list[str]:
    section = text[text.index(heading) :]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line.startswith("agentdb ")]


@pytest.mark.parametrize(
    ("source", "heading"),
    [
        ("docs/getting-started/install.md", "## Put the schema into your Postgres"),
        ("README.md", "the schema into your Postgres, as the role"),
    ],
)
def test_the_put_the_schema_block_runs_as_written(
    pg_server: _pg.Server, source: str, heading: str
) -> None:
    """A page's first commands for a user's own database, run in order on a fresh one."""
    commands = _schema_commands((ROOT / source).read_text(), heading)
    assert len(commands) >= 4
    with _pg.temp_database(pg_server) as name:
        env = dict(os.environ, DATABASE_URL=pg_server.url(name), PYTHONPATH=str(ROOT))
        env.pop("AGENTDB_POOLER", None)
        for line in commands:
            run = subprocess.run(
                [sys.executable, "-m", "agentdb", *shlex.split(line)[1:]], cwd=ROOT, env=env,
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert run.returncode == 0, (line, run.stderr)


# ---- whole example files -----------------------------------------------------------------------


def test_the_effects_guide_shows_the_quickstart_file() -> None:
    assert EXAMPLES["quickstart.py"] in python_blocks_of(page("guides/effects.md"))


def test_quickstart_runs_on_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "task succeeded at state_version 2" in out.stdout
    assert "retry fresh=False" in out.stdout


def test_the_first_agent_page_is_the_example_file_in_50_lines() -> None:
    example = EXAMPLES["first_agent.py"]
    assert example in python_blocks_of(page("getting-started/first-agent.md"))
    assert len([line for line in example.splitlines() if line.strip()]) <= 50
    for step in ("tasks.create(", "Worker(", "tasks.get(", "signals.approve("):
        assert step in example  # enqueue it, run the worker, watch it, approve it


def test_the_first_agent_runs_on_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "first_agent.py")],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "refund succeeded, steps recorded: ['lookup', 'review', 'cool-off']" in out.stdout


def test_the_testing_guide_shows_the_example_test_file() -> None:
    assert python_blocks_of(page("guides/testing.md")) == [EXAMPLES["test_my_handlers.py"]]


@pytest.mark.parametrize("server", ["embedded", "AGENTDB_TEST_DSN"])
def test_the_example_test_file_runs_green_as_written(
    server: str, pg_server: _pg.Server, tmp_path: Path
) -> None:
    """In a directory of its own (none of this project's pytest configuration), with the
    plugin pytest finds by its entry point: an embedded Postgres, then the suite's server."""
    shutil.copy(ROOT / "examples" / "test_my_handlers.py", tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AGENTDB_TEST_DSN", "DATABASE_URL", "AGENTDB_POOLER")
    }
    if server == "AGENTDB_TEST_DSN":
        env["AGENTDB_TEST_DSN"] = pg_server.admin_dsn
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_handlers.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"\b3 passed\b", out.stdout), out.stdout[-2000:]
    assert "skipped" not in out.stdout


# ---- excerpts and fragments --------------------------------------------------------------------


def _is_whole_example(block: str) -> bool:
    return block in EXAMPLES.values()


def _handler_blocks() -> list[tuple[Path, str]]:
    """The python blocks that define a handler (``async def ...(job: Job)``) and are not a
    whole example file."""
    return [
        (path, b)
        for path, b in blocks("python")
        if re.search(r"async def \w+\(job: (?:worker\.)?Job\)", b) and not _is_whole_example(b)
    ]


def test_every_handler_in_the_docs_is_one_the_suite_runs() -> None:
    """Each handler block is an excerpt of examples/handlers.py (whose handlers
    tests/test_examples.py runs against Postgres) or of examples/first_agent.py (run above):
    none is shown that no test ran."""
    shown = _handler_blocks()
    assert len(shown) >= 5
    for path, block in shown:
        assert any(block in EXAMPLES[name] for name in RUN_EXAMPLES), (path.name, block)


def _fragments() -> list[tuple[Path, str]]:
    """The other python blocks: lines of the API run against a database you have
    (``pool``, ``tenant``, a claimed ``task_id`` with its ``lease``...)."""
    return [
        (path, b)
        for path, b in blocks("python")
        if not any(b in source for source in EXAMPLES.values())
    ]


async def test_every_other_python_block_in_the_docs_runs(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Each block runs as written, in a fresh context: a new task of the tenant, claimed
    under a lease - what the names the blocks use stand for. (The audit test the docs
    suggest for your suite is run by test_the_audit_test_passes_on_a_fresh_schema.)"""
    ran = 0
    for i, (path, block) in enumerate(_fragments()):
        if "def test_" in block:
            continue
        task_type = f"docs-{i}"
        created = await tasks.create(pool, tenants.a, task_type)
        [held] = await leases.claim(pool, "docs-worker", task_types=[task_type])
        body = textwrap.indent(block, "    ")
        code = compile(f"async def _block():\n{body}\n", f"{path.name} block {i}", "exec")
        scope: dict[str, Any] = {
            "pool": pool, "tenant": tenants.a, "task_id": created.id, "task": created.id,
            "key": f"docs-{i}/call", "request": {"prompt": "hello"}, "lease": held.lease,
        }  # fmt: skip
        exec(code, scope)
        await scope["_block"]()
        ran += 1
    assert ran >= 7  # budgets, cancel, deadline, signals, schedules, approvals, outbox


def test_the_audit_test_passes_on_a_fresh_schema(
    pg_server: _pg.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    [(path, block)] = [(p, b) for p, b in _fragments() if "def test_" in b]
    assert path == DOCS / "audit.md"
    scope: dict[str, Any] = {}
    exec(compile(block, str(path), "exec"), scope)
    [test] = [f for name, f in scope.items() if name.startswith("test_")]
    with _pg.temp_database(pg_server) as name:
        from agentdb import migrate

        migrate.migrate(pg_server.url(name))
        with _pg.admin(pg_server.admin_dsn) as conn:
            _pg.ensure_role(conn, "agentdb_test_auditor")
        login = pg_server.url(name, user="agentdb_test_auditor", password=_pg.TEST_PASSWORD)
        monkeypatch.setenv("DATABASE_URL", login)
        test()


def test_every_python_and_shell_block_is_covered_by_a_rule() -> None:
    """Nothing falls between the rules: every python block is a whole example, an excerpt
    one of them runs, or a fragment run above; no other language hides runnable code."""
    for path, block in blocks("python"):
        kinds = [
            _is_whole_example(block),
            (path, block) in _handler_blocks(),
            (path, block) in _fragments(),
        ]
        assert any(kinds), (path.name, block[:80])
    for path in PAGES:
        langs = set(re.findall(r"^```(\w*)$", path.read_text(), flags=re.M))
        assert langs <= {"", "python", "sh", "bash", "text", "json", "sql"}, (path.name, langs)


# ---- the site ----------------------------------------------------------------------------------


def test_the_generated_pages_are_current() -> None:
    from dev import docs

    assert docs.stale() == [], "run `make readme`"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    """mkdocs --strict fails on a page left out of the nav, a broken link or anchor."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
         "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "llms.txt").exists()


def _anchors(path: Path) -> set[str]:
    from markdown.extensions.toc import slugify

    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slugify(h, "-") for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_relative_link_and_anchor_resolves() -> None:
    """In the README and every docs page (the check mkdocs makes for docs/, made for the
    README too, which GitHub renders from the repository's root)."""
    checked = 0
    for path in PAGES:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.exists(), f"{path.relative_to(ROOT)}: {target}"
            if anchor:
                assert anchor in _anchors(resolved), f"{path.relative_to(ROOT)}: {target}"
            checked += 1
    assert checked >= 50


def test_llms_txt_names_every_page() -> None:
    llms = (DOCS / "llms.txt").read_text()
    for path in DOCS.rglob("*.md"):
        assert str(path.relative_to(DOCS)) in llms, path
