"""The MCP server kit against a real server process, driven by the SDK's real client.

Each test starts ``tests/integrations/mcp_server.py`` on loopback (streamable HTTP)
against its own database. Every attack comes with its control: the same request
that succeeds when it is not an attack.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitResult

from agentdb import tasks
from agentdb.integrations.mcp import LEDGER_TYPE
from tests.conftest import Database, Tenants
from tests.integrations.mcp_client import (
    ServerProcess,
    ask_approval,
    cancel_task,
    connect,
    get_task,
    present_approval,
    start_task,
    typed_error,
    update_task,
)
from tests.integrations.mcp_server import payments


@pytest.fixture
def server(db: Database) -> Iterator[ServerProcess]:
    with ServerProcess(db.dsn).running() as proc:
        yield proc


async def _pay(client: Client, key: str | None, to: str = "bob", amount: int = 5) -> CallToolResult:
    return await client.call_tool("pay", {"to": to, "amount": amount}, meta=_key(key))


def _key(key: str | None) -> Any:
    """The request's ``_meta`` with the caller's idempotency key (what Pydantic AI sends)."""
    return None if key is None else {"idempotency_key": key}


async def test_a_repeat_with_a_new_request_is_answered_byte_for_byte(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        first = await _pay(client, "order-1")
    async with connect(server.url, tenants.a) as client:  # a new connection, a new request id
        again = await _pay(client, "order-1")
    assert not first.is_error, first
    assert again.model_dump_json(by_alias=True) == first.model_dump_json(by_alias=True)
    assert len(await payments.effects(recorded)) == 1
    op = await recorded.fetchrow("SELECT state, action, tenant_id FROM agent_operations")
    assert op is not None
    assert (op["state"], op["action"], op["tenant_id"]) == ("succeeded", "pay", tenants.a)


async def test_the_same_key_with_other_arguments_is_a_typed_error(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        first = await _pay(client, "order-2", amount=5)
        control = await _pay(client, "order-2", amount=5)  # the same call: its answer
        attack = await _pay(client, "order-2", amount=500)
    assert not control.is_error
    assert control.structured_content == first.structured_content
    assert typed_error(attack)["type"] == "IdempotencyConflict"
    assert typed_error(attack)["guarantee"] == "G4"
    assert "reference" not in attack.model_dump_json()
    assert len(await payments.effects(recorded)) == 1


async def test_a_call_without_a_tenant_or_a_key_is_refused(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with Client(server.url, cache=None) as anonymous:
        refused = await _pay(anonymous, "order-3")
    async with connect(server.url, tenants.a) as client:
        keyless = await _pay(client, None)
    assert typed_error(refused)["type"] == "TenantMissing"
    assert typed_error(keyless)["type"] == "IdempotencyKeyMissing"
    assert await payments.calls(recorded) == []


async def test_two_tenants_sending_the_same_key_make_two_calls(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as a, connect(server.url, tenants.b) as b:
        paid_a, paid_b = await _pay(a, "shared"), await _pay(b, "shared")
    assert paid_a.structured_content != paid_b.structured_content  # two references
    assert len(await payments.effects(recorded)) == 2


async def test_another_tenants_task_id_is_not_found(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as a, connect(server.url, tenants.b) as b:
        task_id = await start_task(a, "report", {"rows": 1})
        control = await get_task(a, task_id)
        with pytest.raises(MCPError, match="task not found"):
            await get_task(b, task_id)
        with pytest.raises(MCPError, match="task not found"):
            await cancel_task(b, task_id)
        async with connect(server.url, tenants.a, principal="mallory") as other:
            with pytest.raises(MCPError, match="task not found"):
                await get_task(other, task_id)
    assert control["taskId"] == task_id
    assert control["status"] in ("working", "completed")
    assert (await tasks.get(recorded, tenants.a, uuid.UUID(task_id))).state != "cancelled"


async def _until(client: Client, task_id: str, *statuses: str) -> dict[str, Any]:
    for _ in range(600):
        found = await get_task(client, task_id)
        if found["status"] in statuses:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} is still {found['status']}")


async def test_a_long_running_tool_answers_with_a_task_and_its_result(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        task_id = await start_task(client, "report", {"rows": 3})
        done = await _until(client, task_id, "completed", "failed")
    assert done["status"] == "completed", done
    assert done["result"]["structuredContent"] == {"rows": 3, "total": 5}


async def test_an_input_request_is_answered_once_and_not_for_a_cancelled_task(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    yes = ElicitResult(action="accept", content={"go": True}).model_dump(by_alias=True)
    no = ElicitResult(action="decline").model_dump(by_alias=True)
    async with connect(server.url, tenants.a) as client:
        asked = await start_task(client, "report", {"rows": 2, "approve": True})
        waiting = await _until(client, asked, "input_required")
        assert list(waiting["inputRequests"]) == ["go"]
        await update_task(client, asked, {"go": yes})  # control: answered, it runs
        await update_task(client, asked, {"go": yes})  # the same answer again: no change
        with pytest.raises(MCPError, match="already answered"):
            await update_task(client, asked, {"go": no})  # another answer: refused
        done = await _until(client, asked, "completed")
        assert done["result"]["structuredContent"] == {"rows": 2, "total": 1}

        cancelled = await start_task(client, "report", {"rows": 2, "approve": True})
        await _until(client, cancelled, "input_required")
        await cancel_task(client, cancelled)
        with pytest.raises(MCPError, match="takes no input"):
            await update_task(client, cancelled, {"go": yes})  # attack: for a cancelled task
        assert (await get_task(client, cancelled))["status"] == "cancelled"
    rows = await recorded.fetchval(
        "SELECT count(*) FROM agent_steps WHERE task_id = $1 AND name LIKE 'row/%'",
        uuid.UUID(cancelled),
    )
    assert rows == 0


async def test_an_approval_unlocks_one_call_once(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        asked = await ask_approval(client, "approved-1", 7)
        control = await present_approval(client, "approved-1", asked, 7)
        again = await present_approval(client, "approved-1", asked, 7)  # the same call: its answer
        other = await present_approval(client, "approved-2", asked, 7)  # attack: another call
        with pytest.raises(MCPError, match="requestState"):  # the SDK binds the arguments
            await present_approval(client, "approved-1", asked, 700)
    assert not control.is_error, control
    assert again.model_dump_json(by_alias=True) == control.model_dump_json(by_alias=True)
    assert typed_error(other)["type"] == "ApprovalRefused"
    assert len(await payments.effects(recorded)) == 1
    approvals = await recorded.fetchval(
        "SELECT count(*) FROM agent_signals WHERE kind = 'approval'"
    )
    assert approvals == 1


async def test_an_approval_for_a_cancelled_ledger_is_refused(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        asked = await ask_approval(client, "approved-3", 9)
        ledger = await recorded.fetchval(
            "SELECT id FROM agent_tasks WHERE task_type = $1", LEDGER_TYPE
        )
        await tasks.cancel(recorded, tenants.a, ledger, reason="principal suspended")
        refused = await present_approval(client, "approved-3", asked, 9)
    assert typed_error(refused)["type"] == "TaskFinished"
    assert await payments.calls(recorded) == []
    assert await recorded.fetchval("SELECT count(*) FROM agent_signals") == 0


async def test_G16_the_callers_traceparent_is_the_operations_and_its_events_trace(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    meta: Any = {"idempotency_key": "traced", "traceparent": f"00-{trace}-{span}-01"}
    async with connect(server.url, tenants.a) as client:
        await client.call_tool("pay", {"to": "bob", "amount": 1}, meta=meta)
        await _pay(client, "untraced")  # control: no traceparent, no ids
    ops = await recorded.fetch(
        "SELECT id, trace_id, span_id FROM agent_operations ORDER BY created_at"
    )
    assert [(o["trace_id"], o["span_id"]) for o in ops] == [(trace, span), (None, None)]
    events = await recorded.fetch(
        "SELECT DISTINCT trace_id, span_id FROM agent_events"
        " WHERE event_type = 'operation.reserved' AND trace_id IS NOT NULL"
    )
    assert [(e["trace_id"], e["span_id"]) for e in events] == [(trace, span)]
