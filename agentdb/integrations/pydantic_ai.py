"""Pydantic AI on agentdb: an agent run inside a task, its model requests as steps, its tool
calls as effects performed exactly once (G13, G25).

Attach :class:`AgentdbDurability` to an agent, as Pydantic AI's Temporal, DBOS and
Prefect backends are attached, and run the agent inside an agentdb task handler::

    agent = Agent(model, name="support", tools=[refund], capabilities=[AgentdbDurability()])

    async def support(job: Job) -> Succeed:
        result = await agent.run(job.task.params["question"])
        return Succeed(payload={"answer": result.output})

Inside a handler the run is durable; outside one the agent runs as it would without
the capability. What each part of a run becomes:

* **A model request** is a step (:meth:`~agentdb.worker.Job.step`): its response is
  recorded, and a handler re-entered after a crash or a wait replays it instead of
  asking the model again. The step's name carries its place in the run and a
  fingerprint of the request (messages, settings, tool definitions - never the
  timestamps): an identical request replays, a request changed by a deploy (another
  prompt) is asked anew. Only a request whose response was never recorded - the
  worker died while the model answered - is asked again. With ``model_cost=`` a
  request is an effect instead, its cost held on the tenant's budgets (G19) before
  the model is asked.
* **A tool call** - a function tool, a dynamic toolset's, an MCP server's - is an
  effect (:meth:`~agentdb.worker.Job.effect`): its operation is reserved and
  committed before the tool runs, its arguments hashed (the same call with other
  arguments is a :class:`~agentdb.errors.StepConflict`, never a replay), and its
  result recorded. The tool reads the operation's idempotency key with
  :func:`idempotency_key` and hands it to its provider; an MCP server gets it in
  the request's ``_meta`` through :func:`mcp_idempotency_key`. A tool that raises
  :class:`~agentdb.worker.NotPerformed` is called again on the next attempt; one
  whose outcome is unknown (it raised anything else, or the worker died) is called
  again **with the same key** - or asks a reconcile hook, or waits for an operator
  (``reconcile``, below). A read may opt out: ``metadata={"agentdb": {"read_only":
  True}}`` makes the tool a plain step.
* **A tool that requires approval** (``requires_approval=True``, or one that raises
  ``ApprovalRequired``) waits for an agentdb approval (G22) named
  ``approval:<tool call id>`` (:func:`approval_name`): the task sleeps holding no
  worker, an approval by another principal (``signals.approve``) wakes it, the run
  replays up to the call and goes on; a rejection answers the model that the call was
  denied. :func:`pending_approvals` lists what a task waits for.
* **A durable sleep** of the run (between polls of a background response) is
  :meth:`~agentdb.worker.Job.sleep`.

Places are stable names, never hoped for: every step's name holds the run's number
within the task, the step's number within the run, the agent's name and the tool's
(``ai/<run>/<n>/<agent>__function_toolset__<id>.call_tool:<tool>``). A run re-entered
after a deploy that renamed or removed what it had recorded at a place fails with
:class:`~agentdb.errors.StepMissing` naming the recorded step, rather than replaying
another call's result or performing an effect a second time under a new name.

Per-tool settings go in the tool's metadata under ``"agentdb"``: ``read_only``
(a step, not an effect), ``cost`` (a :data:`~agentdb.budgets.Cost` held per call),
``reconcile`` (a hook or :data:`~agentdb.worker.MANUAL`), ``definite`` (exception
classes that mean "not performed").

**Events.** With ``events_topic=``, each tool call the run makes and each result it
gets (``FunctionToolCallEvent``, ``FunctionToolResultEvent``) is an outbox message
of that topic for the task (G10: delivered at least once by the relay, its id
fixed by the run and the event's number, so a replayed run writes none twice).
Model response deltas are not sent: they are not replayed. An
``event_stream_handler`` of yours is not recorded: it runs again when a run is
replayed (at least once).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import uuid
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, Literal, cast

import pydantic_core
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.capabilities import AbstractCapability, HandleDeferredToolCalls
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationId,
    EventStreamHandlerId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
)
from pydantic_ai.messages import AgentStreamEvent, FunctionToolCallEvent, FunctionToolResultEvent
from pydantic_ai.models import Model
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolDenied,
)

from agentdb import _db, outbox, steps
from agentdb.budgets import Cost
from agentdb.errors import ConfigurationError, DuplicateKey, StepMissing
from agentdb.models import Signal
from agentdb.worker.durable import Durable, NotPerformed, Performed, Suspended, running_job
from agentdb.worker.outcomes import ReconcileHook

__all__ = [
    "AgentdbDurability",
    "approval_name",
    "idempotency_key",
    "mcp_idempotency_key",
    "pending_approvals",
]

#: Every step of an agent run starts with this, then the run's number in the task.
PREFIX: Final = "ai"
_SIGNAL_MAX: Final = 100  # agent_signals_name_valid
_VOLATILE: Final = frozenset(
    # What differs between two runs making the same request: clocks and run ids.
    {"timestamp", "request_timestamp", "duration", "run_id", "conversation_id"}
)

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pydantic_ai_idempotency_key", default=None
)


def idempotency_key() -> str:
    """The idempotency key of the tool call running now: hand it to the provider.

    Raises:
        ConfigurationError: not inside a tool call that runs as an agentdb effect.
    """
    key = _KEY.get()
    if key is None:
        raise ConfigurationError(
            "idempotency_key() is for a tool called by an agent run inside an agentdb task "
            "handler, as an effect (not a read_only tool, not outside a handler)"
        )
    return key


async def mcp_idempotency_key(
    ctx: RunContext[Any], call_tool: Any, name: str, args: dict[str, Any]
) -> Any:
    """An ``MCPToolset``'s ``process_tool_call``: the call's idempotency key goes to the
    server in the request's ``_meta`` (``{"idempotency_key": ...}``), for a server that
    honours one (``MCPToolset(server, process_tool_call=mcp_idempotency_key)``)."""
    key = _KEY.get()
    return await call_tool(name, args, metadata=None if key is None else {"idempotency_key": key})


def approval_name(tool_call_id: str) -> str:
    """The signal name an approval of tool call ``tool_call_id`` is sent as
    (``signals.approve(..., name=approval_name(id))``)."""
    name = f"approval:{tool_call_id}"
    if len(name) > _SIGNAL_MAX:  # an id longer than a signal name may be: its digest
        name = "approval:" + hashlib.sha256(tool_call_id.encode()).hexdigest()[:40]
    return name


@dataclass
class _Run:
    """One agent run in one attempt of a task: its number and how far it got."""

    job: Durable
    agent: str
    number: int
    places: int = 0
    events: int = 0
    reached: set[str] = field(default_factory=set)

    def place(self) -> str:
        self.places += 1
        return f"{PREFIX}/{self.number}/{self.places}"


# Per attempt (a Job lives for one), per agent name: how many runs it started, so a
# handler that runs two agents, or one twice, numbers them the same on every re-entry.
_RUNS: weakref.WeakKeyDictionary[Durable, dict[str, int]] = weakref.WeakKeyDictionary()
_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "pydantic_ai_run", default=None
)
_RUN_IDS: weakref.WeakKeyDictionary[Durable, dict[str, _Run]] = weakref.WeakKeyDictionary()


def _canonical(value: object) -> object:
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _fingerprint(*parts: object) -> str:
    """A digest of a request as the model would see it, without clocks or run ids."""
    plain = pydantic_core.to_jsonable_python(
        parts, fallback=lambda v: type(v).__name__, serialize_unknown=True
    )
    text = json.dumps(_canonical(plain), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _recorded_names(job: Durable, prefix: str) -> set[str]:
    """Names of steps and effects recorded at a place (``ai/<run>/<n>/``)."""
    led = job._ledger  # read by the caller's job.ledger() first
    assert led is not None
    names = {name for name in led.steps if name.startswith(prefix)}
    own = f"{job.task.id}/"
    names.update(
        key[len(own) :]
        for key in led.effects
        if key.startswith(own) and key[len(own) :].startswith(prefix)
    )
    return names


def _check_place(job: Durable, place: str, name: str, *, model: str | None) -> None:
    """Refuse a place whose record is of another step (a rename or a removal by a deploy).

    A model request recorded there with another fingerprint is not a rename: the request
    changed (another prompt), and it is asked anew under its own name.
    """
    for recorded in _recorded_names(job, place + "/"):
        if recorded == name:
            continue
        if model is not None and recorded.rsplit("@", 1)[0] == model:
            continue
        raise StepMissing(
            f"task {job.task.id} recorded step {recorded!r} where this run reaches {name!r}: "
            "the agent, a tool or a toolset was renamed or removed since that step was "
            "recorded. A recorded step is never answered for another call and an effect is "
            "never performed again under a new name - finish or cancel the task with the "
            "code that started it",
            tenant_id=job.task.tenant_id,
            step=recorded,
        )


class _Backend(CallableOperationBackend[dict[str, Any]]):
    """Runs each of a run's durable operations as a step or an effect of the running job."""

    def __init__(self, capability: AgentdbDurability[Any]) -> None:
        # A tool's settings: its metadata under "agentdb" (the framework reads them).
        resolve = capability._build_resolve_tool_config({})

        def tool_config(
            operation_id: DurableOperationId, tool: object | None, tool_name: str
        ) -> dict[str, Any] | Literal[False]:
            return cast("dict[str, Any] | Literal[False]", resolve(cast(Any, tool), tool_name))

        super().__init__(
            namer=JournalOperationNamer(capability.name),
            config=RoleBasedOperationConfig(
                model={}, event={}, capability={}, tool={}, resolve_tool=tool_config
            ),
        )
        self._capability = capability

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: dict[str, Any],
    ) -> object:
        job = running_job()
        run = _CURRENT.get()
        if job is None or run is None or isinstance(operation_id, EventStreamHandlerId):
            return await body()  # not recorded: see the module docstring
        await job.ledger()
        place = run.place()
        if isinstance(operation_id, ModelRequestId):
            model_id, messages, settings, params = cache_key[:4]
            fingerprint = _fingerprint(
                model_id,
                ModelMessagesTypeAdapter.dump_python(cast(Any, messages), mode="json"),
                settings,
                params,
            )
            model = f"{place}/{name}"
            step = f"{model}@{fingerprint}"
            _check_place(job, place, step, model=model)
            run.reached.add(step)
            return await self._capability._model_request(job, step, body)
        if isinstance(operation_id, ToolsetCallToolId):
            tool_name, tool_args = cache_key[0], cache_key[1]
            label = name if name.endswith(f":{tool_name}") else f"{name}:{tool_name}"
            step = f"{place}/{label}"
            _check_place(job, place, step, model=None)
            run.reached.add(step)
            args = pydantic_core.to_jsonable_python(tool_args, serialize_unknown=True)
            if config.get("read_only"):
                return await job.step(step, _plain(body), args)
            try:
                return await job.effect(
                    step,
                    _keyed(body),
                    args,
                    action=str(config.get("action") or tool_name),
                    cost=cast("Cost | None", config.get("cost")),
                    reconcile=cast("ReconcileHook | None", config.get("reconcile")),
                    definite=tuple(config.get("definite", ())),
                )
            except _Declined as declined:
                return declined.payload
        # Discovery, validation, compaction, token counts, capability operations: reads,
        # recorded so a replay sees what the first run saw.
        step = f"{place}/{name}"
        _check_place(job, place, step, model=None)
        run.reached.add(step)
        return await job.step(step, _plain(body), _fingerprint(cache_key[:-1]))


def _plain(body: Callable[[], Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    async def call(*_: object) -> object:
        return await body()

    return call


#: What a tool answers when it did nothing: it asked for approval or for a deferred call,
#: asked the model to retry, or its arguments did not validate.
_DECLINED: Final = frozenset(
    {"approval_required", "call_deferred", "model_retry", "validation_error"}
)


class _Declined(NotPerformed):
    """The tool declined the call (:data:`_DECLINED`): the operation is recorded failed -
    nothing was performed - and the framework is handed the tool's answer."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(f"the tool answered {payload['kind']}: nothing performed")
        self.payload = payload


def _keyed(body: Callable[[], Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    async def call(*_: object, idempotency_key: str) -> object:
        token = _KEY.set(idempotency_key)
        try:
            payload = await body()
        finally:
            _KEY.reset(token)
        if isinstance(payload, dict) and payload.get("kind") in _DECLINED:
            raise _Declined(payload)
        return payload

    return call


def _usage_of(payload: object) -> Mapping[str, Any]:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return cast("Mapping[str, Any]", usage) if isinstance(usage, dict) else {}


class _ToOutbox:
    """An event-stream handler: the run's tool calls and results as outbox messages."""

    def __init__(self, topic: str, then: EventStreamHandler[Any] | None) -> None:
        self.topic = topic
        self.then = then

    async def __call__(self, ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        job, run = running_job(), _CURRENT.get()
        seen: list[AgentStreamEvent] = []
        async for event in events:
            seen.append(event)
            if job is None or run is None:
                continue
            if not isinstance(event, FunctionToolCallEvent | FunctionToolResultEvent):
                continue
            # Numbered among the events a replay emits again, in the order the run
            # reaches them (tool calls one at a time): the same id on every re-entry.
            run.events += 1
            message_id = uuid.uuid5(job.task.id, f"{PREFIX}/{run.number}/event/{run.events}")
            payload = {
                "agent": run.agent,
                "run": run.number,
                "event": pydantic_core.to_jsonable_python(
                    event, fallback=lambda v: type(v).__name__, serialize_unknown=True
                ),
            }
            # A DuplicateKey: an earlier run of this task sent it.
            with contextlib.suppress(DuplicateKey):
                async with _db.transaction(job.pool) as conn:
                    await outbox.enqueue(
                        conn, job.task.tenant_id, self.topic, payload,
                        task_id=job.task.id, message_id=message_id,
                    )  # fmt: skip
        if self.then is not None:

            async def again() -> AsyncIterator[AgentStreamEvent]:
                for event in seen:
                    yield event

            await self.then(ctx, again())


@dataclass(init=False, kw_only=True)
class AgentdbDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable on agentdb when it runs inside a task handler (module docstring).

    Args:
        name: the name in every step of the agent's runs (default: the agent's ``name``);
            it must not change while tasks that ran the agent are unfinished.
        models: further models a run may switch to, by id (as the framework's other
            durability capabilities take them).
        model_cost: an estimate held on the tenant's budgets (G19) before each model
            request; the request is then an effect, settled with ``usage_cost`` of the
            response's usage (default: the estimate).
        usage_cost: what a response's usage (its JSON form: ``input_tokens``,
            ``output_tokens``, ...) cost, in the units of ``model_cost``.
        approvals: whether tools that require approval wait for agentdb approvals
            (default); ``False`` leaves them to the run's own handling
            (``DeferredToolRequests`` output, or a ``HandleDeferredToolCalls`` of yours).
        events_topic: the outbox topic each tool call and tool result of a run is sent
            to (module docstring); ``None`` sends none.
        event_stream_handler: yours, as the framework takes it (run again on replay).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="agentdb",
        durable_unit_noun="step",
        durable_container_noun="task",
        codec=JSON_CODEC,  # every record is JSON in agent_steps / agent_operations
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            # Steps run in the handler's own process: one MCP session per run.
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        journal_discovery=True,
        # Places are numbered in the order the run reaches them: tool calls one at a time,
        # so a re-entry numbers them as the first run did.
        sequential_tools_in_durable_context=True,
        tool_config_key="agentdb",
        control_flow_error_types=(Suspended,),
    )

    def __init__(
        self,
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        model_cost: Cost | None = None,
        usage_cost: Callable[[Mapping[str, Any]], Cost] | None = None,
        approvals: bool = True,
        events_topic: str | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
    ) -> None:
        handler = event_stream_handler
        if events_topic is not None:
            handler = _ToOutbox(events_topic, event_stream_handler)
        super().__init__(models=models, name=name, event_stream_handler=handler)
        self._model_cost = model_cost
        self._usage_cost = usage_cost
        self._approvals = approvals

    # --- where a run is durable ----------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        return running_job() is not None

    def get_durable_operation_backend(self) -> _Backend:
        return _Backend(self)

    def get_default_run_id(self) -> str | None:
        """The run's id, the same on every re-entry: the task's id and the run's number."""
        job = running_job()
        if job is None:
            return None
        counts = _RUNS.setdefault(job, {})
        number = counts[self.name] = counts.get(self.name, 0) + 1
        run_id = str(uuid.uuid5(job.task.id, f"{self.name}#{number}"))
        runs = _RUN_IDS.setdefault(job, {})
        runs[run_id] = _Run(job, self.name, len(runs) + 1)
        return run_id

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: Any) -> Any:
        job = running_job()
        run = None if job is None else _RUN_IDS.get(job, {}).get(ctx.run_id or "")
        if job is None or run is None:
            return await super().wrap_run(ctx, handler=handler)
        token = _CURRENT.set(run)
        try:
            result = await super().wrap_run(ctx, handler=handler)
        finally:
            _CURRENT.reset(token)
        self._check_all_reached(job, run)
        return result

    def _check_all_reached(self, job: Durable, run: _Run) -> None:
        """A finished run reached every effect its earlier runs recorded (module docstring)."""
        own = f"{job.task.id}/"
        led = job._ledger
        if led is None:
            return
        prefix = f"{PREFIX}/{run.number}/"
        for key in led.effects:
            name = key[len(own) :] if key.startswith(own) else ""
            if name.startswith(prefix) and name not in run.reached:
                raise StepMissing(
                    f"task {job.task.id} recorded effect {name!r}, which this run of agent "
                    f"{self.name!r} never reached: a tool or toolset was renamed or removed "
                    "since it was performed - finish or cancel the task with the code that "
                    "started it",
                    tenant_id=job.task.tenant_id,
                    step=name,
                )

    async def durable_sleep(self, seconds: float) -> None:
        job, run = running_job(), _CURRENT.get()
        if job is None or run is None:
            await super().durable_sleep(seconds)
            return
        await job.sleep(f"{run.place()}/sleep", timedelta(seconds=max(seconds, 0)))

    # --- model requests -------------------------------------------------------------------

    async def _model_request(
        self, job: Durable, step: str, body: Callable[[], Awaitable[object]]
    ) -> object:
        if self._model_cost is None:
            return await job.step(step, _plain(body))
        usage_cost = self._usage_cost

        async def ask(*, idempotency_key: str) -> Performed:
            payload = await body()
            cost = None if usage_cost is None else usage_cost(_usage_of(payload))
            return Performed(payload, cost=cost)

        return await job.effect(step, ask, action="model", cost=self._model_cost)

    # --- approvals ----------------------------------------------------------------------

    def _companion_capabilities(self) -> list[AbstractCapability[AgentDepsT]]:
        around = super()._companion_capabilities()
        if self._approvals:
            around.append(HandleDeferredToolCalls(handler=_approve))
        return around


async def _approve(
    ctx: RunContext[Any], requests: DeferredToolRequests
) -> DeferredToolResults | None:
    """Each call that requires approval waits for an agentdb approval of its own (G22)."""
    job, run = running_job(), _CURRENT.get()
    if job is None or run is None or not requests.approvals:
        return None  # outside a handler: the run's own handling
    results = DeferredToolResults()
    for call in requests.approvals:
        step = f"{run.place()}/approval:{call.tool_name}"
        signal = approval_name(call.tool_call_id)
        await job.step(
            step + "/asked",
            _asked,
            {"tool_call_id": call.tool_call_id, "tool": call.tool_name,
             "args": call.args_as_dict(), "signal": signal},
        )  # fmt: skip
        answer: Signal = await job.wait_for_signal(step, signal)
        if answer.decision == "approved":
            results.approvals[call.tool_call_id] = True
        else:
            comment = answer.payload.get("comment") if isinstance(answer.payload, dict) else None
            results.approvals[call.tool_call_id] = ToolDenied(
                f"The call was rejected by {answer.sender}" + (f": {comment}" if comment else ".")
            )
    return results


async def _asked(request: dict[str, Any]) -> dict[str, Any]:
    return request


async def pending_approvals(
    db: _db.Executor, tenant_id: uuid.UUID, task_id: uuid.UUID
) -> list[dict[str, Any]]:
    """The tool calls a task's agent runs wait to have approved: for each, ``tool_call_id``,
    ``tool``, ``args`` and the ``signal`` to approve it with (:func:`approval_name`)."""
    led = await steps.ledger(db, tenant_id, task_id)
    pending = []
    for name, step in led.steps.items():
        if name.startswith(f"{PREFIX}/") and name.endswith("/asked"):
            wait = led.steps.get(name.removesuffix("/asked"))
            if (wait is None or wait.state != "done") and isinstance(step.result, dict):
                pending.append(step.result)
    return pending
