"""The README's example is examples/quickstart.py, and it runs as written (embedded default)."""

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


def test_readme_example_is_the_quickstart_file() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert (ROOT / "examples" / "quickstart.py").read_text() in blocks


def test_quickstart_runs_on_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "task succeeded at state_version 2" in out.stdout
    assert "retry fresh=False" in out.stdout


def _shell_lines() -> list[str]:
    """Every command line of the README's ``sh`` blocks, comments stripped."""
    readme = (ROOT / "README.md").read_text()
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", readme, flags=re.S):
        for raw in block.splitlines():
            line = raw.split("  #")[0].split(" # ")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def _agentdb_argv(line: str) -> list[str] | None:
    """The argv of an ``agentdb ...`` command on a README line (before any pipe or redirect)."""
    command = re.split(r"\s[|>]\s", line)[0]
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]  # a leading VAR=value
    if not words or words[0] != "agentdb":
        return None
    return [w.replace("…", "0000") for w in words[1:]]


def test_every_agentdb_command_in_the_readme_is_accepted_by_the_cli() -> None:
    """Each is parsed by the real parser: a renamed command or flag fails here."""
    from agentdb.tools.cli import build_parser

    commands = [argv for line in _shell_lines() if (argv := _agentdb_argv(line)) is not None]
    assert len(commands) >= 15
    for argv in commands:
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"README: `agentdb {' '.join(argv)}` is refused") from exc


def test_every_make_target_in_the_readme_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    used = {
        m.group(1) for line in _shell_lines() for m in [re.search(r"\bmake ([a-z-]+)", line)] if m
    }
    assert used
    assert used <= targets, used - targets


def test_every_install_line_in_the_readme_installs_this_project() -> None:
    """On PyPI `agentdb` is an unrelated project: install lines name agentdb-pg or a path."""
    installs = [line for line in _shell_lines() if "pip install" in line]
    readme = (ROOT / "README.md").read_text()
    installs += re.findall(r"pip install [^`\n]+", readme)
    assert installs
    for line in installs:
        words = line.split("pip install", 1)[1].split("#")[0].split()
        target = next(w for w in words if not w.startswith("-")).strip("'\")")
        assert target.startswith(("agentdb-pg", ".")), line


def test_the_put_the_schema_block_runs_as_written(pg_server: _pg.Server) -> None:
    """The README's first commands for a user's own database, run in order on a fresh one."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Put the schema into your Postgres") :]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    lines = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    commands = [line for line in lines if line.startswith("agentdb ")]
    assert len(commands) >= 4
    with _pg.temp_database(pg_server) as name:
        env = dict(os.environ, DATABASE_URL=pg_server.url(name), PYTHONPATH=str(ROOT))
        env.pop("AGENTDB_POOLER", None)
        for line in commands:
            argv = shlex.split(line)[1:]
            run = subprocess.run(
                [sys.executable, "-m", "agentdb", *argv], cwd=ROOT, env=env,
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert run.returncode == 0, (line, run.stderr)


def test_readme_testing_section_shows_the_example_test_file() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Testing your handlers") : readme.index("## Behind PgBouncer")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks == [(ROOT / "examples" / "test_my_handlers.py").read_text()]


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


def test_the_first_agent_in_the_readme_is_the_example_file() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert (ROOT / "examples" / "first_agent.py").read_text() in blocks


def test_the_first_agent_runs_on_the_embedded_default() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "first_agent.py")],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "refund succeeded, steps recorded: ['lookup', 'review', 'cool-off']" in out.stdout


def _handler_blocks() -> list[str]:
    """The README's python blocks that define a handler (``async def ...(job: Job)``) and are
    not a whole example file."""
    readme = (ROOT / "README.md").read_text()
    whole = {p.read_text() for p in (ROOT / "examples").glob("*.py")}
    return [
        b
        for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S)
        if re.search(r"async def \w+\(job: Job\)", b) and b not in whole
    ]


def test_every_handler_in_the_readme_is_one_the_suite_runs() -> None:
    """Each handler block is an excerpt of examples/handlers.py, whose handlers
    tests/test_examples.py runs against Postgres: none is shown that no test ran."""
    source = (ROOT / "examples" / "handlers.py").read_text()
    blocks = _handler_blocks()
    assert len(blocks) >= 4
    for block in blocks:
        assert block in source, block


def _fragments() -> list[str]:
    """The README's other python blocks: lines of the API run against a database you have
    (``pool``, ``tenant``, a claimed ``task_id`` with its ``lease``...)."""
    readme = (ROOT / "README.md").read_text()
    whole = {p.read_text() for p in (ROOT / "examples").glob("*.py")}
    handlers = (ROOT / "examples" / "handlers.py").read_text()
    return [
        b
        for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S)
        if b not in whole and b not in handlers
    ]


async def test_every_other_python_block_in_the_readme_runs(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Each block runs as written, in a fresh context: a new task of the tenant, claimed
    under a lease - what the names the blocks use stand for. (The audit test the README
    suggests for your suite is run by test_the_readmes_audit_test_passes_on_a_fresh_schema.)"""
    ran = 0
    for i, block in enumerate(_fragments()):
        if "def test_" in block:
            continue
        task_type = f"readme-{i}"
        created = await tasks.create(pool, tenants.a, task_type)
        [held] = await leases.claim(pool, "readme-worker", task_types=[task_type])
        body = textwrap.indent(block, "    ")
        code = compile(f"async def _block():\n{body}\n", f"README.md block {i}", "exec")
        scope: dict[str, Any] = {
            "pool": pool, "tenant": tenants.a, "task_id": created.id, "task": created.id,
            "key": f"readme-{i}/call", "request": {"prompt": "hello"}, "lease": held.lease,
        }  # fmt: skip
        exec(code, scope)
        await scope["_block"]()
        ran += 1
    assert ran >= 5


def test_the_readmes_audit_test_passes_on_a_fresh_schema(
    pg_server: _pg.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    [block] = [b for b in _fragments() if "def test_" in b]
    scope: dict[str, Any] = {}
    exec(compile(block, "README.md", "exec"), scope)
    [test] = [f for name, f in scope.items() if name.startswith("test_")]
    with _pg.temp_database(pg_server) as name:
        from agentdb import migrate

        migrate.migrate(pg_server.url(name))
        with _pg.admin(pg_server.admin_dsn) as conn:
            _pg.ensure_role(conn, "agentdb_test_auditor")
        login = pg_server.url(name, user="agentdb_test_auditor", password=_pg.TEST_PASSWORD)
        monkeypatch.setenv("DATABASE_URL", login)
        test()
