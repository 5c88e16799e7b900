"""The OpenAI Agents SDK's human-in-the-loop example (examples/agent_patterns/human_in_the_loop.py)
on agentdb.

The tools and the agent are the SDK's, as written; the change is the runner line:
``AgentdbRunner.run`` for ``Runner.run`` (given an offline model here, as there is no API
key). The SDK's approval loop - save the ``RunState``, ask, ``state.approve``, run again -
is agentdb's: the run waits for an approval of the call (``openai_agents.approve``, by
someone who is not the worker), the task sleeping meanwhile, holding no worker::

    agentdb worker examples.openai_agents_human_in_the_loop:HANDLERS --dsn "$DATABASE_URL"
"""

from __future__ import annotations

import re
from typing import Any

from agents import Agent, RunConfig, function_tool

from agentdb.integrations.openai_agents import (
    AgentdbRunner,
    OfflineProvider,
    Reply,
    Request,
    call,
    say,
)
from agentdb.worker import Job, Succeed


@function_tool
async def get_weather(city: str) -> str:
    """Get the weather for a given city.

    Args:
        city: The city to get weather for.

    Returns:
        Weather information for the city.
    """
    return f"The weather in {city} is sunny"


async def _needs_temperature_approval(_ctx: Any, params: dict[str, Any], _call_id: str) -> bool:
    """Check if temperature tool needs approval."""
    return "Oakland" in params.get("city", "")


@function_tool(
    # Dynamic approval: only require approval for Oakland
    needs_approval=_needs_temperature_approval
)
async def get_temperature(city: str) -> str:
    """Get the temperature for a given city.

    Args:
        city: The city to get temperature for.

    Returns:
        Temperature information for the city.
    """
    return f"The temperature in {city} is 20° Celsius"


# Main agent with tool that requires approval
agent = Agent(
    name="Weather Assistant",
    instructions=(
        "You are a helpful weather assistant. "
        "Answer questions about weather and temperature using the available tools."
    ),
    tools=[get_weather, get_temperature],
)


def weather(request: Request) -> Reply:
    """The offline model: ask both tools, then answer with what they said."""
    city = re.search(r"in ([A-Z]\w+)", request.last_user())
    done = request.results()
    if not done:
        args = {"city": city[1] if city else "Paris"}
        return call(request, ("get_weather", args), ("get_temperature", args))
    return say(" ".join(done[t] for t in ("get_weather", "get_temperature")))


OFFLINE = RunConfig(model_provider=OfflineProvider(weather))


async def weather_assistant(job: Job) -> Succeed:
    result = await AgentdbRunner.run(
        agent, "What is the weather and temperature in Oakland?", run_config=OFFLINE
    )
    return Succeed(payload={"final_output": result.final_output})


HANDLERS = {"weather_assistant": weather_assistant}
