"""Pydantic AI's human-in-the-loop tool approval example, run on agentdb: the framework's
own tools, unchanged; the approvals are agentdb approvals (G22), sent by another principal
while the task waits holding no worker.

Source: https://ai.pydantic.dev/deferred-tools/#human-in-the-loop-tool-approval
"""

from __future__ import annotations

from pydantic_ai import (
    Agent,
    ApprovalRequired,
    DeferredToolRequests,
    ModelMessage,
    ModelResponse,
    RunContext,
    ToolCallPart,
)
from pydantic_ai.messages import TextPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentdb.integrations.pydantic_ai import AgentdbDurability
from agentdb.worker import Job, Succeed


async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Offline, in place of the example's 'openai:gpt-5': the three calls the prompt asks
    for, then a summary of what they returned."""
    returns = [
        p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)
    ]
    if not returns:
        return ModelResponse(
            parts=[
                ToolCallPart("delete_file", {"path": "__init__.py"}, "delete"),
                ToolCallPart(
                    "update_file", {"path": "README.md", "content": "Hello, world!"}, "readme"
                ),
                ToolCallPart("update_file", {"path": ".env", "content": ""}, "env"),
            ]
        )
    return ModelResponse(parts=[TextPart("; ".join(str(r.content) for r in returns))])


agent = Agent(
    FunctionModel(model),
    output_type=[str, DeferredToolRequests],
    name="files",  # agentdb: the name every step of its runs carries
    capabilities=[AgentdbDurability()],  # agentdb: the wrapper line
)

PROTECTED_FILES = {".env"}


@agent.tool
def update_file(ctx: RunContext, path: str, content: str) -> str:
    if path in PROTECTED_FILES and not ctx.tool_call_approved:
        raise ApprovalRequired(metadata={"reason": "protected"})
    return f"File {path!r} updated: {content!r}"


@agent.tool_plain(requires_approval=True)
def delete_file(path: str) -> str:
    return f"File {path!r} deleted"


async def files(job: Job) -> Succeed:
    result = await agent.run(
        "Delete `__init__.py`, write `Hello, world!` to `README.md`, and clear `.env`"
    )
    return Succeed(payload={"output": result.output})
