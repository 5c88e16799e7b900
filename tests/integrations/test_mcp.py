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
from mcp_types import (
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolResult,
    CreateMessageResult,
    ElicitResult,
    TextContent,
)

from agentdb import tasks
from agentdb.errors import ConfigurationError
from agentdb.integrations.mcp import LEDGER_TYPE, ask
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


async def test_a_task_says_its_ttl_and_only_a_client_declaring_the_extension_gets_one(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:  # control: declares it
        task_id = await start_task(client, "report", {"rows": 1})
        found = await get_task(client, task_id)
    assert found["ttlMs"] == 3_600_000  # the server's `ttl`: its purge retention
    async with connect(server.url, tenants.a, tasks=False) as plain:
        with pytest.raises(MCPError) as refused:
            await plain.session.call_tool("report", {"rows": 1}, allow_claimed=True)
        assert refused.value.error.code == MISSING_REQUIRED_CLIENT_CAPABILITY
        with pytest.raises(MCPError) as also:
            await get_task(plain, task_id)
        assert also.value.error.code == MISSING_REQUIRED_CLIENT_CAPABILITY
    types = await recorded.fetchval(
        "SELECT count(*) FROM agent_tasks WHERE task_type LIKE 'mcp.tool/%'"
    )
    assert types == 1  # the refused call made no task


async def test_a_tools_error_is_a_completed_result_and_a_jsonrpc_error_a_failed_task(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    """The extension: ``failed`` is for a JSON-RPC error only; a tool's error is a
    ``completed`` task with an ``isError`` result - at once for a ToolError, after the
    task's retries for a crash (the result says why)."""
    async with connect(server.url, tenants.a) as client:
        refused = await start_task(client, "broken", {"how": "refuse"})
        crashed = await start_task(client, "broken", {"how": "crash"})
        jsonrpc = await start_task(client, "broken", {"how": "jsonrpc"})
        control = await start_task(client, "report", {"rows": 1})
        found = {
            name: await _until(client, task_id, "completed", "failed", "cancelled")
            for name, task_id in (
                ("refuse", refused), ("crash", crashed), ("jsonrpc", jsonrpc), ("ok", control)
            )
        }  # fmt: skip
    assert found["ok"]["status"] == "completed"
    assert found["ok"]["result"]["isError"] is False
    assert found["refuse"]["status"] == "completed"
    assert found["refuse"]["result"]["isError"] is True
    assert "no report for you" in found["refuse"]["result"]["content"][0]["text"]
    assert found["crash"]["status"] == "completed"
    assert found["crash"]["result"]["isError"] is True
    assert found["crash"]["statusMessage"] == "the tool failed on each of its 3 attempts"
    assert "crashed" not in str(found["crash"])  # what it raised is the operators
    assert found["jsonrpc"]["status"] == "failed"
    assert found["jsonrpc"]["error"]["code"] == INVALID_PARAMS
    assert found["jsonrpc"]["error"]["message"] == "the report source is gone"
    attempts = await recorded.fetchval(
        "SELECT attempts FROM agent_tasks WHERE id = $1", uuid.UUID(crashed)
    )
    assert attempts == 3  # the crash was retried as the task's policy says
    why = await recorded.fetchval(
        "SELECT last_error FROM agent_tasks WHERE id = $1", uuid.UUID(crashed)
    )
    assert why == "RuntimeError: the report generator crashed"


async def test_url_mode_and_sampling_input_requests_are_answered_once_each(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    read = ElicitResult(action="accept").model_dump(by_alias=True, mode="json")
    declined = ElicitResult(action="decline").model_dump(by_alias=True, mode="json")
    said = CreateMessageResult(
        role="assistant", model="test-model", content=TextContent(type="text", text="fine")
    ).model_dump(by_alias=True, mode="json", exclude_none=True)
    async with connect(server.url, tenants.a) as client:
        task_id = await start_task(client, "consult", {"topic": "fees"})
        page = await _until(client, task_id, "input_required")
        [(key, asked)] = page["inputRequests"].items()
        assert (key, asked["params"]["mode"]) == ("page", "url")
        assert asked["params"]["url"] == "https://example.test/fees"
        await update_task(client, task_id, {"page": read})
        sampling = await _until(client, task_id, "input_required")
        [(key, asked)] = sampling["inputRequests"].items()
        assert (key, asked["method"]) == ("model", "sampling/createMessage")
        with pytest.raises(MCPError, match="already answered"):
            await update_task(client, task_id, {"page": declined})  # a key is answered once
        await update_task(client, task_id, {"model": said})
        done = await _until(client, task_id, "completed")
    assert done["result"]["structuredContent"] == {
        "read": "accept", "model": "test-model", "said": "fine"
    }  # fmt: skip


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


async def test_ask_takes_a_form_or_a_url_and_only_inside_a_long_running_tool() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        await ask("k", "which?")
    with pytest.raises(ConfigurationError, match="exactly one"):
        await ask("k", "which?", {"type": "object"}, url="https://example.test/")
    with pytest.raises(ConfigurationError, match="long_running"):
        await ask("k", "which?", url="https://example.test/")  # control: well formed
