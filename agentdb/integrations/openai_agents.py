"""The OpenAI Agents SDK on agentdb: ``AgentdbRunner.run`` is ``Runner.run`` with a ledger.

A drop-in for the SDK's ``Runner.run`` in the shape ``DBOSRunner`` set, called inside
an agentdb task handler (``pip install 'agentdb-pg[openai-agents]'``)::

    async def support(job: Job) -> Succeed:
        result = await AgentdbRunner.run(triage_agent, job.task.params["question"])
        return Succeed(payload={"answer": result.final_output})

The run is the task's: the worker that runs the handler leases it, a crash
anywhere re-enters the handler from the top, and the run replays from what the
task's ledger recorded (G25):

* **Model requests are steps.** Every agent's model (agents reached by a handoff
  too) is wrapped so each ``get_response`` is a step named
  ``<run>/m<n>/<agent>#<fingerprint>``: the run's name, the request's number in the
  run, the agent's name and a hash of the request (instructions, input, settings,
  tool and handoff definitions, output schema). An identical request replays the
  recorded ``ModelResponse`` (output items and usage, stored as JSON and rebuilt);
  a changed prompt after a deploy asks the model again. With ``model_cost=`` a
  request is an effect instead, holding that estimate on the tenant's budgets
  and settled with the tokens it used (G19).
* **Function tools are effects.** Each call of a ``@function_tool`` is an effect
  named ``<run>/tool/<agent>/<tool>/<call id>`` (the call id is the model's,
  stable because the response replays from the ledger), its arguments hashed,
  reserved before the function runs (G13). The function reads the operation's
  idempotency key with :func:`current_idempotency_key` and hands it to its
  provider. A call whose outcome a crash left unknown is called again **with
  the same key** (or asks the worker's reconcile hook for the tool's name, or
  parks for an operator with ``reconcile=MANUAL``) - never without it. A tool
  marked :func:`read_only` is a plain step.
* **A tool that fails** with :class:`~agentdb.worker.NotPerformed` (or the SDK's
  ``ModelBehaviorError`` for bad arguments, or a class given as ``definite=``)
  did nothing: the model is shown the tool's failure message, as the SDK does,
  and that message is recorded so a replay shows the same one. Any other
  exception has an unknown outcome: the attempt ends, and the task's next
  attempt settles it as above - the model is not told.
* **Approvals.** A tool with the SDK's ``needs_approval`` interrupts the run; the
  runner then waits for an agentdb approval (G22) named
  :func:`approval_signal` of the call id - the task sleeps holding no worker -
  and resumes the run with the tool call approved or rejected (the model sees
  the SDK's rejection message). :func:`approve` sends one; approving twice
  performs the tool once.
* **Names are enforced.** A run re-entered after a deploy that renamed an agent
  (or removed a tool a recorded response called) fails with
  :class:`~agentdb.errors.StepMissing` naming the recorded step, never with a wrong replay.

Not durable here: streaming (``run_streamed`` raises), SDK sessions (they would
store each replayed turn again), MCP servers' tools and agents used as tools
(an agent-as-tool is one effect, its inner run not replayed step by step), and a
tool's changes to the run's ``context`` (a replayed call does not make them
again: return what matters). Input and output guardrails are steps.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import importlib
import json
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from agents import (
    Agent,
    FunctionTool,
    GuardrailFunctionOutput,
    Handoff,
    InputGuardrail,
    Model,
    ModelResponse,
    ModelSettings,
    OutputGuardrail,
    RunConfig,
    Runner,
    RunResult,
    Tool,
    ToolApprovalItem,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.exceptions import ModelBehaviorError
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import ModelTracing
from agents.run_internal.turn_preparation import get_model, get_model_settings
from agents.tool import maybe_invoke_function_tool_failure_error_function
from agents.tool_context import ToolContext
from agents.usage import deserialize_usage, serialize_usage
from openai.types.responses import ResponseOutputItem
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic import BaseModel, TypeAdapter

from agentdb import signals
from agentdb.budgets import Cost
from agentdb.errors import ConfigurationError, StepConflict, StepMissing
from agentdb.hashing import input_hash
from agentdb.integrations._openai_offline import (
    OfflineModel,
    OfflineProvider,
    Reply,
    Request,
    call,
    say,
)
from agentdb.models import Signal
from agentdb.worker.durable import Durable, NotPerformed, Performed, Reconcile, running_job

__all__ = [
    "AgentdbRunner",
    "ModelRequest",
    "OfflineModel",
    "OfflineProvider",
    "Reply",
    "Request",
    "approval_signal",
    "approve",
    "call",
    "current_idempotency_key",
    "current_step",
    "durable_tool",
    "pending_approvals",
    "read_only",
    "say",
]

_T = TypeVar("_T")
_OUTPUT_ITEM: Final = TypeAdapter[ResponseOutputItem](ResponseOutputItem)
_KEY: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "openai_agents.idempotency_key", default=None
)
_STEP: Final[contextvars.ContextVar[str | None]] = contextvars.ContextVar(
    "openai_agents.step", default=None
)
# The runs each job started in this attempt, by name: a second run of one name is "<name>.2".
_RUNS: Final[weakref.WeakKeyDictionary[Durable, dict[str, int]]] = weakref.WeakKeyDictionary()
_SIGNAL_MAX: Final = 100


def current_idempotency_key() -> str | None:
    """The idempotency key of the tool call running in this context (hand it to the provider):
    the same on every attempt of that call. ``None`` outside a durable tool call (a
    :func:`read_only` tool, or a run of the SDK's own ``Runner``)."""
    return _KEY.get()


def current_step() -> str | None:
    """The name of the step (a model request or a tool call) running in this context."""
    return _STEP.get()


class _Escape(BaseException):
    """Carries what must end the attempt (an agentdb error, an effect whose outcome is unknown)
    through the SDK, which turns a tool's ``Exception`` into a message for the model."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


# ---- per-tool options ----------------------------------------------------------------------


@dataclass(frozen=True)
class _ToolOptions:
    read_only: bool = False
    cost: Cost | None = None
    reconcile: Reconcile = None
    definite: tuple[type[BaseException], ...] = ()


_OPTIONS_ATTR: Final = "__agentdb_options__"
_ORIGINAL_ATTR: Final = "__agentdb_original__"


def durable_tool(
    tool: FunctionTool,
    *,
    read_only: bool = False,
    cost: Cost | None = None,
    reconcile: Reconcile = None,
    definite: tuple[type[BaseException], ...] = (),
) -> FunctionTool:
    """Set how ``tool`` runs under :class:`AgentdbRunner` (and return it): ``read_only`` - a
    plain step; ``cost`` - held on the tenant's budgets at reserve (G19; the function may
    return a :class:`~agentdb.worker.Performed` with the actual cost); ``reconcile`` - a hook
    or ``MANUAL`` for an unknown outcome; ``definite`` - exceptions meaning nothing was done."""
    setattr(tool, _OPTIONS_ATTR, _ToolOptions(read_only, cost, reconcile, tuple(definite)))
    return tool


def read_only(tool: FunctionTool) -> FunctionTool:
    """Mark ``tool`` a read: it runs as a plain step (may run again if a crash lands mid-call)."""
    return durable_tool(tool, read_only=True)


def _options(tool: FunctionTool, run: _Run) -> _ToolOptions:
    found = getattr(tool, _OPTIONS_ATTR, None)
    opts = found if isinstance(found, _ToolOptions) else _ToolOptions()
    if tool.name in run.read_only:
        opts = dataclasses.replace(opts, read_only=True)
    if tool.name in run.tool_costs:
        opts = dataclasses.replace(opts, cost=run.tool_costs[tool.name])
    return opts


# ---- names ---------------------------------------------------------------------------------


def _part(text: str, limit: int) -> str:
    """``text`` as a part of a step name: as it is, or cut and suffixed with its hash."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 9]}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def approval_signal(call_id: str) -> str:
    """The name of the approval signal a tool call with ``call_id`` waits for."""
    return _part(f"approval/{call_id}", _SIGNAL_MAX)


async def approve(
    db: Any,
    tenant_id: Any,
    task_id: Any,
    call_id: str,
    *,
    approver: str,
    decision: str = "approved",
    comment: str | None = None,
) -> Signal:
    """Approve (or reject) the tool call ``call_id`` of a task's run: :func:`signals.approve
    <agentdb.signals.approve>` with the call's signal name. Sent twice, the run takes the first.
    """
    return await signals.approve(
        db, tenant_id, task_id, approver=approver, decision=decision, comment=comment,
        name=approval_signal(call_id),
    )  # fmt: skip


async def pending_approvals(db: Any, tenant_id: Any, task_id: Any) -> list[dict[str, Any]]:
    """The tool calls a task's runs wait on an approval for: each with its ``agent``, ``tool``,
    ``arguments``, ``call_id`` and the ``signal`` name to send (:func:`approve`)."""
    from agentdb import steps

    led = await steps.ledger(db, tenant_id, task_id)
    asked = [s for name, s in led.steps.items() if name.endswith("/asked") and "/approval/" in name]
    waiting = []
    for s in asked:
        wait = led.steps.get(s.name.removesuffix("/asked"))
        if wait is None or wait.state != "done":
            waiting.append(dict(s.result))
    return waiting


# ---- JSON forms of the SDK's values ---------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """``value`` as JSON data (pydantic models dumped), for fingerprints."""
    return json.loads(json.dumps(value, default=_default, sort_keys=True))


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return repr(value)


def _dump_value(value: Any) -> Any:
    """A tool's output or a guardrail's info as recorded: JSON as it is, a pydantic model with
    its class (rebuilt on load), anything else as its ``str`` (what the SDK shows the model)."""
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return {"json": value}
    if isinstance(value, BaseModel):
        cls = type(value)
        return {"model": f"{cls.__module__}:{cls.__qualname__}",
                "data": value.model_dump(mode="json")}  # fmt: skip
    return {"json": str(value)}


def _load_value(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    if "model" in doc:
        module, _, qualname = str(doc["model"]).partition(":")
        try:
            cls: Any = importlib.import_module(module)
            for attr in qualname.split("."):
                cls = getattr(cls, attr)
            return cls.model_validate(doc["data"])
        except (ImportError, AttributeError, ValueError):
            return doc["data"]
    return doc.get("json")


def _dump_response(response: ModelResponse) -> dict[str, Any]:
    return {
        "output": [item.model_dump(mode="json") for item in response.output],
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
        "raw_usage": response.raw_usage,
    }


def _load_response(doc: Mapping[str, Any]) -> ModelResponse:
    output: list[TResponseOutputItem] = [_OUTPUT_ITEM.validate_python(i) for i in doc["output"]]
    return ModelResponse(
        output=output,
        usage=deserialize_usage(doc["usage"]),
        response_id=doc.get("response_id"),
        request_id=doc.get("request_id"),
        raw_usage=doc.get("raw_usage"),
    )


def _tool_doc(tool: Tool) -> Any:
    if isinstance(tool, FunctionTool):
        return {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
            "strict": tool.strict_json_schema,
        }
    return {"type": type(tool).__name__, "name": getattr(tool, "name", None)}


def _settings_doc(settings: ModelSettings) -> Any:
    doc = _jsonable(settings.to_json_dict())
    if isinstance(doc, dict):
        doc.pop("prompt_cache_key", None)  # a cache hint, not the request
    return doc


# ---- the run -------------------------------------------------------------------------------


@dataclass
class _Run:
    """One ``AgentdbRunner.run``: its job, its name and the number of its last model request."""

    job: Durable
    name: str
    read_only: frozenset[str]
    tool_costs: Mapping[str, Cost]
    model_cost: Callable[[ModelRequest], Cost | None] | None
    model_action: str
    seq: int = 0
    guards: dict[str, int] = field(default_factory=dict)
    clones: dict[int, Agent[Any]] = field(default_factory=dict)

    def step(self, *parts: str) -> str:
        return "/".join((self.name, *parts))


@dataclass(frozen=True)
class ModelRequest:
    """What a ``model_cost`` hook is asked about: one model request of a run."""

    agent: str
    step: str
    system_instructions: str | None
    input: str | list[TResponseInputItem]
    tools: list[Tool]


def _tools_called(response: Mapping[str, Any]) -> list[str]:
    return [
        str(item.get("name"))
        for item in response.get("output", [])
        if isinstance(item, dict) and item.get("type") == "function_call"
    ]


class _DurableModel(Model):
    """An agent's model whose every ``get_response`` is a step (or, with a cost, an effect)."""

    def __init__(self, inner: Model, agent: str, run: _Run) -> None:
        self.inner = inner
        self.agent = agent
        self.run = run

    async def close(self) -> None:
        await self.inner.close()

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
        run = self.run
        run.seq += 1
        request = {
            "instructions": system_instructions,
            "input": _jsonable(input),
            "settings": _settings_doc(model_settings),
            "tools": [_tool_doc(t) for t in tools],
            "output": None
            if output_schema is None
            else [output_schema.name(), output_schema.is_strict_json_schema(),
                  None if output_schema.is_plain_text() else output_schema.json_schema()],
            "handoffs": [[h.tool_name, h.tool_description, h.input_json_schema] for h in handoffs],
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": _jsonable(prompt),
        }  # fmt: skip
        fingerprint = input_hash(request)[:16]
        agent = _part(self.agent, 80)
        head = run.step(f"m{run.seq}") + "/"
        name = f"{head}{agent}#{fingerprint}"
        callable_names = {t.name for t in tools if isinstance(t, FunctionTool)}
        callable_names |= {h.tool_name for h in handoffs}
        job = run.job
        try:
            await self._check_recorded(head, agent, callable_names)

            async def ask() -> dict[str, Any]:
                token = _STEP.set(name)
                try:
                    response = await self.inner.get_response(
                        system_instructions, input, model_settings, tools, output_schema,
                        handoffs, tracing, previous_response_id=previous_response_id,
                        conversation_id=conversation_id, prompt=prompt,
                    )  # fmt: skip
                finally:
                    _STEP.reset(token)
                return {"agent": self.agent, "response": _dump_response(response)}

            estimate = None
            if run.model_cost is not None:
                estimate = run.model_cost(
                    ModelRequest(self.agent, name, system_instructions, input, tools)
                )
            if estimate is None:
                doc = await job.step(name, ask)
            else:

                async def ask_once(*, idempotency_key: str) -> Performed:
                    done = await ask()
                    return Performed(done, cost=_actual(estimate, done["response"]["usage"]))

                doc = await job.effect(
                    name, ask_once, action=run.model_action, cost=estimate, definite=(Exception,)
                )
        except _Escape:
            raise
        except StepConflict as exc:
            raise _Escape(exc) from exc
        except Exception as exc:
            if _is_agentdb(exc):
                raise _Escape(exc) from exc
            raise
        return _load_response(doc["response"])

    async def _check_recorded(self, head: str, agent: str, callable_names: set[str]) -> None:
        """Refuse a replay whose recorded steps this run's code can no longer reach (G25)."""
        job = self.run.job
        led = await job.ledger()
        task_key = f"{job.task.id}/"
        recorded: dict[str, Any] = {n: s.result for n, s in led.steps.items() if n.startswith(head)}
        for key, effect in led.effects.items():
            if key.startswith(task_key + head) and effect.state == "succeeded":
                recorded[key.removeprefix(task_key)] = effect.result
        for step, doc in recorded.items():
            step_agent = step[len(head) :].rsplit("#", 1)[0]
            if step_agent != agent:
                raise self._renamed(
                    step, f"was recorded for agent {step_agent!r}, and this run reached agent "
                    f"{agent!r} there: an agent was renamed (or the run's path changed)",
                )  # fmt: skip
            response = doc.get("response", {}) if isinstance(doc, dict) else {}
            missing = [t for t in _tools_called(response) if t not in callable_names]
            if missing:
                raise self._renamed(
                    step, f"recorded a call to {', '.join(map(repr, missing))}, which agent "
                    f"{agent!r} no longer has: a tool or handoff was renamed or removed",
                )  # fmt: skip

    def _renamed(self, step: str, why: str) -> StepMissing:
        job = self.run.job
        return StepMissing(
            f"step {step!r} of task {job.task.id} {why}; a recorded step is never replayed "
            "for another one - run it to its end on the code that recorded it, or cancel it",
            tenant_id=job.task.tenant_id, step=step,
        )  # fmt: skip

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
    ) -> Any:
        raise _streaming_unsupported()


def _actual(estimate: Cost, usage: Mapping[str, Any]) -> Cost:
    """What a model request cost: its tokens where the estimate counts tokens, else the estimate."""
    spent = dict(estimate)
    if "tokens" in spent:
        spent["tokens"] = int(usage.get("total_tokens") or 0)
    return spent


def _is_agentdb(exc: BaseException) -> bool:
    from agentdb.errors import AgentDBError

    return isinstance(exc, AgentDBError)


def _streaming_unsupported() -> ConfigurationError:
    return ConfigurationError(
        "AgentdbRunner does not stream: a streamed response cannot be replayed event by event "
        "from the ledger. Use AgentdbRunner.run (each model request is recorded whole)"
    )


# ---- tools ---------------------------------------------------------------------------------


class _DurableInvoker:
    """A function tool's ``on_invoke_tool``: the call as an effect (or a step), its failures
    shown to the model the SDK's way and recorded, everything else ending the attempt."""

    def __init__(self, tool: FunctionTool, agent: str, run: _Run) -> None:
        self.tool = tool
        self.agent = agent
        self.run = run
        self.original = tool.on_invoke_tool
        # Inside the SDK's failure handler: the function (and its argument parsing) alone.
        self.inner: Callable[[ToolContext[Any], str], Awaitable[Any]] = getattr(
            self.original, "_invoke_tool_impl", self.original
        )

    def prepare_arguments(self, input: str, tool_name: str) -> Any:
        prepare = getattr(self.original, "prepare_arguments", None)
        return prepare(input, tool_name) if prepare is not None else None

    async def __call__(self, ctx: ToolContext[Any], input: str) -> Any:
        run, tool = self.run, self.tool
        opts = _options(tool, run)
        name = run.step("tool", _part(self.agent, 40), _part(tool.name, 40),
                        _part(ctx.tool_call_id, 40))  # fmt: skip
        shown = f"{name}/failed"
        job = run.job
        definite = (NotPerformed, ModelBehaviorError, *opts.definite)
        # What the model is shown as the tool's failure (recorded): a read's every exception,
        # an effect's only when it definitely did nothing.
        shown_errors: tuple[type[BaseException], ...] = (Exception,) if opts.read_only else definite
        try:
            led = await job.ledger()
            if shown in led.steps:  # the model was shown a failure: show it the same one
                return led.steps[shown].result

            async def call(arguments: str, *, idempotency_key: str | None = None) -> Any:
                key_token, step_token = _KEY.set(idempotency_key), _STEP.set(name)
                try:
                    value = await self.inner(ctx, arguments)
                finally:
                    _KEY.reset(key_token)
                    _STEP.reset(step_token)
                if isinstance(value, Performed):
                    return Performed(_dump_value(value.value), value.reference, value.cost)
                return _dump_value(value)

            try:
                if opts.read_only:
                    doc = await job.step(name, call, input)
                else:
                    doc = await job.effect(
                        name, call, input, action=_part(tool.name, 60), cost=opts.cost,
                        reconcile=opts.reconcile, definite=definite,
                    )  # fmt: skip
            except shown_errors as exc:
                if _is_agentdb(exc):
                    raise
                message = await maybe_invoke_function_tool_failure_error_function(
                    function_tool=tool, context=ctx, error=exc
                )
                if message is None:
                    raise
                recorded: str = await job.step(shown, _same, message)
                return recorded
        except _Escape:
            raise
        except Exception as exc:
            # An agentdb error, or an effect whose outcome is unknown: the attempt ends here.
            raise _Escape(exc) from exc
        return _load_value(doc)


def _same(value: _T) -> _T:
    return value


# ---- wrapping agents -----------------------------------------------------------------------


def _wrap_agent(agent: Agent[Any], run: _Run, config: RunConfig) -> Agent[Any]:
    """A clone of ``agent`` whose model, tools, guardrails and handoffs record on the ledger."""
    # A clone an earlier run handed back (``result.last_agent``) is wrapped from its original.
    agent = getattr(agent, _ORIGINAL_ATTR, agent)
    found = run.clones.get(id(agent))
    if found is not None:
        return found
    inner = get_model(agent, config)
    settings = get_model_settings(agent, dataclasses.replace(config, model_settings=None))
    clone = agent.clone(model=_DurableModel(inner, agent.name, run), model_settings=settings)
    setattr(clone, _ORIGINAL_ATTR, agent)
    run.clones[id(agent)] = clone
    clone.tools = [_wrap_tool(t, agent.name, run) for t in agent.tools]
    clone.input_guardrails = [_wrap_guard(g, "input", agent.name, run)
                              for g in agent.input_guardrails]  # fmt: skip
    clone.output_guardrails = [_wrap_guard(g, "output", agent.name, run)
                               for g in agent.output_guardrails]  # fmt: skip
    handoffs: list[Agent[Any] | Handoff[Any, Any]] = []
    for h in agent.handoffs:
        if isinstance(h, Agent):
            handoffs.append(_wrap_agent(h, run, config))
        elif isinstance(h, Handoff):
            handoffs.append(_wrap_handoff(h, run, config))
        else:
            handoffs.append(h)
    clone.handoffs = handoffs
    return clone


def _wrap_tool(tool: Tool, agent: str, run: _Run) -> Tool:
    if not isinstance(tool, FunctionTool):
        return tool
    copied = dataclasses.replace(tool)  # the SDK's own copy, failure policy rebound to it
    copied.on_invoke_tool = _DurableInvoker(tool, agent, run)
    return copied


def _wrap_handoff(h: Handoff[Any, Any], run: _Run, config: RunConfig) -> Handoff[Any, Any]:
    original = h.on_invoke_handoff

    async def invoke(ctx: Any, input_json: str) -> Agent[Any]:
        target = await original(ctx, input_json)
        return _wrap_agent(target, run, config) if isinstance(target, Agent) else target

    return dataclasses.replace(h, on_invoke_handoff=invoke)


def _wrap_guard(guard: Any, kind: str, agent: str, run: _Run) -> Any:
    original = guard.guardrail_function
    label = _part(guard.get_name(), 60)

    async def check(*args: Any) -> GuardrailFunctionOutput:
        key = f"{kind}/{agent}/{label}"
        run.guards[key] = n = run.guards.get(key, 0) + 1
        name = run.step("guard", kind, _part(agent, 60), label, str(n))

        async def decide() -> dict[str, Any]:
            out = original(*args)
            if isinstance(out, Awaitable):
                out = await out
            return {"info": _dump_value(out.output_info), "tripwire": out.tripwire_triggered}

        try:
            doc = await run.job.step(name, decide)
        except Exception as exc:
            if _is_agentdb(exc):
                raise _Escape(exc) from exc
            raise
        return GuardrailFunctionOutput(
            output_info=_load_value(doc["info"]), tripwire_triggered=bool(doc["tripwire"])
        )

    if isinstance(guard, InputGuardrail | OutputGuardrail):
        return dataclasses.replace(guard, guardrail_function=check)
    return guard


# ---- the runner ----------------------------------------------------------------------------


def _job(job: Durable | None) -> Durable:
    found = job if job is not None else running_job()
    if found is None:
        raise ConfigurationError(
            "AgentdbRunner.run runs inside an agentdb task handler (the worker's running job), "
            "or is given job=: outside one there is no ledger to record the run on"
        )
    return found


def _run_name(job: Durable, name: str) -> str:
    started = _RUNS.setdefault(job, {})
    started[name] = n = started.get(name, 0) + 1
    return name if n == 1 else f"{name}.{n}"


def _call_id(item: ToolApprovalItem) -> str:
    raw = item.raw_item
    found = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return str(found or getattr(raw, "id", "") or "")


class AgentdbRunner:
    """``Runner.run`` on agentdb, shaped as ``DBOSRunner``: the same arguments, the same
    ``RunResult``, each model request a step and each tool call an effect of the running job.
    """

    @classmethod
    async def run(
        cls,
        starting_agent: Agent[Any],
        input: str | list[TResponseInputItem],
        *,
        job: Durable | None = None,
        name: str = "agent",
        read_only: Iterable[str] = (),
        tool_costs: Mapping[str, Cost] | None = None,
        model_cost: Callable[[ModelRequest], Cost | None] | None = None,
        model_action: str = "model",
        **kwargs: Any,
    ) -> RunResult:
        """Run ``starting_agent`` on ``input`` as ``Runner.run(starting_agent, input, **kwargs)``
        does - durably: see the module's docstring.

        agentdb's options: ``job`` (default: the running job), ``name`` (the run's steps'
        prefix; a second run of one name in a handler is ``<name>.2``), ``read_only`` (tool
        names run as plain steps), ``tool_costs`` (tool name -> cost held per call, G19),
        ``model_cost`` (request -> cost estimate: model requests become effects of action
        ``model_action`` holding it, settled with the tokens used).

        Raises:
            StepMissing: a recorded step this code no longer reaches (G25).
            ConfigurationError: outside a handler; ``session=``; a ``RunState`` input.
            Suspended: (not for the handler to catch) the run waits for an approval.
            whatever ``Runner.run`` raises (a guardrail's tripwire, ``MaxTurnsExceeded``).
        """
        durable = _job(job)
        if kwargs.get("session") is not None:
            raise ConfigurationError(
                "AgentdbRunner.run takes no session=: the ledger replays each turn, and a "
                "session would store the replayed turns again; pass the history as input"
            )
        if not isinstance(input, str | list):
            raise ConfigurationError(
                "AgentdbRunner.run starts a run from its input; approvals are agentdb's "
                "(approve()), so a RunState is never handed back to resume"
            )
        run = _Run(
            durable, _run_name(durable, name), frozenset(read_only), dict(tool_costs or {}),
            model_cost, model_action,
        )  # fmt: skip
        given = kwargs.pop("run_config", None)
        config = RunConfig(**given) if isinstance(given, dict) else (given or RunConfig())
        agent = _wrap_agent(starting_agent, run, config)
        # Every agent's model is resolved (and wrapped) above, named by its agent.
        config = dataclasses.replace(config, model=None)
        try:
            result = await Runner.run(agent, input, run_config=config, **kwargs)
            while result.interruptions:
                state = result.to_state()
                for item in result.interruptions:
                    await cls._decide(run, state, item)
                resume = {k: v for k, v in kwargs.items()
                          if k in ("max_turns", "hooks", "error_handlers")}  # fmt: skip
                result = await Runner.run(agent, state, run_config=config, **resume)
        except _Escape as escaped:
            raise escaped.error  # noqa: B904 - the error itself, as if the SDK were not between
        return result

    @staticmethod
    async def _decide(run: _Run, state: Any, item: ToolApprovalItem) -> None:
        call_id = _call_id(item)
        tool = str(item.tool_name or item.name or "tool")
        agent = item.agent.name
        step = run.step("approval", _part(agent, 40), _part(tool, 40), _part(call_id, 40))
        signal = approval_signal(call_id)
        asked = {"agent": agent, "tool": tool, "arguments": item.arguments, "call_id": call_id,
                 "signal": signal}  # fmt: skip
        await run.job.step(f"{step}/asked", _same, asked)
        answer = await run.job.wait_for_signal(step, signal)  # sleeps, holding no worker
        if answer.decision == "approved":
            state.approve(item)
        else:
            comment = (answer.payload or {}).get("comment")
            state.reject(
                item,
                rejection_message=None if comment is None else f"Not approved: {comment}",
            )

    @classmethod
    def run_streamed(cls, *args: Any, **kwargs: Any) -> Any:
        """Not supported: raises :class:`~agentdb.errors.ConfigurationError`."""
        raise _streaming_unsupported()

    @classmethod
    def run_sync(cls, *args: Any, **kwargs: Any) -> Any:
        """Not supported: a handler is async - ``await AgentdbRunner.run(...)``."""
        raise ConfigurationError("AgentdbRunner runs inside an async handler: await .run(...)")


# Imported for their types in signatures above (keeps the public names the SDK's).
_ = (TResponseStreamEvent,)
