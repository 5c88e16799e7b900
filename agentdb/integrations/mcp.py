"""An MCP server kit: tool calls exactly once, durable long-running tools, single-use approvals.

``pip install 'agentdb-pg[mcp]'`` (pinned to the ``mcp`` SDK release it is tested
against). A server author adds it to an existing ``MCPServer``::

    kit = ExactlyOnce(os.environ["DATABASE_URL"], identity=from_headers())
    server = MCPServer("payments", extensions=[kit])

    @server.tool()
    @kit.effect()
    async def pay(to: str, amount: int) -> dict[str, str]:
        return await psp.charge(to, amount, idempotency_key=idempotency_key())

The protocol gives a server nothing to tell a retry from a new call: a broken
stream is re-sent as a new request with a new request id. So each call of an
effect tool is keyed by what the caller means, and the kit keeps that key's
ledger in Postgres:

* **Identity of a call (G4).** (tenant, principal, tool, the caller's
  idempotency key) names the call: the key comes from the request's
  ``_meta.idempotency_key`` (what
  :func:`agentdb.integrations.pydantic_ai.mcp_idempotency_key` sends), or from
  an argument (``@kit.effect(key_argument="request_id")``). The arguments are
  hashed canonically (:mod:`agentdb.hashing`): the same key with other arguments
  is a typed tool error (``IdempotencyConflict``), never the other call's result.
  Tenant and principal come from the server's auth context through the
  ``identity`` callable (:func:`from_headers` for a trusted gateway, or your own
  reading the OAuth token); a call it gives no tenant for is refused.
* **Reserve, call, record (G13).** The operation is reserved and committed
  before the tool body runs; the body reads the call's key with
  :func:`idempotency_key` and hands it to its provider; what the SDK made of the
  body's return value - the ``CallToolResult`` - is recorded, and every answer,
  the first included, is that record read back: a repeat returns it byte for
  byte. A body that raises :class:`NotPerformed` (or ``ToolError``: it refused
  before doing anything) is recorded failed and the next attempt calls it again;
  anything else it raises leaves the call ``unknown``.
* **A server that died mid-call.** While it runs the body, the server holds a
  Postgres session advisory lock on the call's key (``mcp_call_lock``).
  A retry that finds the operation unsettled and cannot take the lock is told
  the call is in flight (a live server runs it). One that takes the lock knows
  the first server died between the call and its record: the operation becomes
  ``unknown``, and the tool's ``reconcile`` hook (``async def hook(op) ->
  Reconciled | None``, as for workers) asks the provider what happened - a
  success is recorded and returned, ``None`` means it never happened and the
  body runs again. Without a hook the call answers a tool error saying its
  outcome is unknown, until an operator settles it
  (:func:`agentdb.operations.reconcile`). Never a silent second call. (The lock
  needs a session: not behind PgBouncer in transaction mode.)
* **Which task holds the calls.** An operation belongs to a task. A tool call
  has none, and a task of its own per call could never be finished without a
  worker's lease (only ``running`` may move to ``succeeded``), so each
  (tenant, principal) gets one ledger task (type ``mcp.principal``, created
  once by its dedupe key, ``waiting`` for ever, never claimed) whose operations
  are that principal's calls and whose audit trail is theirs. Cancelling it
  (G20) stops every further effect of that principal: the database refuses
  new operations for a finished task (AG012).
* **Single-use approvals (G22).** ``@kit.effect(approval=True)`` asks the
  caller to approve each call first (the 2026-07-28 multi-round-trip flow: an
  ``InputRequiredResult`` with a form elicitation and a ``request_state``). The
  answer is recorded as an approval signal on the principal's ledger task, in
  the same transaction that reserves the operation it unlocks: either both
  commit or neither. The state names the call (its key's digest and its
  arguments' hash) and a nonce, the signal's dedupe key: an answer presented for
  another call, after its deadline, a second time, or to a principal whose
  ledger task is cancelled is refused.
* **Trace context (G16).** ``_meta.traceparent`` becomes the parent of the
  tool's span (``execute_tool <name>``, with the OpenTelemetry GenAI attributes
  ``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``
  and ``error.type``) when an OpenTelemetry SDK is configured, and the trace
  and span ids of the operation and its events either way.

:class:`DurableTasks` serves the Tasks extension (``io.modelcontextprotocol/tasks``)
on the same kit: a tool declared long-running runs as an agentdb task - see
its docstring for what SDK 2.3.0 carries of the extension and what is built here.

Tool errors are typed: ``isError`` results whose ``_meta["io.github.agentdb/error"]``
names the agentdb error (``type``) and the guarantee it stands for.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import inspect
import json
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any, Final, TypeVar, cast

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer, require_client_extension
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    CreateMessageRequest,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequest,
    InputRequiredResult,
    InputResponse,
    ListRootsRequest,
    ListRootsResult,
    RequestParams,
    TextContent,
)
from pydantic import BaseModel, ConfigDict, TypeAdapter

from agentdb import _db, _mcp_calls, operations, signals, steps, tasks, telemetry
from agentdb._db.pool import create_pool
from agentdb.errors import (
    AgentDBError,
    ConfigurationError,
    IdempotencyConflict,
    NotFound,
    OperationInFlight,
    PayloadTooLarge,
)
from agentdb.hashing import input_hash
from agentdb.models import Operation, Reservation, Task
from agentdb.worker import Job, Succeed
from agentdb.worker.durable import NotPerformed, running_job
from agentdb.worker.outcomes import ReconcileHook

__all__ = [
    "ERROR_META",
    "TASKS_EXTENSION",
    "DurableTasks",
    "ExactlyOnce",
    "Identity",
    "NotPerformed",
    "TaskParams",
    "UpdateTaskParams",
    "ask",
    "ask_input",
    "from_headers",
    "idempotency_key",
    "tool_error",
]

#: Where a typed tool error names its agentdb error: ``_meta[ERROR_META]``.
ERROR_META: Final = "io.github.agentdb/error"
#: The Tasks extension's identifier (SEP-2663).
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
#: The ledger task of each (tenant, principal): the holder of its calls' operations.
LEDGER_TYPE: Final = "mcp.principal"
_APPROVAL_INPUT: Final = "agentdb.approval"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_F = TypeVar("_F", bound=Callable[..., Any])

try:  # optional: the tool span (G16) when an OpenTelemetry SDK is configured
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised without the otel extra
    _trace = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Identity:
    """Who calls: the tenant every row is scoped to, and the principal acting in it."""

    tenant: uuid.UUID
    principal: str


#: ``identity(ctx)``: the caller's tenant and principal from the server's auth
#: context (the HTTP request on ``ctx.request``, the OAuth token through
#: ``mcp.server.auth.middleware.auth_context.get_access_token()``), or ``None``:
#: the call is refused.
IdentityFn = Callable[
    [ServerRequestContext[Any, Any]], "Identity | Awaitable[Identity | None] | None"
]


def from_headers(
    tenant: str = "x-agentdb-tenant", principal: str = "x-agentdb-principal"
) -> IdentityFn:
    """An ``identity`` reading the tenant id and the principal from two HTTP headers.

    Only behind a gateway that authenticates the caller and sets both headers
    itself (dropping what the client sent): a header is what the client says.
    """

    def read(ctx: ServerRequestContext[Any, Any]) -> Identity | None:
        headers = getattr(ctx.request, "headers", None)
        if headers is None:
            return None
        raw, who = headers.get(tenant), headers.get(principal)
        if not raw or not who:
            return None
        try:
            return Identity(uuid.UUID(raw), who)
        except ValueError:
            return None

    return read


_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcp_idempotency_key", default=None
)


def idempotency_key() -> str:
    """The idempotency key of the effect tool call running now: hand it to the provider.

    It is tenant- and principal-scoped (a digest of both with the tool and the
    caller's key), so two tenants sending the same key never share an effect.

    Raises:
        ConfigurationError: not inside a call of a tool declared with :meth:`ExactlyOnce.effect`.
    """
    key = _KEY.get()
    if key is None:
        raise ConfigurationError(
            "idempotency_key() is for the body of a tool declared with @kit.effect(), "
            "called through the server"
        )
    return key


def tool_error(
    kind: str, message: str, *, guarantee: str | None = None, **details: Any
) -> CallToolResult:
    """A typed tool error: ``isError``, the message as text, the type in ``_meta[ERROR_META]``."""
    typed = {"type": kind, **({"guarantee": guarantee} if guarantee else {}), **details}
    return CallToolResult(
        content=[TextContent(type="text", text=message)], is_error=True, _meta={ERROR_META: typed}
    )


def _refusal(exc: AgentDBError, message: str | None = None) -> CallToolResult:
    return tool_error(
        type(exc).__name__, message or str(exc), guarantee=getattr(exc, "guarantee", None)
    )


# --- trace context (G16) ---------------------------------------------------------------


def _traceparent(meta: Mapping[str, Any] | None) -> str | None:
    value = (meta or {}).get("traceparent")
    if isinstance(value, str) and _TRACEPARENT.match(value.strip().lower()):
        return value.strip().lower()
    return None


@dataclass(slots=True)
class _Span:
    """The tool's trace ids for its rows, and the span to mark failed (if one records)."""

    trace_id: str | None = None
    span_id: str | None = None
    otel: Any = None

    def fail(self, error_type: str) -> None:
        if self.otel is not None:
            self.otel.set_attribute("error.type", error_type)
            self.otel.set_status(_trace.Status(_trace.StatusCode.ERROR))


@contextlib.contextmanager
def _tool_span(tool: str, call_id: str, traceparent: str | None) -> Iterator[_Span]:
    """``execute_tool <tool>``, child of the caller's ``traceparent``; ids for the rows (G16)."""
    span = _Span()
    if traceparent is not None:
        found = _TRACEPARENT.match(traceparent)
        assert found is not None
        span.trace_id, span.span_id = found.group(1), found.group(2)
    if _trace is None or isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        yield span  # no SDK: the caller's ids still go on the rows
        return
    current = _trace.get_current_span().get_span_context()
    same_trace = span.trace_id is None or format(current.trace_id, "032x") == span.trace_id
    if current.is_valid and same_trace:
        # The server framework's own span of this request (SDK 2.3 and FastMCP open
        # `tools/call <name>`, itself a child of the caller's traceparent): ours nests in it.
        parent = None
    else:
        parent = TraceContextTextMapPropagator().extract(
            {"traceparent": traceparent} if traceparent else {}
        )
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
    }
    tracer = _trace.get_tracer("agentdb.integrations.mcp")
    with tracer.start_as_current_span(
        f"execute_tool {tool}", context=parent, attributes=attributes
    ) as otel:
        span.otel = otel
        span.trace_id, span.span_id = telemetry.current_ids()
        yield span


# --- the effect tools -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Effect:
    name: str
    reconcile: ReconcileHook | None
    key_argument: str | None
    approval: bool
    definite: tuple[type[BaseException], ...]


@dataclass(slots=True)
class _Outcome:
    """What the tool body did, told by its wrapper to the interceptor around the SDK."""

    raised: BaseException | None = None


_OUTCOME: contextvars.ContextVar[_Outcome | None] = contextvars.ContextVar(
    "mcp_effect_outcome", default=None
)


def _wrap(fn: _F) -> _F:
    """``fn``, telling the interceptor what it raised (the SDK turns it into a text)."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result
        except BaseException as exc:
            if (outcome := _OUTCOME.get()) is not None:
                outcome.raised = exc
            raise

    return cast(_F, run)


def _op_key(identity: Identity, tool: str, key: str) -> str:
    """The operation's key: tool plus a digest of who called and their key (<= 255 chars)."""
    who = json.dumps([str(identity.tenant), identity.principal, tool, key])
    return f"mcp/{tool[:150]}/{hashlib.sha256(who.encode()).hexdigest()[:40]}"


def _stored(result: HandlerResult) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(result or {})


def _replay(op: Operation) -> CallToolResult:
    """A recorded call's result, as recorded - or the error a call with no answer gets."""
    doc = op.result
    if isinstance(doc, dict) and doc.get("$agentdb") == "unrecorded":
        return tool_error(
            "ResultNotRecorded",
            f"the call was performed, and its result ({doc.get('bytes')} bytes) was too large "
            "to record: it cannot be answered again",
            guarantee="G13",
        )
    if not isinstance(doc, dict) or "content" not in doc:  # reconciled from a provider
        text = json.dumps(doc, sort_keys=True)
        structured = doc if isinstance(doc, dict) else None
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=structured
        )
    return CallToolResult.model_validate(doc, by_name=False)


class ExactlyOnce(Extension):
    """Effect tools exactly once per call key; answers replayed as recorded (module docstring).

    ``db`` is a DSN (the pool is opened in the server's event loop on first use) or
    an agentdb pool of that loop. ``identity`` gives each call its tenant and
    principal (see :data:`IdentityFn`). ``approval_ttl``: how long an approval
    request stays answerable.
    """

    identifier = "io.github.agentdb/exactly-once"

    def __init__(
        self,
        db: str | _db.Pool,
        *,
        identity: IdentityFn,
        approval_ttl: timedelta = timedelta(minutes=10),
    ) -> None:
        self._db = db
        self._pool_: _db.Pool | None = None
        self.identity = identity
        self.approval_ttl = approval_ttl
        self._effects: dict[str, _Effect] = {}
        self._ledgers: dict[Identity, uuid.UUID] = {}

    def settings(self) -> dict[str, Any]:
        return {"idempotencyKey": "_meta.idempotency_key"}

    async def pool(self) -> _db.Pool:
        """The kit's pool (opened on first use when given a DSN)."""
        if self._pool_ is None:
            if isinstance(self._db, str):
                self._pool_ = await create_pool(self._db)
            else:
                self._pool_ = self._db
        return self._pool_

    async def close(self) -> None:
        """Close the pool the kit opened itself (not one it was given)."""
        if self._pool_ is not None and isinstance(self._db, str):
            await self._pool_.close()
        self._pool_ = None

    def effect(
        self,
        name: str | None = None,
        *,
        reconcile: ReconcileHook | None = None,
        key_argument: str | None = None,
        approval: bool = False,
        definite: tuple[type[BaseException], ...] = (),
    ) -> Callable[[_F], _F]:
        """Declare a tool an effect: each call runs once per key (module docstring).

        Put it under ``@server.tool()``; ``name`` is the tool's name if it is not the
        function's. ``reconcile`` asks the provider about a call whose server died
        mid-call; ``key_argument`` names an argument carrying the caller's key (the
        other arguments are what is hashed); ``approval`` asks the caller to approve
        each call first (single use, G22); ``definite``: exceptions meaning "not
        performed", besides :class:`NotPerformed` and ``ToolError``.
        """

        def register(fn: _F) -> _F:
            tool = name or fn.__name__
            self._effects[tool] = _Effect(tool, reconcile, key_argument, approval, definite)
            return _wrap(fn)

        return register

    async def _identity(self, ctx: ServerRequestContext[Any, Any] | None) -> Identity | None:
        if ctx is None:  # called from inside the server, not by a client: no one to scope it to
            return None
        found = self.identity(ctx)
        if inspect.isawaitable(found):
            found = await found
        return found

    async def ledger(self, pool: _db.Pool, identity: Identity) -> uuid.UUID:
        """The (tenant, principal) ledger task holding the principal's calls (created once)."""
        if (known := self._ledgers.get(identity)) is not None:
            return known
        task = await tasks.create(
            pool,
            identity.tenant,
            LEDGER_TYPE,
            params={"principal": identity.principal},
            dedupe_key=f"mcp/principal/{hashlib.sha256(identity.principal.encode()).hexdigest()}",
            waiting=True,
            actor=identity.principal[:200],
        )
        self._ledgers[identity] = task.id
        return task.id

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name not in self._effects:  # a read, or a tool the kit was not asked to guard
            return await call_next(ctx)
        return await self.guard(params, ctx, lambda: call_next(ctx))

    def guards(self, tool: str) -> bool:
        """Whether ``tool`` was declared with :meth:`effect`."""
        return tool in self._effects

    async def guard(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any] | None,
        call: Callable[[], Awaitable[HandlerResult]],
        *,
        definite: tuple[type[BaseException], ...] = (),
    ) -> HandlerResult:
        """Run the effect tool call ``params`` once per key: ``call()`` runs its body.

        The SDK's interceptor and the FastMCP middleware
        (:class:`agentdb.integrations.fastmcp.ExactlyOnceMiddleware`) both come
        here; ``call`` answers what the SDK makes of the body (a ``CallToolResult``,
        or an ``InputRequiredResult``), and ``definite`` adds the server
        framework's own "refused before doing anything" exceptions.
        """
        spec = self._effects[params.name]
        identity = await self._identity(ctx)
        if identity is None:
            return tool_error(
                "TenantMissing",
                f"tool {params.name!r} needs a tenant: the call "
                "carries no identity the server accepts",
                guarantee="G1",
            )
        arguments = dict(params.arguments or {})
        key = _caller_key(params.meta, arguments, spec.key_argument)
        if key is None:
            where = (
                f"argument {spec.key_argument!r}" if spec.key_argument else "_meta.idempotency_key"
            )
            return tool_error(
                "IdempotencyKeyMissing",
                f"tool {params.name!r} performs an effect: "
                f"send the call's idempotency key in {where}",
                guarantee="G4",
            )
        hashed = {k: v for k, v in arguments.items() if k != spec.key_argument}
        with _tool_span(spec.name, key, _traceparent(params.meta)) as span:
            try:
                result = await self._call(spec, identity, key, hashed, params, call, definite, span)
            except AgentDBError as exc:  # refused by the database: a typed error, never a result
                result = _refusal(exc)
            if isinstance(result, CallToolResult) and result.is_error:
                found = (result.meta or {}).get(ERROR_META)
                span.fail(found["type"] if isinstance(found, dict) else "tool_error")
            return result

    async def _call(
        self,
        spec: _Effect,
        identity: Identity,
        key: str,
        arguments: dict[str, Any],
        params: CallToolRequestParams,
        call: Callable[[], Awaitable[HandlerResult]],
        definite: tuple[type[BaseException], ...],
        span: _Span,
    ) -> HandlerResult:
        pool = await self.pool()
        ledger = await self.ledger(pool, identity)
        op_key = _op_key(identity, spec.name, key)
        lock = _mcp_calls.lock_id(identity.tenant, op_key)
        async with _db.connection(pool) as guard:
            # Held while this server runs the call: a retry elsewhere sees it is alive.
            if not await _mcp_calls.try_hold(guard, lock):
                return tool_error(
                    "OperationInFlight",
                    f"call {key!r} of {spec.name!r} is running on another "
                    "server now; ask again later for its result",
                    guarantee="G4",
                )
            try:
                return await self._locked(
                    spec, identity, ledger, op_key, arguments, params, call, definite, span
                )
            finally:
                await _mcp_calls.release(guard, lock)

    async def _locked(
        self,
        spec: _Effect,
        identity: Identity,
        ledger: uuid.UUID,
        op_key: str,
        arguments: dict[str, Any],
        params: CallToolRequestParams,
        call: Callable[[], Awaitable[HandlerResult]],
        definite: tuple[type[BaseException], ...],
        span: _Span,
    ) -> HandlerResult:
        pool = await self.pool()
        reserve = functools.partial(
            operations.reserve,
            tenant_id=identity.tenant,
            task_id=ledger,
            idempotency_key=op_key,
            action=spec.name,
            input=arguments,
            actor=identity.principal[:200],
            trace_id=span.trace_id,
            span_id=span.span_id,
        )
        try:
            if spec.approval:
                approved = await self._approved(
                    spec, identity, ledger, op_key, arguments, params, reserve
                )
                if not isinstance(approved, Reservation):
                    return approved
                res = approved
            else:
                res = await reserve(pool)
        except IdempotencyConflict as exc:
            return _refusal(
                exc,
                f"idempotency key of this call of {spec.name!r} was used with "
                "other arguments: refusing to answer with that call's result",
            )
        except OperationInFlight as exc:
            # This server holds the call's lock: the server that reserved it died mid-call.
            settled = await self._orphan(spec, exc.operation, reserve)
            if not isinstance(settled, Reservation):
                return settled
            res = settled
        if not res.fresh:
            return _replay(res.operation)
        return await self._run(spec, res.operation, call, definite)

    async def _run(
        self,
        spec: _Effect,
        op: Operation,
        call: Callable[[], Awaitable[HandlerResult]],
        definite: tuple[type[BaseException], ...],
    ) -> HandlerResult:
        pool = await self.pool()
        outcome = _Outcome()
        refused = (NotPerformed, ToolError, MCPError, *definite, *spec.definite)
        key_token, outcome_token = _KEY.set(op.idempotency_key), _OUTCOME.set(outcome)
        try:
            result = await call()
        except Exception as exc:
            if outcome.raised is None or isinstance(outcome.raised, refused):
                # Raised before the body ran (the arguments did not validate, a protocol
                # error) or by a body that refused: nothing was performed.
                await operations.fail(pool, op, f"{type(exc).__name__}: {exc}")
                raise
            # Raised through the server framework by a body that may have performed it.
            result = None
        finally:
            _KEY.reset(key_token)
            _OUTCOME.reset(outcome_token)
        raised = outcome.raised
        if raised is not None:
            if isinstance(raised, refused) and result is not None:
                await operations.fail(pool, op, f"{type(raised).__name__}: {raised}")
                return result  # the framework's error result; the next attempt calls again
            # It may have happened: the next attempt reconciles it, never calls blindly.
            await operations.mark_unknown(pool, op, error=f"{type(raised).__name__}: {raised}")
            return tool_error(
                "OperationUnknown",
                f"{spec.name!r} raised {type(raised).__name__} "
                "and may have been performed; its outcome is unknown until it is "
                "reconciled",
                guarantee="G13",
            )
        if isinstance(result, InputRequiredResult):  # asked for input: nothing performed yet
            await operations.fail(pool, op, "the tool asked for input first")
            return result
        doc = _stored(result)
        try:
            done = await operations.complete(pool, op, result=doc)
        except PayloadTooLarge:
            marker = {"$agentdb": "unrecorded", "bytes": len(json.dumps(doc))}
            await operations.complete(pool, op, result=marker)
            return result
        return _replay(done)

    async def _orphan(
        self, spec: _Effect, op: Operation, reserve: Callable[..., Awaitable[Reservation]]
    ) -> CallToolResult | Reservation:
        """Settle a call whose server died between the call and its record (G13)."""
        pool = await self.pool()
        if op.state in ("reserved", "in_flight"):
            op = await operations.mark_unknown(pool, op, error="the server died during the call")
        if spec.reconcile is None:
            return tool_error(
                "OperationUnknown",
                f"an earlier attempt of this call of {spec.name!r} died "
                "before its outcome was recorded: it may have been performed, and it is not "
                "called again until it is reconciled (agentdb.operations.reconcile)",
                guarantee="G13",
                operation=str(op.id),
            )
        learned = await spec.reconcile(op)
        if learned is None:  # the provider never saw it: call it again, with the same key
            await operations.fail(pool, op, "reconciled: the provider has no record of it")
            return await reserve(pool)
        settled = await operations.reconcile(
            pool,
            op,
            succeeded=learned.succeeded,
            provider_reference=learned.provider_reference,
            result=learned.result,
            error=learned.error,
        )
        return (
            Reservation(settled, fresh=False)
            if settled.state == "succeeded"
            else await reserve(pool)
        )

    async def _approved(
        self,
        spec: _Effect,
        identity: Identity,
        ledger: uuid.UUID,
        op_key: str,
        arguments: dict[str, Any],
        params: CallToolRequestParams,
        reserve: Callable[..., Awaitable[Reservation]],
    ) -> CallToolResult | InputRequiredResult | Reservation:
        """Ask for an approval, or consume the one presented with the reservation (G22)."""
        pool = await self.pool()
        digest = input_hash(arguments)
        call = hashlib.sha256(op_key.encode()).hexdigest()[:32]
        answer = (params.input_responses or {}).get(_APPROVAL_INPUT)
        if params.request_state is None or answer is None:
            return self._ask(spec, call, digest, arguments)
        try:
            state = json.loads(params.request_state)
        except ValueError:
            state = None
        if not isinstance(state, dict) or state.get("call") != call or state.get("args") != digest:
            return tool_error(
                "ApprovalRefused", "this approval was given for another call", guarantee="G22"
            )
        if time.time() > float(state.get("until", 0)):
            return tool_error(
                "ApprovalRefused", "this approval is past its deadline", guarantee="G22"
            )
        if (
            not isinstance(answer, ElicitResult)
            or answer.action != "accept"
            or not (answer.content or {}).get("approve")
        ):
            return tool_error(
                "ApprovalRefused", f"the call of {spec.name!r} was not approved", guarantee="G22"
            )
        try:
            async with _db.transaction(pool) as conn:
                # The answer and the reservation it unlocks commit together, or neither does.
                sig = await signals.approve(
                    conn,
                    identity.tenant,
                    ledger,
                    approver=identity.principal[:200],
                    name=f"mcp.approval/{call}",
                    dedupe_key=f"mcp.approval/{state['nonce']}",
                )
                res = await reserve(conn, retry_failed=False)
                if not sig.created or not res.fresh:
                    raise _Used(res.operation)
        except _Used as used:
            if used.operation.state == "succeeded":  # the call it unlocked: its answer
                return Reservation(used.operation, fresh=False)
            return tool_error("ApprovalRefused", "this approval was already used", guarantee="G22")
        return res

    def _ask(
        self, spec: _Effect, call: str, digest: str, arguments: dict[str, Any]
    ) -> InputRequiredResult:
        until = time.time() + self.approval_ttl.total_seconds()
        state = {"call": call, "args": digest, "nonce": secrets.token_hex(16), "until": until}
        form = ElicitRequestFormParams(
            message=f"Approve {spec.name}({json.dumps(arguments, sort_keys=True)})?",
            requested_schema={
                "type": "object",
                "properties": {"approve": {"type": "boolean"}},
                "required": ["approve"],
            },
        )
        return InputRequiredResult(
            input_requests={_APPROVAL_INPUT: ElicitRequest(params=form)},
            request_state=json.dumps(state, sort_keys=True),
        )


class _Used(Exception):
    """An approval presented again: its first use already reserved the call (rolled back)."""

    def __init__(self, operation: Operation) -> None:
        super().__init__(f"approval already used for operation {operation.id}")
        self.operation = operation


def _caller_key(
    meta: Mapping[str, Any] | None, arguments: Mapping[str, Any], key_argument: str | None
) -> str | None:
    value = arguments.get(key_argument) if key_argument else (meta or {}).get("idempotency_key")
    if isinstance(value, str) and 1 <= len(value) <= 255:
        return value
    return None


# --- durable long-running tools: the Tasks extension ----------------------------------

#: What each agentdb state is on the Tasks extension's wire.
_STATUS: Final = {
    "pending": "working",
    "running": "working",
    "waiting": "working",
    "succeeded": "completed",
    "failed": "completed",  # a tool error is a result (isError), not a JSON-RPC failure
    "dead": "completed",
    "cancelled": "cancelled",
}
_TASK_PREFIX: Final = "mcp.tool/"
_RESULT_STEP: Final = "mcp/result"
_REQUEST_STEP: Final = "mcp/request/"
_INPUT_STEP: Final = "mcp/input/"
#: How a recorded result names a JSON-RPC error the tool raised.
_JSONRPC_ERROR: Final = "$agentdb.jsonrpc_error"


class TaskParams(RequestParams):
    """``tasks/get`` and ``tasks/cancel`` params."""

    task_id: str


class UpdateTaskParams(RequestParams):
    """``tasks/update`` params: the answers to a task's input requests, by their keys."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    input_responses: dict[str, Any]


async def ask(
    key: str,
    message: str,
    requested_schema: Mapping[str, Any] | None = None,
    *,
    url: str | None = None,
) -> ElicitResult:
    """Inside a long-running tool: ask the caller for input and wait for the answer (durably).

    A form elicitation (``requested_schema``), or a URL-mode one (``url``: the page
    the user is sent to, for what must not pass through the client - a payment, a
    sign-in). See :func:`ask_input` for what happens then.

    Raises:
        ConfigurationError: not inside a long-running tool run by a worker, or not
            exactly one of ``requested_schema`` and ``url``.
    """
    if (requested_schema is None) == (url is None):
        raise ConfigurationError(
            "ask() takes exactly one of requested_schema (a form) and url (URL mode)"
        )
    params: ElicitRequestFormParams | ElicitRequestURLParams = (
        ElicitRequestURLParams(message=message, url=url)
        if url is not None
        else ElicitRequestFormParams(message=message, requested_schema=dict(requested_schema or {}))
    )
    answer = await ask_input(key, ElicitRequest(params=params))
    assert isinstance(answer, ElicitResult)
    return answer


async def ask_input(key: str, request: InputRequest) -> InputResponse:
    """Inside a long-running tool: send the caller any input request and wait for its answer.

    ``request`` is what the 2026-07-28 protocol embeds as an input request: an
    elicitation (form or URL mode), a sampling request (``CreateMessageRequest``:
    the caller's model answers) or a roots request. It is recorded (``tasks/get``
    shows the task ``input_required`` with it under ``key``), and the task sleeps
    holding no worker until ``tasks/update`` answers it - once: the answer is an
    agentdb signal (G22) taken by this step, a second answer for the key is
    refused, and a cancelled or late task takes none. Keys are the task's: one
    key is one request for the task's whole life (the extension's rule).

    Raises:
        ConfigurationError: not inside a long-running tool run by a worker.
    """
    job = running_job()
    if job is None:
        raise ConfigurationError("ask() is for the body of a @tasks.long_running() tool")
    shown = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    await job.step(f"{_REQUEST_STEP}{key}", lambda: shown)
    answer = await job.wait_for_signal(f"{_INPUT_STEP}{key}", f"mcp.input/{key}")
    response = answer.payload["response"]
    if isinstance(request, CreateMessageRequest):
        return _SAMPLED.validate_python(response, by_name=False)
    if isinstance(request, ListRootsRequest):
        return ListRootsResult.model_validate(response, by_name=False)
    return ElicitResult.model_validate(response, by_name=False)


_SAMPLED: TypeAdapter[CreateMessageResult | CreateMessageResultWithTools] = TypeAdapter(
    CreateMessageResult | CreateMessageResultWithTools
)


class DurableTasks(Extension):
    """Long-running tools as agentdb tasks, served through the Tasks extension (SEP-2663).

    SDK 2.3.0 does not carry the Tasks extension: ``mcp_types`` has only the
    2025-11-25 task types (never dispatched), and nothing answers ``tasks/get``,
    ``tasks/update`` or ``tasks/cancel``. It carries the seams the extension
    needs, and this class fills them with agentdb: an ``Extension`` whose
    ``tools/call`` interceptor answers a long-running tool's call with a
    ``CreateTaskResult`` (``resultType: "task"``) once the task row has
    committed, and whose methods answer the three task requests from the
    database - so any server instance answers them, with no session:

    * ``tasks/get`` is a read: working / input_required (with the recorded input
      requests) / completed (with the recorded ``CallToolResult``) / failed /
      cancelled, from the task's state and its steps;
    * ``tasks/cancel`` is :func:`agentdb.tasks.cancel` (G20): authoritative,
      the worker running it is stopped within about a second;
    * ``tasks/update`` sends each answer as a signal (G22) with the input's key
      as dedupe key: answered once, refused for a finished or late task.

    A task id is the task's UUID (a v7: 74 random bits), and every lookup is scoped to the
    caller's tenant and principal: another tenant's id is "not found". A worker
    runs the tool (:meth:`handlers`, in the server process or in ``agentdb
    worker``), so a server that dies leaves the task to the next worker once its
    lease expires.

    What the extension says, and how it is met:

    * Only a client that declared the extension on its request gets a task; one
      that did not is answered ``-32021`` (missing required client capability),
      as are its ``tasks/*`` requests.
    * A tool's own error is a result: the task is ``completed`` with an
      ``isError`` result - for a ``ToolError`` at once, for any other exception
      once the task's retries are spent (``statusMessage`` says why). ``failed``
      is kept for a JSON-RPC error the tool raised (``MCPError``), with it.
    * ``ttlMs`` is ``ttl``: how long a task is kept after it was created. agentdb
      keeps it until ``agentdb purge`` deletes it, so set ``ttl`` to your purge
      retention (``None``, unlimited, only if you never purge tasks).
    * Input requests (:func:`ask`, :func:`ask_input`): form and URL-mode
      elicitations, sampling and roots requests, each under a key used once.

    Not built: ``notifications/tasks``. The extension lets a server push them on
    a ``subscriptions/listen`` stream (a MAY); SDK 2.3.0's listen handler knows
    only list-changed and resource events, with no task-id filter, so clients
    poll ``tasks/get`` (``pollIntervalMs`` says how often).
    """

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        kit: ExactlyOnce,
        *,
        lease_ttl: timedelta = timedelta(seconds=30),
        poll_interval_ms: int = 500,
        ttl: timedelta | None = None,
        max_attempts: int = tasks.DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.kit = kit
        self.max_attempts = max_attempts
        self.lease_ttl = lease_ttl
        self.poll_interval_ms = poll_interval_ms
        self.ttl = ttl
        self._tools: set[str] = set()

    def long_running(self, name: str | None = None) -> Callable[[_F], _F]:
        """Declare a tool long-running: a call answers with a task, a worker runs the body."""

        def register(fn: _F) -> _F:
            self._tools.add(name or fn.__name__)
            return fn

        return register

    def handlers(
        self, server: MCPServer[Any]
    ) -> dict[str, Callable[[Job], Coroutine[Any, Any, Succeed]]]:
        """The task handlers a worker runs the long-running tools of ``server`` with."""

        def handler(tool: str) -> Callable[[Job], Coroutine[Any, Any, Succeed]]:
            async def run(job: Job) -> Succeed:
                async def call() -> dict[str, Any]:
                    try:
                        return _stored(await server.call_tool(tool, job.task.params["arguments"]))
                    except MCPError as exc:  # a JSON-RPC error: the task is `failed` with it
                        return {_JSONRPC_ERROR: exc.error.model_dump(by_alias=True, mode="json")}
                    except UnexpectedToolError as exc:
                        # A crash: retried as the task's policy says, then an error result.
                        # The task's last_error names the cause, for its operators.
                        cause = exc.__cause__
                        raise (cause if isinstance(cause, Exception) else exc) from None
                    except ToolError as exc:  # the tool refused: an error result, as the SDK says
                        text = TextContent(type="text", text=str(exc))
                        return _stored(CallToolResult(content=[text], is_error=True))

                await job.step(_RESULT_STEP, call)
                return Succeed()

            return run

        return {f"{_TASK_PREFIX}{tool}": handler(tool) for tool in sorted(self._tools)}

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/update", UpdateTaskParams, self._update),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
        )

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        if params.name not in self._tools:
            return await call_next(ctx)
        require_client_extension(ctx, TASKS_EXTENSION)  # only such a client may get a task
        identity = await self.kit._identity(ctx)
        if identity is None:
            return tool_error(
                "TenantMissing", f"tool {params.name!r} needs a tenant", guarantee="G1"
            )
        arguments = dict(params.arguments or {})
        key = _caller_key(params.meta, arguments, None)
        pool = await self.kit.pool()
        with _tool_span(params.name, key or "", _traceparent(params.meta)) as span:
            try:
                task = await tasks.create(
                    pool,
                    identity.tenant,
                    f"{_TASK_PREFIX}{params.name}",
                    params={
                        "tool": params.name,
                        "arguments": arguments,
                        "principal": identity.principal,
                    },
                    dedupe_key=None if key is None else _op_key(identity, params.name, key),
                    lease_ttl=self.lease_ttl,
                    max_attempts=self.max_attempts,
                    actor=identity.principal[:200],
                    trace_id=span.trace_id,
                    span_id=span.span_id,
                )
            except AgentDBError as exc:
                span.fail(type(exc).__name__)
                return _refusal(exc)
        # The row has committed: only now is the task announced (the extension's MUST).
        return {"resultType": "task", **self._shape(task)}

    def _shape(self, task: Task) -> dict[str, Any]:
        return {
            "taskId": str(task.id),
            "status": _STATUS[task.state],
            "createdAt": task.created_at.astimezone(UTC).isoformat(),
            "lastUpdatedAt": task.updated_at.astimezone(UTC).isoformat(),
            "ttlMs": None if self.ttl is None else int(self.ttl.total_seconds() * 1000),
            "pollIntervalMs": self.poll_interval_ms,
        }

    async def _task(
        self, ctx: ServerRequestContext[Any, Any], task_id: str
    ) -> tuple[Identity, Task]:
        """The caller's task ``task_id``; anyone else's, or none, is the same "not found"."""
        require_client_extension(ctx, TASKS_EXTENSION)
        identity = await self.kit._identity(ctx)
        missing = MCPError(code=INVALID_PARAMS, message="task not found", data={"taskId": task_id})
        if identity is None:
            raise missing
        try:
            task = await tasks.get(await self.kit.pool(), identity.tenant, uuid.UUID(task_id))
        except (ValueError, NotFound):
            raise missing from None
        if (
            not task.task_type.startswith(_TASK_PREFIX)
            or task.params.get("principal") != identity.principal
        ):
            raise missing
        return identity, task

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        identity, task = await self._task(ctx, params.task_id)
        shaped = {"resultType": "complete", **self._shape(task)}
        if task.state in ("succeeded", "waiting"):
            led = await steps.ledger(await self.kit.pool(), identity.tenant, task.id)
            done = led.steps.get(_RESULT_STEP)
            if task.state == "succeeded" and done is not None:
                if isinstance(done.result, dict) and _JSONRPC_ERROR in done.result:
                    error = done.result[_JSONRPC_ERROR]
                    shaped.update(status="failed", error=error, statusMessage=error.get("message"))
                else:
                    shaped["result"] = done.result
            asked = {
                name.removeprefix(_REQUEST_STEP): step.result
                for name, step in led.steps.items()
                if name.startswith(_REQUEST_STEP)
                and getattr(
                    led.steps.get(_INPUT_STEP + name.removeprefix(_REQUEST_STEP)), "state", None
                )
                != "done"
            }
            if task.state == "waiting" and asked:
                shaped.update(status="input_required", inputRequests=asked)
        if task.state in ("failed", "dead"):
            # The tool raised until its retries were spent: a tool error, so a result.
            # What it raised stays with the operators (the task's last_error), as the
            # SDK keeps a crash's details from the caller.
            said = f"Error executing tool {task.params['tool']}"
            text = TextContent(type="text", text=said)
            shaped.update(result=_stored(CallToolResult(content=[text], is_error=True)))
            shaped["statusMessage"] = f"the tool failed on each of its {task.attempts} attempts"
        return shaped

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> dict[str, Any]:
        identity, task = await self._task(ctx, params.task_id)
        pool = await self.kit.pool()
        for key, response in sorted(params.input_responses.items()):
            try:
                await signals.signal(
                    pool,
                    identity.tenant,
                    task.id,
                    f"mcp.input/{key}",
                    {"response": response},
                    dedupe_key=f"mcp.input/{key}",
                    sender=identity.principal[:200],
                )
            except IdempotencyConflict:
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=f"input {key!r} was already answered",
                    data={"type": "IdempotencyConflict", "guarantee": "G22"},
                ) from None
            except AgentDBError as exc:  # finished (cancelled), past its deadline
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=f"task takes no input: {exc}",
                    data={"type": type(exc).__name__, "guarantee": getattr(exc, "guarantee", None)},
                ) from None
        return {"resultType": "complete"}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> dict[str, Any]:
        identity, task = await self._task(ctx, params.task_id)
        if task.state in tasks.FINISHED_STATES:
            raise MCPError(code=INVALID_PARAMS, message=f"task is already {_STATUS[task.state]}")
        await tasks.cancel(
            await self.kit.pool(),
            identity.tenant,
            task.id,
            reason="tasks/cancel",
            actor=identity.principal[:200],
        )
        return {"resultType": "complete"}
