"""The payments server of ``mcp_server.py`` on FastMCP, with the kit as FastMCP middleware.

    python -m tests.integrations.fastmcp_server PORT DSN [--bare]

``pay`` charges the fake provider and then takes a while to answer (a kill in
that window loses the answer, not the charge); ``pay_approved`` needs the
caller's approval of each call; ``pay_once_declined`` raises FastMCP's
``ToolError`` on a key's first call (it refused, nothing was performed);
``pay_then_crash`` raises after charging. The
requestState key comes from ``MCP_STATE_KEY`` when it is set - what several
instances (or one restarted) must share for an approval asked by one to be
answered at another. ``--bare`` is the same server without the kit.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Callable
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from mcp.server.request_state import RequestStateSecurity

from agentdb.integrations.fastmcp import ExactlyOnceMiddleware
from agentdb.integrations.mcp import ExactlyOnce, from_headers, idempotency_key
from tests.integrations.mcp_server import payments


def build(dsn: str, *, bare: bool = False) -> FastMCP[Any]:
    kit = ExactlyOnce(dsn, identity=from_headers())
    state_key = os.environ.get("MCP_STATE_KEY")
    security = None if state_key is None else RequestStateSecurity(keys=[state_key])
    server: FastMCP[Any] = FastMCP(
        "payments",
        middleware=[] if bare else [ExactlyOnceMiddleware(kit)],
        request_state_security=security,
    )
    guard: Callable[[Any], Any] = (lambda fn: fn) if bare else kit.effect(reconcile=payments.lookup)

    @server.tool
    @guard
    async def pay(to: str, amount: int) -> dict[str, Any]:
        """Charge ``amount`` to ``to`` once per idempotency key (the bare server has none)."""
        key = None if bare else idempotency_key()
        ref = await payments.call("pay", {"to": to, "amount": amount}, idempotency_key=key)
        await asyncio.sleep(random.uniform(0.1, 0.5))  # a kill here loses only the answer
        return {"paid": amount, "to": to, "reference": ref}

    if bare:
        return server

    @server.tool
    @kit.effect(approval=True, reconcile=payments.lookup)
    async def pay_approved(to: str, amount: int) -> dict[str, Any]:
        """``pay``, once the caller approved this very call (single use)."""
        ref = await payments.call("pay", {"to": to, "amount": amount},
                                  idempotency_key=idempotency_key())  # fmt: skip
        return {"paid": amount, "to": to, "reference": ref}

    declined: set[str] = set()

    @server.tool
    @kit.effect(reconcile=payments.lookup)
    async def pay_once_declined(to: str, amount: int) -> dict[str, Any]:
        """Declines a key's first call before charging (FastMCP's ToolError), then charges."""
        if idempotency_key() not in declined:
            declined.add(idempotency_key())
            raise ToolError(f"{to} is not verified yet")
        ref = await payments.call("pay", {"to": to, "amount": amount},
                                  idempotency_key=idempotency_key())  # fmt: skip
        return {"paid": amount, "to": to, "reference": ref}

    @server.tool
    @kit.effect(reconcile=payments.lookup)
    async def pay_then_crash(to: str, amount: int) -> dict[str, Any]:
        """Charges, then fails: performed, and the server cannot tell."""
        await payments.call("pay", {"to": to, "amount": amount}, idempotency_key=idempotency_key())
        raise RuntimeError("the connection to the provider broke after the charge")

    return server


if __name__ == "__main__":
    port, dsn = int(sys.argv[1]), sys.argv[2]
    build(dsn, bare="--bare" in sys.argv).run(
        "streamable-http", host="127.0.0.1", port=port, stateless_http=True, json_response=True,
        show_banner=False,
    )  # fmt: skip
