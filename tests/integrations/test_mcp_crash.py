"""MCP servers SIGKILLed at random moments while the SDK's client retries as the spec says.

A broken stream is retried as a new request (a new connection, a new request
id) with the same idempotency key in ``_meta``. The payment servers are the
SDK's ``MCPServer`` (``mcp_server.py``) and FastMCP (``fastmcp_server.py``).
With the kit each payment is performed once per key (counted at the fake
provider, whose ledger is in Postgres), and a replay answers the identical
result; without it (the control, the same server killed the same way) a
retried payment is performed twice. A long-running task is answered and
finished by a second server after the first dies, and a cancel stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter

import asyncpg
import pytest
from mcp_types import CallToolResult

from agentdb.integrations.mcp import ERROR_META
from tests.conftest import Database, Tenants
from tests.integrations.mcp_client import (
    ServerProcess,
    cancel_task,
    connect,
    get_task,
    start_task,
)
from tests.integrations.mcp_server import payments

pytestmark = pytest.mark.timeout(240)
PAYMENTS = 6


async def _pay_until_answered(server: ServerProcess, tenant: uuid.UUID, key: str) -> CallToolResult:
    """The client's side of the spec: a lost answer is asked for again, as a new request."""
    for _ in range(400):
        try:
            async with connect(server.url, tenant) as client:
                result = await client.call_tool(
                    "pay", {"to": key, "amount": 10}, meta={"idempotency_key": key},  # type: ignore[arg-type]
                    read_timeout_seconds=20,
                )  # fmt: skip
        except Exception:  # the server died under the request, or is not up yet
            await asyncio.sleep(0.1)
            continue
        typed = (result.meta or {}).get(ERROR_META)
        if isinstance(typed, dict) and typed.get("type") == "OperationInFlight":
            await asyncio.sleep(0.1)  # another server still runs it: ask again later
            continue
        return result
    raise AssertionError(f"payment {key} was never answered")


async def _killer(server: ServerProcess, stop: asyncio.Event, rng: random.Random) -> None:
    """SIGKILL the server at a random moment after it came up, and start it again."""
    while not stop.is_set():
        await asyncio.to_thread(server.wait_up)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0.2, 1.2))
        if stop.is_set():
            return
        server.kill()
        server.start()


async def _drive(
    db: Database, tenant: uuid.UUID, *, bare: bool, seed: int, module: str = "mcp_server"
) -> tuple[ServerProcess, dict[str, CallToolResult]]:
    server = ServerProcess(db.dsn, bare=bare, module=module)
    server.start()
    stop = asyncio.Event()
    killer = asyncio.create_task(_killer(server, stop, random.Random(seed)))
    answers: dict[str, CallToolResult] = {}
    try:
        for i in range(PAYMENTS):
            key = f"payment-{i}"
            answers[key] = await _pay_until_answered(server, tenant, key)
    finally:
        stop.set()
        await killer
    return server, answers


@pytest.mark.parametrize("module", ["mcp_server", "fastmcp_server"])
async def test_each_payment_is_performed_once_per_key_across_sigkills(
    db: Database, tenants: Tenants, recorded: asyncpg.Pool, module: str
) -> None:
    """The SDK's ``MCPServer`` with the kit as an extension, and FastMCP with its middleware."""
    server, answers = await _drive(db, tenants.a, bare=False, seed=7, module=module)
    try:
        assert server.kills >= 2, "the servers were not killed often enough to tell"
        calls = await payments.calls(recorded)
        executed = Counter(c.idempotency_key for c in calls if c.outcome == "executed")
        assert len(executed) == PAYMENTS
        assert set(executed.values()) == {1}, executed
        # No repeat request reached the provider after an effect: reconciled, not re-sent.
        assert [c for c in calls if c.outcome == "replayed"] == []
        for key, first in answers.items():
            assert not first.is_error, (key, first)
            again = await _pay_until_answered(server, tenants.a, key)  # a replay
            assert again.model_dump_json(by_alias=True) == first.model_dump_json(by_alias=True)
    finally:
        server.stop()


async def test_control_the_same_server_without_the_kit_pays_twice(
    db: Database, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    duplicates: Counter[str] = Counter()
    for seed in range(5):  # killed the same way until a kill lands after a charge
        server, _ = await _drive(db, tenants.a, bare=True, seed=seed)
        server.stop()
        executed = Counter(
            str(c.args) for c in await payments.calls(recorded) if c.outcome == "executed"
        )
        duplicates = Counter({k: n for k, n in executed.items() if n > 1})
        if duplicates:
            break
        await recorded.execute("DELETE FROM agentdb_testing.provider_calls")
    assert duplicates, "no payment was performed twice without the kit"


async def _status(server: ServerProcess, tenant: uuid.UUID, task_id: str) -> dict[str, object]:
    async with connect(server.url, tenant) as client:
        return await get_task(client, task_id)


async def test_a_task_is_finished_by_a_second_server_after_the_first_dies(
    db: Database, tenants: Tenants, recorded: asyncpg.Pool
) -> None:
    first, second = ServerProcess(db.dsn), ServerProcess(db.dsn)
    first.start()
    try:
        first.wait_up()
        async with connect(first.url, tenants.a) as client:
            task_id = await start_task(client, "report", {"rows": 20})
        rows = "SELECT count(*) FROM agent_steps WHERE task_id = $1 AND name LIKE 'row/%'"
        for _ in range(300):  # the first server's worker runs it
            if await recorded.fetchval(rows, uuid.UUID(task_id)) >= 3:
                break
            await asyncio.sleep(0.05)
        first.kill()
        second.start()
        second.wait_up()
        assert (await _status(second, tenants.a, task_id))["status"] == "working"
        for _ in range(600):
            found = await _status(second, tenants.a, task_id)
            if found["status"] != "working":
                break
            await asyncio.sleep(0.1)
        assert found["status"] == "completed", found
        assert found["result"]["structuredContent"] == {  # type: ignore[index]
            "rows": 20, "total": sum(i * i for i in range(20))
        }  # fmt: skip
        owners = await recorded.fetch(
            "SELECT DISTINCT actor_id FROM agent_events WHERE task_id = $1"
            " AND event_type IN ('task.claimed', 'task.reclaimed')", uuid.UUID(task_id),
        )  # fmt: skip
        assert len(owners) >= 2, owners  # claimed by the first server's worker, then another's

        # A cancel, sent to either server, stops a running task.
        async with connect(second.url, tenants.a) as client:
            long = await start_task(client, "report", {"rows": 200})
            for _ in range(300):
                if await recorded.fetchval(rows, uuid.UUID(long)) >= 2:
                    break
                await asyncio.sleep(0.05)
            await cancel_task(client, long)
            assert (await get_task(client, long))["status"] == "cancelled"
        await asyncio.sleep(1.5)  # the worker's lease watch stops the handler
        settled = await recorded.fetchval(rows, uuid.UUID(long))
        await asyncio.sleep(1.0)
        assert await recorded.fetchval(rows, uuid.UUID(long)) == settled < 200
    finally:
        first.stop()
        second.stop()
