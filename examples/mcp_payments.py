from __future__ import annotations

import asyncio
import uuid
from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer

from agentdb import create_pool, tenancy
from agentdb.integrations.mcp import ExactlyOnce, Identity, idempotency_key
from agentdb.tools.embedded import embedded_postgres


def payments_server(kit: ExactlyOnce) -> MCPServer:
    server = MCPServer("payments", extensions=[kit])  # was: MCPServer("payments")

    @server.tool()
    @kit.effect()  # added: once per (tenant, principal, tool, idempotency key)
    async def pay(to: str, amount: int) -> str:
        receipt = uuid.uuid4().hex[:6]  # yours: psp.charge(to, amount, idempotency_key())
        return f"{amount} paid to {to}: receipt {receipt}, key {idempotency_key()[-6:]}"

    return server


async def main(dsn: str) -> None:
    async with await create_pool(dsn) as pool:  # yours: who calls, from the OAuth token
        who = Identity(await tenancy.create_tenant(pool, "acme"), "alice")
    kit = ExactlyOnce(dsn, identity=lambda ctx: who)
    async with Client(payments_server(kit)) as client:  # in-process; or over HTTP
        key: Any = {"idempotency_key": f"order-17/{uuid.uuid4()}"}  # the caller's key
        first = await client.call_tool("pay", {"to": "bob", "amount": 5}, meta=key)
        again = await client.call_tool("pay", {"to": "bob", "amount": 5}, meta=key)
        print(first.structured_content, "| the retry, from Postgres:", again == first)
    await kit.close()


with embedded_postgres() as dsn:  # a private Postgres, migrated: nothing to install
    asyncio.run(main(dsn))
