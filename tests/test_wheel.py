"""The release: `python -m build` makes a wheel and an sdist `twine check` passes, the wheel
holds the product and nothing that needs a checkout, and installed alone into a clean
virtualenv (its dependencies from the package index, as tests/integrations/test_extras.py
installs the extras) it migrates a database, runs a durable handler, and runs the testing
kit's example test file with its pytest plugin."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import _pg

ROOT = Path(__file__).resolve().parent.parent
# Building needs hatchling from the index and the install the dependencies: minutes, not
# the suite's default 300 s.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    [found] = dist.glob("agentdb_pg-*-py3-none-any.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean virtualenv with the wheel and its testing extra (pytest, pytest-asyncio,
    pgserver): what `pip install 'agentdb-pg[testing]'` gives a user."""
    where = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    pip = [str(where / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "install", f"{wheel}[testing]"], check=True, timeout=900, capture_output=True
    )
    return where


def _env(**extra: str) -> dict[str, str]:
    # Nothing of the checkout's: no PYTHONPATH, no database the command did not get.
    drop = ("PYTHONPATH", "AGENTDB_TEST_DSN", "DATABASE_URL", "AGENTDB_POOLER", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def _run(
    venv: Path, cmd: list[str], cwd: Path, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    exe = venv / "bin" / cmd[0]
    return subprocess.run(
        [str(exe), *cmd[1:]], cwd=cwd, env=_env(**env), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def test_build_and_twine_check_pass(dist: Path) -> None:
    assert len(list(dist.glob("*.whl"))) == 1
    assert len(list(dist.glob("*.tar.gz"))) == 1
    out = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def _shipped() -> set[str]:
    """What the wheel must carry: every file of the package in the checkout, and the
    migrations (sql/) under agentdb/_sql."""
    package = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "agentdb").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    sql = {
        "agentdb/_sql/" + p.relative_to(ROOT / "sql").as_posix()
        for p in (ROOT / "sql").rglob("*")
        if p.is_file()
    }
    return package | sql


def test_the_wheel_carries_the_product_and_nothing_that_needs_a_checkout(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sources = {n: z.read(n).decode() for n in names if n.endswith(".py")}
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(meta).decode()
        entry_points = z.read(meta.replace("METADATA", "entry_points.txt")).decode()
    files = {n for n in names if not re.match(r"agentdb_pg-[^/]+\.dist-info/", n)}
    assert files == _shipped()
    # The library, the CLI, the statements and migrations, the testing kit, the adapters.
    for needed in (
        "agentdb/worker/__init__.py",
        "agentdb/tools/cli.py",
        "agentdb/queries/tasks.sql",
        "agentdb/_citus/queries/routed.sql",
        "agentdb/_db/queries/pool.sql",
        "agentdb/_sql/migrations/0001.foundation.sql",
        "agentdb/_sql/schema.sql",
        "agentdb/testing/plugin.py",
        "agentdb/integrations/mcp.py",
        "agentdb/py.typed",
    ):
        assert needed in files, needed
    assert not [n for n in names if "mutate" in n or n.startswith(("dev/", "tests/", "examples/"))]
    assert not [n for n in names if "schema_state" in n]
    # Nothing reaches above the installed package (a checkout's README, sql/, tests/).
    assert not [n for n, text in sources.items() if "parents[" in text or '"README.md"' in text]
    assert "agentdb = agentdb.tools._entry:main" in entry_points
    assert "agentdb = agentdb.testing.plugin" in entry_points
    # yoyo is the suite's, not a user's: only the test extra asks for it.
    yoyo = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: yoyo")]
    assert "Requires-Dist: yoyo-migrations>=9.0.0; extra == 'test'" in yoyo
    assert all("; extra == " in line for line in yoyo), yoyo


@pytest.fixture
def fresh_database(pg_server: _pg.Server) -> Iterator[str]:
    with _pg.temp_database(pg_server) as name:
        yield pg_server.url(name)


_HANDLER = '''
"""A straight-line durable handler, written from the package's front door only."""
import asyncio
import sys

from agentdb import Job, Succeed, Worker, create_pool, tasks, tenancy

calls = []


async def quote(amount: int) -> int:
    return amount * 2


async def charge(total: int, *, idempotency_key: str) -> dict[str, str]:
    calls.append(idempotency_key)
    return {"charge": "ch_" + idempotency_key[-8:], "total": str(total)}


async def invoice(job: Job) -> Succeed:
    total = await job.step("quote", quote, job.task.params["amount"])
    paid = await job.effect("charge", charge, total)
    return Succeed(payload=paid)


async def main(dsn: str) -> None:
    pool = await create_pool(dsn)
    try:
        tenant = await tenancy.create_tenant(pool, "acme")
        task = await tasks.create(pool, tenant, "invoice", params={"amount": 21})
        worker = Worker(pool, {"invoice": invoice}, poll_interval=0.1)
        running = asyncio.create_task(worker.run(install_signals=False))
        for _ in range(300):
            done = await tasks.get(pool, tenant, task.id)
            if done.state in ("succeeded", "failed", "dead"):
                break
            await asyncio.sleep(0.1)
        worker.stop()
        await running
        print(done.state, len(calls))
    finally:
        await pool.close()


asyncio.run(main(sys.argv[1]))
'''


def test_the_installed_wheel_migrates_and_runs_a_durable_handler(
    venv: Path, fresh_database: str, tmp_path: Path
) -> None:
    where = _run(venv, ["python", "-c", "import agentdb; print(agentdb.__file__)"], tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # not the checkout's
    migrated = _run(venv, ["agentdb", "migrate", "--dsn", fresh_database], tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert "applied 0001.foundation" in migrated.stdout, migrated.stdout
    script = tmp_path / "invoice.py"
    script.write_text(textwrap.dedent(_HANDLER), encoding="utf-8")
    ran = _run(venv, ["python", str(script), fresh_database], tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["succeeded", "1"]  # the effect called once
    # The first-agent page's own handler, as the page runs it (examples/first_agent.py).
    first = _run(
        venv, ["python", str(ROOT / "examples" / "first_agent.py")], tmp_path, timeout=180,
        DATABASE_URL=fresh_database,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("refund succeeded, steps recorded: ["), first.stdout


def test_the_installed_wheel_has_the_demo_and_the_operator_commands(
    venv: Path, tmp_path: Path
) -> None:
    for command in ("demo", "worker", "relay", "status", "audit", "console", "tenant", "sql"):
        out = _run(venv, ["agentdb", command, "--help"], tmp_path)
        assert out.returncode == 0, f"agentdb {command} --help: {out.stderr}"
        assert out.stdout.startswith(f"usage: agentdb {command}"), out.stdout


def test_the_testing_kits_example_runs_green_with_the_installed_plugin(
    venv: Path, pg_server: _pg.Server, tmp_path: Path
) -> None:
    """README "Testing your handlers": examples/test_my_handlers.py, in a directory of its
    own, with the pytest the testing extra installed and the plugin it finds by entry point."""
    shutil.copy(ROOT / "examples" / "test_my_handlers.py", tmp_path)
    out = _run(
        venv,
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_handlers.py"],
        tmp_path,
        timeout=600,
        AGENTDB_TEST_DSN=pg_server.admin_dsn,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"\b3 passed\b", out.stdout), out.stdout[-2000:]
