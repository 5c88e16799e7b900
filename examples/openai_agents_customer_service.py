"""The OpenAI Agents SDK's customer-service example (examples/customer_service/main.py) on agentdb.

The context, tools, hook and agents are the SDK's, as written; the one change is the
runner line - ``AgentdbRunner.run`` for ``Runner.run`` - and, since there is no API key
here, the run is given an offline model (``run_config=OFFLINE``; drop it to use
OpenAI). The interactive loop of the SDK's ``main()`` becomes a handler that takes the
customer's messages from the task::

    agentdb worker examples.openai_agents_customer_service:HANDLERS --dsn "$DATABASE_URL"
"""

from __future__ import annotations
from __future__ import annotations as _annotations

import random
import re
from typing import Union

from agents import (
    Agent,
    HandoffOutputItem,
    ItemHelpers,
    MessageOutputItem,
    RunConfig,
    RunContextWrapper,
    ToolCallItem,
    ToolCallOutputItem,
    TResponseInputItem,
    function_tool,
    handoff,
)
from agents.extensions.handoff_prompt import RECOMMENDED_PROMPT_PREFIX
from pydantic import BaseModel

from agentdb.integrations.openai_agents import (
    AgentdbRunner,
    OfflineProvider,
    Reply,
    Request,
    call,
    say,
)
from agentdb.worker import Job, Succeed

### CONTEXT


class AirlineAgentContext(BaseModel):
    passenger_name: Union[str, None] = None  # noqa: UP007 - the SDK's example, as written
    confirmation_number: Union[str, None] = None  # noqa: UP007
    seat_number: Union[str, None] = None  # noqa: UP007
    flight_number: Union[str, None] = None  # noqa: UP007


### TOOLS


@function_tool(
    name_override="faq_lookup_tool", description_override="Lookup frequently asked questions."
)
async def faq_lookup_tool(question: str) -> str:
    if "bag" in question or "baggage" in question:
        return (
            "You are allowed to bring one bag on the plane. "
            "It must be under 50 pounds and 22 inches x 14 inches x 9 inches."
        )
    elif "seats" in question or "plane" in question:
        return (
            "There are 120 seats on the plane. "
            "There are 22 business class seats and 98 economy seats. "
            "Exit rows are rows 4 and 16. "
            "Rows 5-8 are Economy Plus, with extra legroom. "
        )
    elif "wifi" in question:
        return "We have free wifi on the plane, join Airline-Wifi"
    return "I'm sorry, I don't know the answer to that question."


@function_tool
async def update_seat(
    context: RunContextWrapper[AirlineAgentContext], confirmation_number: str, new_seat: str
) -> str:
    """
    Update the seat for a given confirmation number.

    Args:
        confirmation_number: The confirmation number for the flight.
        new_seat: The new seat to update to.
    """
    # Update the context based on the customer's input
    context.context.confirmation_number = confirmation_number
    context.context.seat_number = new_seat
    # Ensure that the flight number has been set by the incoming handoff
    assert context.context.flight_number is not None, "Flight number is required"
    return f"Updated seat to {new_seat} for confirmation number {confirmation_number}"


### HOOKS


async def on_seat_booking_handoff(context: RunContextWrapper[AirlineAgentContext]) -> None:
    flight_number = f"FLT-{random.randint(100, 999)}"
    context.context.flight_number = flight_number


### AGENTS

faq_agent = Agent[AirlineAgentContext](
    name="FAQ Agent",
    handoff_description="A helpful agent that can answer questions about the airline.",
    instructions=f"""{RECOMMENDED_PROMPT_PREFIX}
    You are an FAQ agent. If you are speaking to a customer, you probably were transferred to from the triage agent.
    Use the following routine to support the customer.
    # Routine
    1. Identify the last question asked by the customer.
    2. Use the faq lookup tool to answer the question. Do not rely on your own knowledge.
    3. If you cannot answer the question, transfer back to the triage agent.""",  # noqa: E501
    tools=[faq_lookup_tool],
)

seat_booking_agent = Agent[AirlineAgentContext](
    name="Seat Booking Agent",
    handoff_description="A helpful agent that can update a seat on a flight.",
    instructions=f"""{RECOMMENDED_PROMPT_PREFIX}
    You are a seat booking agent. If you are speaking to a customer, you probably were transferred to from the triage agent.
    Use the following routine to support the customer.
    # Routine
    1. Ask for their confirmation number.
    2. Ask the customer what their desired seat number is.
    3. Use the update seat tool to update the seat on the flight.
    If the customer asks a question that is not related to the routine, transfer back to the triage agent. """,  # noqa: E501
    tools=[update_seat],
)

triage_agent = Agent[AirlineAgentContext](
    name="Triage Agent",
    handoff_description="A triage agent that can delegate a customer's request to the appropriate agent.",  # noqa: E501
    instructions=(
        f"{RECOMMENDED_PROMPT_PREFIX} "
        "You are a helpful triaging agent. You can use your tools to delegate questions to other appropriate agents."  # noqa: E501
    ),
    handoffs=[
        faq_agent,
        handoff(agent=seat_booking_agent, on_handoff=on_seat_booking_handoff),
    ],
)

faq_agent.handoffs.append(triage_agent)
seat_booking_agent.handoffs.append(triage_agent)


### THE OFFLINE MODEL (what OpenAI's would answer, scripted)


def airline(request: Request) -> Reply:
    question = request.last_user().lower()
    seat = re.search(r"seat (?:to )?(\w+)", question)
    booking = seat is not None and re.search(r"\bchange|move|update\b", question) is not None
    tool, target = (
        ("update_seat", "transfer_to_seat_booking_agent")
        if booking
        else ("faq_lookup_tool", "transfer_to_faq_agent")
    )
    done = request.results()
    if tool in done:
        return say(done[tool])
    if tool in request.tools:
        if tool == "update_seat" and seat is not None:
            confirmation = re.search(r"confirmation (?:number )?(\w+)", question)
            args = {"confirmation_number": confirmation[1].upper() if confirmation else "?",
                    "new_seat": seat[1].upper()}  # fmt: skip
            return call(request, (tool, args))
        return call(request, (tool, {"question": question}))
    if target in request.handoffs:
        return call(request, (target, {}))
    return call(request, ("transfer_to_triage_agent", {}))


OFFLINE = RunConfig(model_provider=OfflineProvider(airline))


### RUN: the SDK's main() loop, one customer message after another


async def customer_service(job: Job) -> Succeed:
    current_agent: Agent[AirlineAgentContext] = triage_agent
    input_items: list[TResponseInputItem] = []
    context = AirlineAgentContext()
    transcript: list[str] = []

    for user_input in job.task.params["messages"]:
        input_items.append({"content": user_input, "role": "user"})
        result = await AgentdbRunner.run(
            current_agent, input_items, context=context, run_config=OFFLINE
        )

        for new_item in result.new_items:
            agent_name = new_item.agent.name
            if isinstance(new_item, MessageOutputItem):
                transcript.append(f"{agent_name}: {ItemHelpers.text_message_output(new_item)}")
            elif isinstance(new_item, HandoffOutputItem):
                transcript.append(
                    f"Handed off from {new_item.source_agent.name} to {new_item.target_agent.name}"
                )
            elif isinstance(new_item, ToolCallItem):
                transcript.append(f"{agent_name}: Calling a tool")
            elif isinstance(new_item, ToolCallOutputItem):
                transcript.append(f"{agent_name}: Tool call output: {new_item.output}")
            else:
                transcript.append(f"{agent_name}: Skipping item: {new_item.__class__.__name__}")
        input_items = result.to_input_list()
        current_agent = result.last_agent
    return Succeed(payload={"transcript": transcript})


HANDLERS = {"customer_service": customer_service}
