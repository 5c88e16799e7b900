"""Pydantic AI agents as agentdb handlers, for the adapter's tests (in-process and in the
crash matrix's ``agentdb worker`` processes).

The model is Pydantic AI's own offline ``FunctionModel`` playing a script: look the order
up (a read), refund it and e-mail the customer (two effects at two fake providers),
then answer. Every call of the model is counted in ``pai_model_calls`` (by scenario, when
the crash matrix runs), so a test sees which requests were asked again.
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentdb import _faults
from agentdb.integrations.pydantic_ai import AgentdbDurability, idempotency_key
from agentdb.testing import RecordingProvider
from agentdb.testing.provider import DSN_ENV, current_scenario
from agentdb.worker import Job, Succeed
from agentdb.worker.durable import running_job

psp = RecordingProvider("psp")
mailer = RecordingProvider("mailer")

ORDERS = {7: {"total": 120, "email": "ada@example.com"}, 8: {"total": 80, "email": "bo@x.org"}}

CALLS_TABLE = """
CREATE TABLE IF NOT EXISTS public.pai_model_calls (
    scenario text NOT NULL, task_id uuid, messages int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())
"""


async def _count_model_call(messages: list[ModelMessage]) -> None:
    dsn = os.environ.get(DSN_ENV)
    if not dsn:
        return  # in-process tests count their own calls
    job = running_job()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO public.pai_model_calls (scenario, task_id, messages) VALUES ($1, $2, $3)",
            current_scenario(),
            None if job is None else job.task.id,
            len(messages),
        )
    finally:
        await conn.close()


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {
        p.tool_name: p.content
        for m in messages
        for p in getattr(m, "parts", ())
        if isinstance(p, ToolReturnPart)
    }


async def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look up, then refund and e-mail, then answer - whatever the worker's fate."""
    await _count_model_call(messages)
    done = _returns(messages)
    prompt = str(getattr(messages[0], "parts", [None])[0].content)
    order = int(prompt.rsplit(" ", 1)[-1])
    if "lookup_order" not in done:
        return ModelResponse(parts=[ToolCallPart("lookup_order", {"order": order}, "call-1")])
    if "refund" not in done:
        total = done["lookup_order"]["total"]
        return ModelResponse(
            parts=[
                ToolCallPart("refund", {"order": order, "amount": total}, "call-2"),
                ToolCallPart("send_email", {"order": order, "text": "refunded"}, "call-3"),
            ]
        )
    return ModelResponse(parts=[TextPart(f"{done['refund']}; {done['send_email']}")])


def build(durable: bool = True, name: str = "support") -> Agent[None, str]:
    agent = Agent(
        FunctionModel(script),
        name=name,
        capabilities=[AgentdbDurability()] if durable else [],
    )

    @agent.tool_plain(metadata={"agentdb": {"read_only": True}})
    async def lookup_order(order: int) -> dict[str, Any]:
        """A read: a step, run again only if a crash lands mid-call."""
        return ORDERS[order]

    @agent.tool_plain
    async def refund(order: int, amount: int) -> str:
        # The adapter's key when durable; without it, a key of the tool's own making per
        # call - what a tool does that no ledger hands a key to.
        key = idempotency_key() if durable else os.urandom(8).hex()
        await psp.call("refund", {"order": order, "amount": amount}, idempotency_key=key)
        if not durable:
            # The boundary a durable agent's effect passes here too: the provider
            # performed, nothing recorded yet (the control is killed at it).
            _faults.point("after_call")
        return f"refunded {amount} on order {order}"

    @agent.tool_plain
    async def send_email(order: int, text: str) -> str:
        key = idempotency_key() if durable else os.urandom(8).hex()
        await mailer.call(
            "email", {"order": order, "to": ORDERS[order]["email"]}, idempotency_key=key
        )
        return f"mailed {ORDERS[order]['email']}"

    return agent


support = build()
plain_support = build(durable=False)


async def run_support(job: Job) -> Succeed:
    result = await support.run(f"refund order {job.task.params['order']}")
    return Succeed(payload={"output": result.output})


async def run_plain_support(job: Job) -> Succeed:
    result = await plain_support.run(f"refund order {job.task.params['order']}")
    return Succeed(payload={"output": result.output})


HANDLERS = {"pai-support": run_support}
PLAIN = {"pai-plain": run_plain_support}
