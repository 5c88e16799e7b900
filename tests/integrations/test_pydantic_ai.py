"""Pydantic AI on agentdb, run in-process by the real worker (``agentdb.testing.drain``):
replay, approvals (G22), budgets (G19), renamed steps (G25), and the agent outside a handler.

The crash matrix with real worker processes is tests/integrations/test_pydantic_ai_crash.py.
"""

from __future__ import annotations

import collections
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from mcp.server.mcpserver import Context, MCPServer
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from agentdb import budgets, overview, signals, steps, tasks
from agentdb.errors import BudgetExceeded, ConfigurationError
from agentdb.integrations.pydantic_ai import (
    AgentdbDurability,
    approval_name,
    idempotency_key,
    mcp_idempotency_key,
    pending_approvals,
)
from agentdb.testing import drain
from agentdb.worker import Fail, Job, Succeed
from tests.conftest import Tenants


class Script:
    """A FunctionModel script: call ``tool`` with ``args`` once, then answer with what it
    returned. Counts every request it is asked."""

    def __init__(self, tool: str, args: dict[str, Any]) -> None:
        self.tool, self.args, self.asked = tool, args, 0

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        returns = [
            p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)
        ]
        if not returns:
            return ModelResponse(parts=[ToolCallPart(self.tool, self.args, "call-1")])
        return ModelResponse(parts=[TextPart(f"done: {returns[-1].content}")])

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        """The same script, streamed (a run with an event-stream handler streams)."""
        response = await self(messages, info)
        for part in response.parts:
            if isinstance(part, ToolCallPart):
                yield {
                    0: DeltaToolCall(
                        part.tool_name, part.args_as_json_str(), tool_call_id=part.tool_call_id
                    )
                }
            elif isinstance(part, TextPart):
                yield part.content


class Provider:
    """Performs each key once; counts every request."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.performed: dict[str, int] = {}

    def perform(self, amount: int) -> str:
        key = idempotency_key()
        self.requests[key] += 1
        self.performed.setdefault(key, amount)
        return f"refunded {amount}"


def _agent(
    script: Script,
    provider: Provider,
    *,
    name: str = "support",
    approval: bool = False,
    **cap: Any,
) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(script, stream_function=script.stream),
        name=name,
        capabilities=[AgentdbDurability(**cap)],
    )

    @agent.tool_plain(requires_approval=approval)
    async def refund(amount: int) -> str:
        return provider.perform(amount)

    return agent


async def _run(pool: asyncpg.Pool, handlers: Any) -> Any:
    return await drain(pool, handlers, within=30, retry_base=0.01)


# ---- replay ----------------------------------------------------------------------------


async def test_G25_a_run_re_entered_after_a_wait_replays_every_request_and_call(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 30}), Provider()
    agent = _agent(script, provider)
    outputs: list[str] = []

    async def handle(job: Job) -> Succeed:
        result = await agent.run("refund 30")
        outputs.append(result.output)
        await job.wait_for_signal("go", "go")  # the handler is re-entered from the top
        return Succeed(payload={"output": result.output})

    task = await tasks.create(pool, tenants.a, "pai-replay")
    await _run(pool, {"pai-replay": handle})
    assert (await tasks.get(pool, tenants.a, task.id)).state == "waiting"
    await signals.signal(pool, tenants.a, task.id, "go", sender="ops")
    done = await _run(pool, {"pai-replay": handle})
    assert done.count("succeeded") == 1
    assert script.asked == 2  # two requests, each asked once however often the run ran
    assert sum(provider.requests.values()) == 1
    assert outputs == ["done: refunded 30"] * 2  # the replay answers as the first run did
    recorded = (await steps.ledger(pool, tenants.a, task.id)).steps
    assert sorted(n.rsplit("@", 1)[0] for n in recorded if n.startswith("ai/")) == [
        "ai/1/1/support__model.request",
        "ai/1/3/support__model.request",
    ]


async def test_G25_a_changed_prompt_is_asked_anew_an_identical_one_replays(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 5}), Provider()
    agent = _agent(script, provider)
    prompts = ["refund 5", "refund 5", "refund five"]

    async def handle(job: Job) -> Succeed:
        await agent.run(prompts.pop(0))
        if prompts:
            await job.sleep(f"pause{len(prompts)}", timedelta(milliseconds=50))
        return Succeed()

    await tasks.create(pool, tenants.a, "pai-prompt")
    done = await _run(pool, {"pai-prompt": handle})
    assert done.count("succeeded") == 1
    # Run 1 asks twice; run 2 (the same prompt) replays both; run 3 (a deploy changed
    # the prompt) asks both anew, since each carries the prompt - and its tool call,
    # recorded with the same arguments at the same place, is replayed, not performed again.
    assert script.asked == 4
    assert sum(provider.requests.values()) == 1


# ---- approvals (G22) -------------------------------------------------------------------


async def test_G22_a_tool_that_requires_approval_waits_holding_no_worker_and_runs_once(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 70}), Provider()
    agent = _agent(script, provider, approval=True)

    async def handle(job: Job) -> Succeed:
        result = await agent.run("refund 70")
        return Succeed(payload={"output": result.output})

    task = await tasks.create(pool, tenants.a, "pai-approve")
    await _run(pool, {"pai-approve": handle})  # returns: the run waits, no worker held
    assert (await tasks.get(pool, tenants.a, task.id)).state == "waiting"
    assert provider.requests == {}
    [asked] = await pending_approvals(pool, tenants.a, task.id)
    assert asked == {
        "tool_call_id": "call-1",
        "tool": "refund",
        "args": {"amount": 70},
        "signal": approval_name("call-1"),
    }
    # The console's approvals inbox shows the same ask, and the worker it may not approve.
    [inbox] = await overview.approvals(pool, tenants.a)
    assert (inbox["id"], inbox["wait_signal"]) == (str(task.id), approval_name("call-1"))
    assert inbox["asked"] == asked
    assert inbox["lease_holders"] != []
    for approver in ("alice", "alice-again"):  # approved twice: performed once
        await signals.approve(
            pool, tenants.a, task.id, approver=approver, name=approval_name("call-1")
        )
    done = await _run(pool, {"pai-approve": handle})
    assert done.count("succeeded") == 1
    assert list(provider.requests.values()) == [1]
    assert await pending_approvals(pool, tenants.a, task.id) == []
    assert script.asked == 2


async def test_G22_a_rejected_call_is_answered_to_the_model_as_denied_and_never_made(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 9}), Provider()
    agent = _agent(script, provider, approval=True)
    outputs: list[str] = []

    async def handle(job: Job) -> Succeed:
        result = await agent.run("refund 9")
        outputs.append(result.output)
        return Succeed()

    task = await tasks.create(pool, tenants.a, "pai-reject")
    await _run(pool, {"pai-reject": handle})
    await signals.approve(
        pool, tenants.a, task.id, approver="bob", decision="rejected",
        comment="not this one", name=approval_name("call-1"),
    )  # fmt: skip
    done = await _run(pool, {"pai-reject": handle})
    assert done.count("succeeded") == 1
    assert provider.requests == {}
    assert outputs == ["done: The call was rejected by bob: not this one"]


# ---- budgets (G19) ---------------------------------------------------------------------


async def test_G19_model_requests_hold_their_cost_and_a_spent_budget_stops_the_run(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 1}), Provider()
    agent = _agent(
        script, provider, model_cost={"tokens": 500},
        usage_cost=lambda usage: {"tokens": usage["input_tokens"] + usage["output_tokens"]},
    )  # fmt: skip

    async def handle(job: Job) -> Succeed | Fail:
        try:
            await agent.run("refund 1")
        except BudgetExceeded as exc:
            return Fail(f"stopped by a budget: {exc}")
        return Succeed()

    await budgets.set_budget(pool, tenants.a, "tokens", 520)
    task = await tasks.create(pool, tenants.a, "pai-budget")
    done = await _run(pool, {"pai-budget": handle})
    # The first request held 500 and settled at its usage (some 50 tokens); the second
    # would hold 500 more than the rest of 520 allows: refused before the model was asked.
    assert done.count("failed") == 1
    assert script.asked == 1
    [tokens] = [b for b in await budgets.list_budgets(pool, tenants.a) if b.unit == "tokens"]
    assert tokens.held == 0
    assert 20 < tokens.spent < 500
    assert "would exceed the budget" in str((await tasks.get(pool, tenants.a, task.id)).last_error)


async def test_G19_a_tool_holds_the_cost_its_metadata_names_per_call(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 2}), Provider()
    agent = Agent(FunctionModel(script), name="costly", capabilities=[AgentdbDurability()])

    @agent.tool_plain(metadata={"agentdb": {"cost": {"usd_cents": 30}}})
    async def refund(amount: int) -> str:
        return provider.perform(amount)

    async def handle(job: Job) -> Succeed | Fail:
        try:
            await agent.run("refund 2")
        except BudgetExceeded as exc:
            return Fail(f"stopped by a budget: {exc}")
        return Succeed()

    await budgets.set_budget(pool, tenants.a, "usd_cents", 50)
    for _ in range(2):
        await tasks.create(pool, tenants.a, "pai-tool-cost")
    done = await _run(pool, {"pai-tool-cost": handle})
    # 30 + 30 > 50: the second task's call is refused before the tool runs.
    assert sorted(t.state for t in done.tasks) == ["failed", "succeeded"]
    assert sum(provider.requests.values()) == 1
    [cents] = [b for b in await budgets.list_budgets(pool, tenants.a) if b.unit == "usd_cents"]
    assert (cents.spent, cents.held) == (30, 0)


# ---- stable names (G25) ----------------------------------------------------------------


async def test_G25_a_run_re_entered_after_its_agent_was_renamed_fails_naming_the_step(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 3}), Provider()
    deployed = {"agent": _agent(script, provider, name="support")}

    async def handle(job: Job) -> Succeed:
        await deployed["agent"].run("refund 3")
        await job.wait_for_signal("go", "go")
        return Succeed()

    task = await tasks.create(pool, tenants.a, "pai-rename")
    await _run(pool, {"pai-rename": handle})
    deployed["agent"] = _agent(script, provider, name="support-v2")  # the deploy
    await signals.signal(pool, tenants.a, task.id, "go", sender="ops")
    done = await _run(pool, {"pai-rename": handle})
    assert done.count("failed") == 1  # at once: another attempt would only fail again
    error = str((await tasks.get(pool, tenants.a, task.id)).last_error)
    assert "StepMissing" in error
    assert "ai/1/1/support__model.request@" in error
    assert sum(provider.requests.values()) == 1  # never performed again under the new name


# ---- outside a handler -----------------------------------------------------------------


async def test_outside_a_handler_the_agent_runs_as_without_the_capability() -> None:
    script = Script("lookup", {"q": "x"})
    agent = Agent(FunctionModel(script), name="plain", capabilities=[AgentdbDurability()])

    @agent.tool_plain
    async def lookup(q: str) -> str:
        with pytest.raises(ConfigurationError, match="inside an agentdb task handler"):
            idempotency_key()
        return q.upper()

    result = await agent.run("look x up")
    assert result.output == "done: X"
    assert script.asked == 2


def test_an_agent_with_no_name_is_refused_at_once() -> None:
    with pytest.raises(Exception, match="unique `name`"):
        Agent(FunctionModel(Script("t", {})), capabilities=[AgentdbDurability()])


def test_approval_names_fit_a_signal_name() -> None:
    assert approval_name("call-1") == "approval:call-1"
    long = approval_name("x" * 300)
    assert len(long) <= 100
    assert long == approval_name("x" * 300) != approval_name("y" * 300)


# ---- MCP toolsets --------------------------------------------------------------------


async def test_G13_G25_an_mcp_servers_tool_call_is_an_effect_performed_once(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A tool of an MCP server (the official SDK's, connected in memory) is reserved, called
    once and replayed; the server gets the call's key in the request's _meta."""
    server = MCPServer("payments")
    keys: list[object] = []

    @server.tool()
    def pay(amount: int, ctx: Context) -> str:
        keys.append((ctx.request_context.meta or {}).get("idempotency_key"))
        return f"paid {amount}"

    script = Script("pay", {"amount": 12})
    agent = Agent(
        FunctionModel(script), name="payer",
        toolsets=[MCPToolset(server, id="payments", process_tool_call=mcp_idempotency_key)],
        capabilities=[AgentdbDurability()],
    )  # fmt: skip

    async def handle(job: Job) -> Succeed:
        result = await agent.run("pay 12")
        await job.wait_for_signal("go", "go")  # re-entered from the top after this
        return Succeed(payload={"output": result.output})

    task = await tasks.create(pool, tenants.a, "pai-mcp")
    await _run(pool, {"pai-mcp": handle})
    await signals.signal(pool, tenants.a, task.id, "go", sender="ops")
    done = await _run(pool, {"pai-mcp": handle})
    assert done.count("succeeded") == 1
    [op] = await pool.fetch(
        "SELECT action, state, idempotency_key FROM agent_operations WHERE task_id = $1", task.id
    )
    assert (op["action"], op["state"]) == ("pay", "succeeded")
    assert op["idempotency_key"].endswith("payer__mcp_server__payments.call_tool:pay")
    assert keys == [op["idempotency_key"]]  # called once, with its key
    assert script.asked == 2


# ---- events ------------------------------------------------------------------------------


async def test_G10_G25_a_runs_tool_events_are_outbox_messages_sent_once_whatever_replays(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    script, provider = Script("refund", {"amount": 4}), Provider()
    seen: list[str] = []

    async def mine(ctx: Any, events: Any) -> None:  # the user's own handler still runs
        async for event in events:
            seen.append(type(event).__name__)

    agent = _agent(script, provider, events_topic="agent.events", event_stream_handler=mine)

    async def handle(job: Job) -> Succeed:
        await agent.run("refund 4")
        await job.wait_for_signal("go", "go")  # re-entered: the run replays
        return Succeed()

    task = await tasks.create(pool, tenants.a, "pai-events")
    await _run(pool, {"pai-events": handle})
    await signals.signal(pool, tenants.a, task.id, "go", sender="ops")
    assert (await _run(pool, {"pai-events": handle})).count("succeeded") == 1
    rows = await pool.fetch(
        "SELECT topic, payload::text FROM agent_outbox WHERE task_id = $1 ORDER BY created_at",
        task.id,
    )
    kinds = [json.loads(r["payload"])["event"]["event_kind"] for r in rows]
    assert kinds == ["function_tool_call", "function_tool_result"]  # once, though run twice
    assert {r["topic"] for r in rows} == {"agent.events"}
    assert seen.count("FunctionToolCallEvent") == 2  # yours: at least once (run twice)
    assert sum(provider.requests.values()) == 1
