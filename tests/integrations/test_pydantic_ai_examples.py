"""Pydantic AI's own documented examples, and the frameworks guide's first one, run on agentdb as
written (examples/pydantic_ai_*.py): the framework's code unchanged but for the wrapper
line and an offline model."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import asyncpg

from agentdb import signals, tasks
from agentdb.integrations.pydantic_ai import approval_name, pending_approvals
from agentdb.testing import drain
from tests.conftest import Tenants

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str) -> ModuleType:
    """examples/<name>.py, imported as the file it is (examples/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


pydantic_ai_approvals = _example("pydantic_ai_approvals")
pydantic_ai_bank_support = _example("pydantic_ai_bank_support")
_OPERATIONS = (
    "SELECT action, state, idempotency_key, result::text FROM agent_operations WHERE task_id = $1"
)
_OUTPUT = (
    "SELECT payload::text FROM agent_events WHERE task_id = $1 AND event_type = 'task.succeeded'"
)


async def test_G25_the_bank_support_example_runs_as_a_task_its_tool_call_an_effect(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(
        pool, tenants.a, "bank", params={"customer_id": 123, "question": "What is my balance?"}
    )
    done = await drain(pool, {"bank": pydantic_ai_bank_support.bank_support})
    assert done.count("succeeded") == 1
    [op] = await pool.fetch(_OPERATIONS, task.id)
    assert (op["action"], op["state"]) == ("customer_balance", "succeeded")
    assert op["idempotency_key"].endswith("call_tool:customer_balance")
    # The tool ran with the run's deps (the fake database's balance), recorded once.
    assert "$1" in op["result"]
    output = json.loads(await pool.fetchval(_OUTPUT, task.id))
    assert set(output) == {"support_advice", "block_card", "risk"}


async def test_G22_the_approval_example_waits_for_agentdb_approvals_and_honours_them(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "files")
    handlers = {"files": pydantic_ai_approvals.files}
    await drain(pool, handlers)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "waiting"
    # Asked one at a time (in the framework's order); the README.md update needs none.
    [asked] = await pending_approvals(pool, tenants.a, task.id)
    assert asked["signal"] in {approval_name("delete"), approval_name("env")}, asked
    await signals.approve(pool, tenants.a, task.id, approver="ops", name=approval_name("delete"))
    await signals.approve(
        pool, tenants.a, task.id, approver="ops", decision="rejected", comment="keep it",
        name=approval_name("env"),
    )  # fmt: skip
    done = await drain(pool, handlers)
    assert done.count("succeeded") == 1
    ops = await pool.fetch(_OPERATIONS, task.id)
    performed = sorted((r["action"], r["state"]) for r in ops)
    # README.md's update and the approved delete; .env's update asked for approval
    # (recorded failed: it did nothing) and was rejected, never called again.
    assert performed == [
        ("delete_file", "succeeded"),
        ("update_file", "failed"),
        ("update_file", "succeeded"),
    ]
    output = json.loads(await pool.fetchval(_OUTPUT, task.id))["output"]
    assert output == (
        "File '__init__.py' deleted; File 'README.md' updated: 'Hello, world!'; "
        "The call was rejected by ops: keep it"
    )


def test_the_frameworks_guide_shows_the_first_example_as_the_file_is() -> None:
    guide = (ROOT / "docs" / "guides" / "frameworks.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    example = (ROOT / "examples" / "pydantic_ai_agent.py").read_text()
    assert example in blocks
    assert len(example.splitlines()) <= 30


def test_the_pydantic_ai_page_s_first_example_runs_as_written() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pydantic_ai_agent.py")],
        capture_output=True, text=True, timeout=240, check=True, cwd=ROOT,
    )  # fmt: skip
    assert "support succeeded attempts=1" in out.stdout, out.stdout + out.stderr
