"""The kit on FastMCP (its middleware), against a real FastMCP server process.

Each test starts ``tests/integrations/fastmcp_server.py`` on loopback (streamable
HTTP) against its own database and drives it with the SDK's real client. What
the kit promises on the SDK's ``MCPServer`` (``test_mcp.py``) holds here too;
these tests add what differs on FastMCP: errors raised through its middleware
chain, arguments it refuses before the body runs, and the approval's
``requestState`` sealed by its boundary. Every attack comes with its control.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from agentdb import tasks
from agentdb.integrations.mcp import ERROR_META, LEDGER_TYPE
from tests.conftest import Database, Tenants
from tests.integrations.mcp_client import (
    ServerProcess,
    ask_approval,
    connect,
    present_approval,
    typed_error,
)
from tests.integrations.mcp_server import payments


@pytest.fixture
def server(db: Database) -> Iterator[ServerProcess]:
    with ServerProcess(db.dsn, module="fastmcp_server").running() as proc:
        yield proc


async def _call(
    client: Client, tool: str, key: str | None, to: str = "bob", amount: Any = 5
) -> CallToolResult:
    meta: Any = None if key is None else {"idempotency_key": key}
    return await client.call_tool(tool, {"to": to, "amount": amount}, meta=meta)


async def _operations(pool: asyncpg.Pool) -> list[tuple[str, str]]:
    rows = await pool.fetch("SELECT action, state FROM agent_operations ORDER BY created_at")
    return [(r["action"], r["state"]) for r in rows]


async def test_a_repeat_is_answered_byte_for_byte_and_other_arguments_are_refused(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        first = await _call(client, "pay", "order-1")
    async with connect(server.url, tenants.a) as client:  # a new connection, a new request id
        again = await _call(client, "pay", "order-1")
        attack = await _call(client, "pay", "order-1", amount=500)
    assert not first.is_error, first
    assert again.model_dump_json(by_alias=True) == first.model_dump_json(by_alias=True)
    assert typed_error(attack)["type"] == "IdempotencyConflict"
    assert "reference" not in attack.model_dump_json()
    assert len(await payments.effects(recorded)) == 1
    assert await _operations(recorded) == [("pay", "succeeded")]


async def test_a_call_without_a_tenant_or_a_key_is_refused(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with Client(server.url, cache=None) as anonymous:
        refused = await _call(anonymous, "pay", "order-2")
    async with connect(server.url, tenants.a) as client:
        keyless = await _call(client, "pay", None)
        control = await _call(client, "pay", "order-2")
    assert typed_error(refused)["type"] == "TenantMissing"
    assert typed_error(keyless)["type"] == "IdempotencyKeyMissing"
    assert not control.is_error
    assert len(await payments.calls(recorded)) == 1


async def test_a_body_that_declines_with_toolerror_is_called_again_on_the_next_attempt(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    """FastMCP's ``ToolError`` raised through its middleware means "refused, nothing
    done": the operation is failed (not unknown), and the retry runs the body."""
    async with connect(server.url, tenants.a) as client:
        declined = await _call(client, "pay_once_declined", "order-3")
        assert declined.is_error, declined
        assert ERROR_META not in (declined.meta or {}), declined
        assert await _operations(recorded) == [("pay_once_declined", "failed")]
        paid = await _call(client, "pay_once_declined", "order-3")
    assert not paid.is_error, paid
    assert await _operations(recorded) == [("pay_once_declined", "succeeded")]
    assert len(await payments.effects(recorded)) == 1


async def test_arguments_that_do_not_validate_never_reach_the_body_and_are_not_unknown(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        bad = await _call(client, "pay", "order-4", amount="five")
    assert bad.is_error, bad
    assert "valid integer" in bad.model_dump_json(), bad
    assert await _operations(recorded) == [("pay", "failed")]
    assert await payments.calls(recorded) == []


async def test_a_body_that_raised_after_its_effect_is_reconciled_never_called_again(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        raised = await _call(client, "pay_then_crash", "order-5")
        assert typed_error(raised)["type"] == "OperationUnknown"
        assert await _operations(recorded) == [("pay_then_crash", "unknown")]
        retried = await _call(client, "pay_then_crash", "order-5")  # the reconcile hook asks
        replayed = await _call(client, "pay_then_crash", "order-5")
    [effect] = await payments.effects(recorded)
    assert not retried.is_error, retried
    assert retried.structured_content == {"reference": effect.reference}
    assert replayed.model_dump_json(by_alias=True) == retried.model_dump_json(by_alias=True)
    assert len(await payments.calls(recorded)) == 1  # the provider was asked once
    assert await _operations(recorded) == [("pay_then_crash", "succeeded")]


async def test_an_approval_unlocks_one_call_once(
    server: ServerProcess, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    async with connect(server.url, tenants.a) as client:
        asked = await ask_approval(client, "approved-1")
        control = await present_approval(client, "approved-1", asked)
        again = await present_approval(client, "approved-1", asked)  # the same call: its answer
        other = await present_approval(
            client, "approved-2", asked
        )  # attack: another call's approval
        with pytest.raises(MCPError, match="requestState"):  # FastMCP's boundary binds it
            await present_approval(client, "approved-1", asked, amount=700)
        ledger = await recorded.fetchval(
            "SELECT id FROM agent_tasks WHERE task_type = $1", LEDGER_TYPE
        )
        late = await ask_approval(client, "approved-3")
        await tasks.cancel(recorded, tenants.a, ledger, reason="principal suspended")
        cancelled = await present_approval(client, "approved-3", late)  # attack: a cancelled ledger
    assert not control.is_error, control
    assert again.model_dump_json(by_alias=True) == control.model_dump_json(by_alias=True)
    assert typed_error(other)["type"] == "ApprovalRefused"
    assert typed_error(cancelled)["type"] == "TaskFinished"
    assert len(await payments.effects(recorded)) == 1
    assert await recorded.fetchval("SELECT count(*) FROM agent_signals") == 1


@pytest.mark.parametrize("module", ["mcp_server", "fastmcp_server"])
async def test_an_approval_asked_before_a_restart_is_taken_after_it_with_a_shared_key(
    db: Database, tenants: Tenants, recorded: asyncpg.Pool, module: str
) -> None:
    """The approval's ``requestState`` is sealed with the server's key: instances that
    share ``RequestStateSecurity(keys=[...])`` take each other's answers (the control:
    the SDK's default, a key per process, refuses an answer asked before a restart)."""
    for shared in (True, False):
        env = {"MCP_STATE_KEY": "k" * 32} if shared else {}
        with ServerProcess(db.dsn, module=module, env=env).running() as server:
            key = f"restart-{shared}"
            async with connect(server.url, tenants.a) as client:
                asked = await ask_approval(client, key)
            server.kill()
            server.start()  # the same port, a new process: a new key unless it is shared
            server.wait_up()
            async with connect(server.url, tenants.a) as client:
                if shared:
                    paid = await present_approval(client, key, asked)
                    assert not paid.is_error, paid
                else:
                    with pytest.raises(MCPError, match="requestState"):
                        await present_approval(client, key, asked)
    assert len(await payments.effects(recorded)) == 1


async def test_a_call_from_inside_the_server_has_no_identity_and_is_refused(
    db: Database, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    from tests.integrations.fastmcp_server import build

    server = build(db.dsn)
    refused = (await server.call_tool("pay", {"to": "bob", "amount": 1})).to_mcp_result()
    assert isinstance(refused, CallToolResult)
    assert typed_error(refused)["type"] == "TenantMissing"
    assert await payments.calls(recorded) == []
