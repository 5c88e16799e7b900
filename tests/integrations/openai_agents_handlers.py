"""The agents the OpenAI Agents SDK adapter's tests run: a refund desk (a triage agent handing
off to a refunds agent with a read, a payment and an e-mail tool), on AgentdbRunner and on
the SDK's own Runner (the control), and the same desk with an approval-required refund.

Importable by worker processes (``tests.integrations.openai_agents_handlers:HANDLERS``):
the tools call :class:`~agentdb.testing.RecordingProvider` fakes, which record in the test
database, and the offline model logs each request it is asked there too.
"""

from __future__ import annotations

import re
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    ModelSettings,
    RunConfig,
    RunContextWrapper,
    Runner,
    Tool,
    TResponseInputItem,
    function_tool,
    input_guardrail,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse
from agents.models.interface import ModelTracing
from openai.types.responses.response_prompt_param import ResponsePromptParam

from agentdb.integrations.openai_agents import (
    AgentdbRunner,
    OfflineModel,
    OfflineProvider,
    Reply,
    Request,
    call,
    current_idempotency_key,
    current_step,
    read_only,
    say,
)
from agentdb.testing import RecordingProvider, current_scenario
from agentdb.worker import Fail, Job, Succeed

payments = RecordingProvider("payments")
mail = RecordingProvider("mail")
#: The offline model's log: one row per request it was asked (action "ask", args its step).
model_log = RecordingProvider("model")
#: How often the guardrail ran in this process.
GUARD_RUNS: list[str] = []

_LOG = (
    "INSERT INTO agentdb_testing.provider_calls (provider, scenario, action, args, outcome)"
    " VALUES ('model', $1, 'ask', $2::jsonb, 'executed')"
)


async def _refund(order: str, amount: int) -> str:
    """Refund an order.

    Args:
        order: The order id.
        amount: The amount to refund, in euros.
    """
    await payments.call(
        "refund", {"order": order, "amount": amount}, idempotency_key=current_idempotency_key()
    )
    return f"refunded {amount} EUR for {order}"


@function_tool
async def lookup_order(order: str) -> str:
    """Look an order up.

    Args:
        order: The order id.
    """
    return f"order {order}: 42 EUR, paid by card"


@function_tool
async def email_customer(order: str, text: str) -> str:
    """E-mail the customer of an order.

    Args:
        order: The order id.
        text: What to tell them.
    """
    await mail.call("email", {"order": order, "text": text},
                    idempotency_key=current_idempotency_key())  # fmt: skip
    return "sent"


refund = function_tool(_refund, name_override="refund")
refund_with_approval = function_tool(_refund, name_override="refund", needs_approval=True)


def desk(request: Request) -> Reply:
    """The offline model of the refund desk."""
    order = re.search(r"order (\w+)", request.last_user())
    oid = order[1] if order else "?"
    done = request.results()
    if "transfer_to_refunds" in request.handoffs:
        return call(request, ("transfer_to_refunds", {}))
    if "lookup_order" in request.tools and "lookup_order" not in done:
        return call(request, ("lookup_order", {"order": oid}))
    if "refund" in request.tools and "refund" not in done:
        return call(request, ("refund", {"order": oid, "amount": 42}))
    if "email_customer" in request.tools and "email_customer" not in done:
        return call(
            request, ("email_customer", {"order": oid, "text": "Your refund is on its way"})
        )
    tools = sorted((k, v) for k, v in done.items() if not k.startswith("transfer_"))
    return say(f"Done for {oid}: " + "; ".join(f"{k}: {v}" for k, v in tools))


class LoggedModel(OfflineModel):
    """The offline model, logging each request it is asked (by step) in the test database."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        step = current_step() or f"{len(input)} items to {system_instructions}"
        pool = await model_log._pool()
        await pool.execute(_LOG, current_scenario(), f'{{"step": "{step}"}}')
        return await super().get_response(
            system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
            previous_response_id=previous_response_id, conversation_id=conversation_id,
            prompt=prompt,
        )  # fmt: skip


OFFLINE = RunConfig(model_provider=OfflineProvider(LoggedModel(desk)))


def refund_desk(
    name: str = "Refunds", tools: list[Any] | None = None, instructions: str = "Refund orders."
) -> Agent[Any]:
    refunds = Agent(
        name=name,
        instructions=instructions,
        tools=tools if tools is not None else [read_only(lookup_order), refund, email_customer],
    )
    return Agent(name="Triage", instructions="Hand refunds over.", handoffs=[refunds])


@input_guardrail
async def no_fraud(
    ctx: RunContextWrapper[Any], agent: Agent[Any], input: str | list[TResponseInputItem]
) -> GuardrailFunctionOutput:
    GUARD_RUNS.append(str(input))
    return GuardrailFunctionOutput(output_info={"checked": True},
                                   tripwire_triggered="fraud" in str(input))  # fmt: skip


def approval_desk(name: str = "Refunds", tools: list[Any] | None = None) -> Agent[Any]:
    return Agent(
        name=name,
        instructions="Refund orders, once a human approved it.",
        tools=tools if tools is not None else [refund_with_approval],
        input_guardrails=[no_fraud],
    )


async def refund_agent(job: Job) -> Succeed:
    order = job.task.params["order"]
    result = await AgentdbRunner.run(refund_desk(), f"Refund order {order}", run_config=OFFLINE)
    return Succeed(payload={"output": result.final_output})


async def refund_agent_plain(job: Job) -> Succeed:
    """The control: the same agent on the SDK's own Runner.run."""
    order = job.task.params["order"]
    result = await Runner.run(refund_desk(), f"Refund order {order}", run_config=OFFLINE)
    return Succeed(payload={"output": result.final_output})


async def approval_agent(job: Job) -> Succeed | Fail:
    order = job.task.params["order"]
    try:
        result = await AgentdbRunner.run(
            approval_desk(), f"Refund order {order}", run_config=OFFLINE
        )
    except InputGuardrailTripwireTriggered:
        return Fail("the guardrail stopped it")
    return Succeed(payload={"output": result.final_output})


HANDLERS = {
    "refund_agent": refund_agent,
    "refund_agent_plain": refund_agent_plain,
    "approval_agent": approval_agent,
}
