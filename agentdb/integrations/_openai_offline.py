"""An offline stand-in for the OpenAI API: a scripted ``Model`` for tests and examples.

Each answer is a function of the request - the conversation so far and the tools the
agent has - so the same request gets the same answer in any process, as a replay
needs (the SDK's ``agents.testing.ScriptedModel`` answers from a queue instead, which
a fresh worker process would start again from the top). No network, no API key:
pass ``RunConfig(model_provider=OfflineProvider(script))`` to the run. Re-exported by
:mod:`agentdb.integrations.openai_agents`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agents import Handoff, ModelProvider, ModelResponse, ModelSettings, Tool, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model, ModelTracing
from agents.testing import assistant_message, function_call
from openai.types.responses.response_prompt_param import ResponsePromptParam

__all__ = ["OfflineModel", "OfflineProvider", "Reply", "Request", "Script", "call", "say"]


def _plain(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    dumped: dict[str, Any] = item.model_dump(mode="json", exclude_none=True)
    return dumped


@dataclass(frozen=True)
class Request:
    """One model request, as a script reads it."""

    instructions: str | None
    items: list[dict[str, Any]]
    tools: list[str]
    handoffs: list[str]

    def last_user(self) -> str:
        """The text of the user's last message."""
        for item in reversed(self.items):
            if item.get("role") == "user":
                content = item.get("content")
                return content if isinstance(content, str) else json.dumps(content)
        return ""

    def this_turn(self) -> list[dict[str, Any]]:
        """The items after the user's last message."""
        for i in range(len(self.items) - 1, -1, -1):
            if self.items[i].get("role") == "user":
                return self.items[i + 1 :]
        return self.items

    def results(self) -> dict[str, str]:
        """The outputs of this turn's tool calls, by tool name."""
        names = {
            i["call_id"]: i["name"] for i in self.this_turn() if i.get("type") == "function_call"
        }
        return {
            names.get(i["call_id"], "?"): str(i.get("output"))
            for i in self.this_turn()
            if i.get("type") == "function_call_output"
        }

    def call_id(self, tool: str) -> str:
        """A call id that is the same whenever the conversation is."""
        return f"call_{len(self.items)}_{tool}"


#: What a script answers: the response's output items.
Reply = list[TResponseOutputItem]
Script = Callable[[Request], Reply]


def say(text: str) -> Reply:
    return [assistant_message(text)]


def call(request: Request, *calls: tuple[str, dict[str, Any]]) -> Reply:
    return [function_call(name, args, call_id=request.call_id(name)) for name, args in calls]


class OfflineModel(Model):
    """Answers every request with ``script(request)``; counts what it was asked."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.asked = 0

    @classmethod
    def calling(cls, tool: str, **arguments: Any) -> OfflineModel:
        """A model that calls ``tool`` with ``arguments`` once, then answers with its output."""

        def script(request: Request) -> Reply:
            done = request.results()
            return say(done[tool]) if tool in done else call(request, (tool, arguments))

        return cls(script)

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
        self.asked += 1
        items = (
            [{"role": "user", "content": input}]
            if isinstance(input, str)
            else [_plain(i) for i in input]
        )
        request = Request(
            system_instructions,
            items,
            [str(getattr(t, "name", "")) for t in tools],
            [h.tool_name for h in handoffs],
        )
        output = self.script(request)
        words = sum(len(json.dumps(_plain(i))) for i in items) // 4
        usage = Usage(requests=1, input_tokens=words, output_tokens=10, total_tokens=words + 10)
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(
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
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the offline model does not stream")


class OfflineProvider(ModelProvider):
    """Every model name is the one offline model."""

    def __init__(self, script: Script | OfflineModel) -> None:
        self.model = script if isinstance(script, OfflineModel) else OfflineModel(script)

    def get_model(self, model_name: str | None) -> Model:
        return self.model
