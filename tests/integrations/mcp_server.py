"""A payments MCP server for the kit's tests, run as a real process on loopback.

    python -m tests.integrations.mcp_server PORT DSN [--bare]

``pay`` charges a fake provider (:class:`agentdb.testing.RecordingProvider`, its
ledger in the test database, so it outlives a SIGKILLed server) and then takes
a while to answer: a window in which a kill loses the answer, not the charge.
``report`` is long-running: a durable task whose rows are recorded steps, run by
the worker each server process starts, and taken over by another server's
worker once a killed one's lease expires; ``consult`` asks for input of the
other kinds (a URL-mode elicitation, a sampling request), and ``broken`` fails
each way a tool can. ``--bare`` is the same server without the kit: the control
that shows the duplicate charge.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    SamplingMessage,
    TextContent,
)

from agentdb.integrations.mcp import (
    DurableTasks,
    ExactlyOnce,
    ask,
    ask_input,
    from_headers,
    idempotency_key,
)
from agentdb.testing import RecordingProvider
from agentdb.worker import Worker
from agentdb.worker.durable import running_job

payments = RecordingProvider("mcp-payments")
LEASE_TTL = timedelta(seconds=2)
TASK_TTL = timedelta(hours=1)


def build(dsn: str, *, bare: bool = False) -> MCPServer[Any]:
    kit = ExactlyOnce(dsn, identity=from_headers())
    durable = DurableTasks(
        kit, lease_ttl=LEASE_TTL, poll_interval_ms=100, ttl=TASK_TTL, max_attempts=3
    )

    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        if bare:
            yield {}
            return
        worker = Worker(await kit.pool(), durable.handlers(server), poll_interval=0.05,
                        watch_interval=0.2)  # fmt: skip
        running = asyncio.create_task(worker.run(install_signals=False))
        try:
            yield {}
        finally:
            worker.stop()
            await running
            await kit.close()

    state_key = os.environ.get("MCP_STATE_KEY")  # shared by instances: approvals survive them
    server: MCPServer[Any] = MCPServer(
        "payments",
        extensions=[] if bare else [kit, durable],
        lifespan=lifespan,
        request_state_security=(
            None if state_key is None else RequestStateSecurity(keys=[state_key])
        ),
    )
    guard: Callable[[Any], Any] = (lambda fn: fn) if bare else kit.effect(reconcile=payments.lookup)

    @server.tool()
    @guard
    async def pay(to: str, amount: int) -> dict[str, Any]:
        """Charge ``amount`` to ``to``: the provider performs each idempotency key once; the
        bare server has no key to give it."""
        key = None if bare else idempotency_key()
        ref = await payments.call("pay", {"to": to, "amount": amount}, idempotency_key=key)
        await asyncio.sleep(random.uniform(0.1, 0.5))  # a kill here loses only the answer
        return {"paid": amount, "to": to, "reference": ref}

    if not bare:

        @server.tool()
        @kit.effect(approval=True, reconcile=payments.lookup)
        async def pay_approved(to: str, amount: int) -> dict[str, Any]:
            """``pay``, once the caller approved this very call (single use)."""
            ref = await payments.call("pay", {"to": to, "amount": amount},
                                      idempotency_key=idempotency_key())  # fmt: skip
            return {"paid": amount, "to": to, "reference": ref}

    @server.tool()
    @durable.long_running()
    async def report(rows: int, approve: bool = False) -> dict[str, Any]:
        """Build a report of ``rows`` rows, one recorded step each (0.1 s apiece)."""
        job = running_job()
        assert job is not None
        if approve:
            answer = await ask("go", f"Build {rows} rows?", {"type": "object",
                               "properties": {"go": {"type": "boolean"}}})  # fmt: skip
            if answer.action != "accept":
                return {"rows": 0, "declined": True}
        total = 0
        for i in range(rows):
            total += await job.step(f"row/{i}", _row, i)
        return {"rows": rows, "total": total}

    @server.tool()
    @durable.long_running()
    async def consult(topic: str) -> dict[str, Any]:
        """Sends the user to a page (URL-mode elicitation), then asks the caller's model."""
        seen = await ask("page", f"Read the terms on {topic}", url=f"https://example.test/{topic}")
        sampled = await ask_input("model", CreateMessageRequest(params=CreateMessageRequestParams(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=topic))],
            max_tokens=50,
        )))  # fmt: skip
        assert isinstance(sampled, CreateMessageResult)
        assert isinstance(sampled.content, TextContent)
        return {"read": seen.action, "model": sampled.model, "said": sampled.content.text}

    @server.tool()
    @durable.long_running()
    async def broken(how: str) -> str:
        """Fails: ``refuse`` with a ToolError, ``jsonrpc`` with an MCPError, else it crashes."""
        if how == "refuse":
            raise ToolError("no report for you")
        if how == "jsonrpc":
            raise MCPError(code=INVALID_PARAMS, message="the report source is gone")
        raise RuntimeError("the report generator crashed")

    return server


async def _row(i: int) -> int:
    await asyncio.sleep(0.1)
    return i * i


if __name__ == "__main__":
    port, dsn = int(sys.argv[1]), sys.argv[2]
    build(dsn, bare="--bare" in sys.argv).run(
        "streamable-http", port=port, stateless_http=True, json_response=True
    )
