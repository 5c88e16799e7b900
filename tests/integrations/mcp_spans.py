"""The tool spans of the kit under a configured OpenTelemetry SDK, printed as JSON.

    python -m tests.integrations.mcp_spans DSN

Run in a process of its own by ``test_mcp_spans.py``: a tracer provider is set
once per process, and the rest of the suite runs with none (the kit's "no SDK"
path). It serves a ``pay`` tool on the SDK's ``MCPServer`` and on FastMCP, calls
each in process with a ``traceparent``, then again with other arguments under
the same key (refused), and prints every finished span with the operations'
trace ids.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import fastmcp
from fastmcp import FastMCP
from mcp import Client
from mcp.server.mcpserver import MCPServer
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentdb import create_pool, tenancy
from agentdb.integrations.fastmcp import ExactlyOnceMiddleware
from agentdb.integrations.mcp import ExactlyOnce, Identity

TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


async def main(dsn: str) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    async with await create_pool(dsn) as pool:
        who = Identity(await tenancy.create_tenant(pool, f"spans-{uuid.uuid4()}"), "alice")
    kit = ExactlyOnce(dsn, identity=lambda ctx: who)
    sdk: MCPServer[Any] = MCPServer("sdk", extensions=[kit])
    fast: FastMCP[Any] = FastMCP("fast", middleware=[ExactlyOnceMiddleware(kit)])

    async def pay(to: str, amount: int) -> str:
        return f"paid {amount} to {to}"

    sdk.tool(name="pay_sdk")(kit.effect("pay_sdk")(pay))
    fast.tool(name="pay_fast")(kit.effect("pay_fast")(pay))
    meta: Any = {"idempotency_key": "k-1", "traceparent": f"00-{TRACE}-{PARENT}-01"}
    async with Client(sdk) as client:
        await client.call_tool("pay_sdk", {"to": "bob", "amount": 5}, meta=meta)
        await client.call_tool("pay_sdk", {"to": "bob", "amount": 6}, meta=meta)  # refused
    async with fastmcp.Client(fast) as fast_client:
        await fast_client.call_tool_mcp("pay_fast", {"to": "bob", "amount": 5}, meta=meta)
        await fast_client.call_tool_mcp("pay_fast", {"to": "bob", "amount": 6}, meta=meta)
    async with await create_pool(dsn) as pool:
        ops = await pool.fetch(
            "SELECT action, trace_id, span_id FROM agent_operations WHERE tenant_id = $1",
            who.tenant,
        )
    await kit.close()
    spans = [
        {
            "name": s.name,
            "attributes": dict(s.attributes or {}),
            "status": s.status.status_code.name,
            "trace_id": format(s.context.trace_id, "032x"),
            "span_id": format(s.context.span_id, "016x"),
            "parent": None if s.parent is None else format(s.parent.span_id, "016x"),
        }
        for s in exporter.get_finished_spans()
    ]
    return {"spans": spans, "operations": [dict(o) for o in ops]}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
