"""The handlers the README shows (examples/handlers.py), run by the real worker on Postgres."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import asyncpg
import pytest

from agentdb import signals, tasks
from agentdb.testing import drain
from tests.conftest import Tenants

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def handlers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_handlers", ROOT / "examples/handlers.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_readme_handlers_run_as_shown(
    pool: asyncpg.Pool, tenants: Tenants, handlers: ModuleType
) -> None:
    t = tenants.a
    paid = await tasks.create(
        pool, t, "send_invoice", params={"invoice": 1, "lines": [100, 250], "email": "a@b.c"}
    )
    approved = await tasks.create(pool, t, "pay_invoice", params={"amount": 70})
    rejected = await tasks.create(pool, t, "pay_invoice", params={"amount": 80})
    by_hand = await tasks.create(pool, t, "pay_invoice_by_hand")
    parent = await tasks.create(pool, t, "invoice", params={"lines": [3, 4, 5]})
    await drain(pool, handlers.HANDLERS)
    for waiting in (approved, rejected, by_hand):
        assert (await tasks.get(pool, t, waiting.id)).state == "waiting"
    await signals.approve(pool, t, approved.id, approver="alice")
    await signals.approve(pool, t, rejected.id, approver="bob", decision="rejected",
                          comment="over budget")  # fmt: skip
    await signals.approve(pool, t, by_hand.id, approver="carol")
    await drain(pool, handlers.HANDLERS)
    states = {x.id: (await tasks.get(pool, t, x.id)) for x in (paid, approved, rejected, by_hand,
                                                             parent)}  # fmt: skip
    assert {k: v.state for k, v in states.items()} == {
        paid.id: "succeeded", approved.id: "succeeded", rejected.id: "failed",
        by_hand.id: "succeeded", parent.id: "succeeded",
    }  # fmt: skip
    assert states[rejected.id].last_error == "rejected by bob: over budget"
    assert [c["amount"] for c in handlers.psp.charges.values()] == [350, 70]  # each once
    assert len(handlers.mail.sent) == 1
    total = await pool.fetchval(
        "SELECT payload->>'total' FROM agent_events WHERE task_id = $1"
        " AND event_type = 'task.succeeded'",
        parent.id,
    )
    assert total == "12"
