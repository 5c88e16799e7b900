"""The MCP server kit on FastMCP: effect tools exactly once, as FastMCP middleware.

``pip install 'agentdb-pg[fastmcp]'`` (pinned to the ``fastmcp`` release it is
tested against). FastMCP does not run the SDK's extensions: it has a
middleware chain of its own, whose ``on_call_tool`` sees the request's
parameters and answers a ``ToolResult``. So the kit of
:mod:`agentdb.integrations.mcp` - the same :class:`~agentdb.integrations.mcp.ExactlyOnce`,
the same ``@kit.effect()`` on each tool - goes on a FastMCP server as
:class:`ExactlyOnceMiddleware`::

    kit = ExactlyOnce(os.environ["DATABASE_URL"], identity=from_headers())
    server = FastMCP("payments", middleware=[ExactlyOnceMiddleware(kit)])

    @server.tool
    @kit.effect()
    async def pay(to: str, amount: int) -> dict[str, str]:
        return await psp.charge(to, amount, idempotency_key=idempotency_key())

Everything the kit promises holds the same way (see that module): the call's
key from ``_meta.idempotency_key`` or an argument, the arguments' hash (G4),
the reservation committed before the body runs and every answer read back
from the record (G13), the ``reconcile`` hook for a call whose server died,
approvals answered once (G22) through the 2026-07-28 input-required round
trip, and the caller's ``traceparent`` on the rows (G16).

What differs on FastMCP:

* **Identity.** ``identity`` is given the SDK's request context underneath
  FastMCP's (``Context.request_context``), so one ``identity`` function -
  :func:`~agentdb.integrations.mcp.from_headers`, or yours reading
  ``get_access_token()`` - serves both frameworks. A call made from inside the
  server (``server.call_tool(...)``, no client request) has no identity and is
  refused.
* **Errors.** FastMCP raises a tool's error through the middleware chain
  instead of making it a result. ``fastmcp.exceptions.ToolError`` raised by
  the body means "refused, nothing performed", like :class:`NotPerformed`; a
  call whose arguments do not validate never reaches the body and is recorded
  failed; anything else the body raises leaves the call ``unknown``.
* **Approvals.** The approval's ``requestState`` is sealed by FastMCP on its
  way out and checked on its way back; a server of several instances (or one
  that restarts while a caller is approving) needs a key they share - see the
  MCP guide.
* **Long-running tools.** :class:`~agentdb.integrations.mcp.DurableTasks` is
  an SDK extension: it is not served through FastMCP, whose own Tasks
  support (``fastmcp[tasks]``) is backed by Docket, not by Postgres.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types
from fastmcp.exceptions import ToolError as FastMCPToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from mcp.server.context import HandlerResult

from agentdb.integrations.mcp import ExactlyOnce

__all__ = ["ExactlyOnceMiddleware"]


class ExactlyOnceMiddleware(Middleware):
    """FastMCP middleware running each ``@kit.effect()`` tool once per call key.

    Tools the kit was not asked to guard pass through untouched. Put it first
    in the chain when other middleware may answer a call itself (a cache
    answering from memory would answer around the ledger).
    """

    def __init__(self, kit: ExactlyOnce) -> None:
        self.kit = kit

    async def on_call_tool(
        self,
        context: MiddlewareContext[mcp_types.CallToolRequestParams],
        call_next: CallNext[mcp_types.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        params = context.message
        if not self.kit.guards(params.name):
            return await call_next(context)
        fastmcp_ctx = context.fastmcp_context
        request = None if fastmcp_ctx is None else fastmcp_ctx.request_context
        # The SDK's own context under FastMCP's wrapper: what `identity` functions read.
        sdk_ctx = None if request is None else request._srctx
        if sdk_ctx is not None and isinstance(sdk_ctx.params, Mapping):
            # FastMCP hands middleware the call without its `_meta` and input answers
            # (the caller's key, traceparent, an approval): read them off the wire
            # request (`requestState` already unsealed by the framework's boundary).
            wire = mcp_types.CallToolRequestParams.model_validate(dict(sdk_ctx.params))
            params = wire.model_copy(update={"name": params.name, "arguments": params.arguments})

        async def call() -> HandlerResult:
            return _to_wire(await call_next(context))

        answer = await self.kit.guard(params, sdk_ctx, call, definite=(FastMCPToolError,))
        return _from_wire(answer)


def _to_wire(result: ToolResult) -> HandlerResult:
    """What FastMCP would answer for ``result``: the record the kit keeps and replays."""
    if isinstance(result, InputRequiredToolResult):
        return result.input_required
    return mcp_types.CallToolResult(
        content=result.content,
        structured_content=result.structured_content,
        is_error=result.is_error,
        _meta=result.meta,
    )


def _from_wire(answer: HandlerResult) -> ToolResult:
    if isinstance(answer, mcp_types.InputRequiredResult):
        return InputRequiredToolResult(answer)
    if isinstance(answer, Mapping):  # the kit answers models; a mapping is a framework's own
        answer = mcp_types.CallToolResult.model_validate(answer)
    assert isinstance(answer, mcp_types.CallToolResult), type(answer)
    structured: Any = answer.structured_content
    return ToolResult(
        content=list(answer.content),
        structured_content=structured,
        meta=answer.meta,
        is_error=answer.is_error,
    )
