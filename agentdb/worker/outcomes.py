"""What a handler returns, what the worker then writes, and what it does with anything else.

A handler is an async callable: ``async def handle(job) -> Outcome | None``.
:func:`check_handlers` refuses anything else when the worker starts
(:class:`~agentdb.errors.ConfigurationError` naming the task type), because a
plain ``def`` would run on the event loop, block every other job and its
heartbeat, and hand back a value where an awaitable belongs.

How each way an attempt can end is recorded - one rule per case, and why:

* returns ``None`` or :class:`Succeed` -> 'succeeded' (event ``task.succeeded``).
* returns :class:`Retry`, :class:`Wait` or :class:`Fail` -> what that outcome says.
* raises -> :class:`Retry` with ``"<ExceptionType>: <message>"`` (traceback
  logged once); an :class:`~agentdb.errors.IdempotencyConflict` -> :class:`Fail`
  (another attempt would only conflict again).
* returns anything else (``42``, ``"done"``, a dict) -> :class:`Fail` naming the
  type returned (:func:`outcome_of`). Not Retry: the handler ran to the end, so
  whatever it did is done; running it again repeats every effect it did not
  reserve and returns the same wrong type, until the attempts run out.
* returns a non-awaitable from its call (a plain ``def`` that got past
  :func:`check_handlers`, e.g. behind a decorator) -> :class:`Fail`, for the
  same reason: it already ran, synchronously.
* is cancelled by something other than the worker (it raised CancelledError
  itself) -> :class:`Retry`: nothing says the work is done or wrong.
* is cancelled because its lease was lost, or raises
  :class:`~agentdb.errors.LeaseLost` -> nothing is written (G12): the task is
  someone else's now.
* raises :class:`~agentdb.errors.PoolerMismatch` -> the worker stops (see
  :mod:`~agentdb.worker.loop`).

What happens when the database refuses the outcome, or the finishing write is
lost with its connection, is in :mod:`~agentdb.worker.finish`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from agentdb._runtime import is_async_callable
from agentdb.errors import ConfigurationError
from agentdb.models import Message, Operation

if TYPE_CHECKING:
    from agentdb.worker.job import Job

__all__ = [
    "MANUAL",
    "Fail",
    "Handler",
    "Outcome",
    "Parked",
    "ReconcileHook",
    "Reconciled",
    "Reconciler",
    "Retry",
    "Succeed",
    "Wait",
    "check_handlers",
    "is_async_callable",
    "outcome_of",
]


@dataclass(frozen=True, slots=True)
class Succeed:
    """Finish the task: it lands in 'succeeded' with event ``task.succeeded``, its
    ``payload`` (redacted) and its ``outbox`` messages in the same statement."""

    payload: Mapping[str, Any] | None = None
    outbox: tuple[Message, ...] = ()


@dataclass(frozen=True, slots=True)
class Retry:
    """Give the task back: it lands in 'pending', due after ``after`` (default: exponential
    backoff), with event ``task.retry`` - or in 'dead' if this was its last attempt."""

    error: str
    after: timedelta | None = None
    #: Give the attempt back (a rate limit refused it before anything ran, G19).
    refund_attempt: bool = False


@dataclass(frozen=True, slots=True)
class Parked(Retry):
    """Given back to wait for an operator (an effect declared ``MANUAL`` whose outcome is
    unknown, G13): due again after ``after``, its attempt refunded (the parked run did
    nothing), event ``task.parked`` - until the operation is settled."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep: the task lands in 'waiting' until ``until``; or until signal ``signal`` arrives
    (G22); or until its children have finished (G23: ``children=True`` all it has, an int
    that many) - ``until`` is then a timeout. Event ``task.waiting`` (``step`` recorded when
    given); the next claim after that resumes it. The signals the handler read
    (``job.signals()``) count as read from then on.

    Raises:
        ConfigurationError: none of ``until``, ``signal``, ``children`` is given, or both
            ``signal`` and ``children`` are.
    """

    until: datetime | None = None
    step: str | None = None
    signal: str | None = None
    children: bool | int = False

    def __post_init__(self) -> None:
        if self.signal is not None and self.children is not False:
            raise ConfigurationError("Wait waits for a signal or for children, not both")
        if self.until is None and self.signal is None and self.children is False:
            raise ConfigurationError(
                "Wait needs until= (a time), signal= (a signal name) or children= (all: True)"
            )


@dataclass(frozen=True, slots=True)
class Fail:
    """Finish the task for good: it lands in 'failed' with event ``task.failed``; no more
    attempts."""

    error: str


Outcome = Succeed | Retry | Wait | Fail
Handler = Callable[["Job"], Coroutine[Any, Any, Outcome | None]]


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What a reconcile hook learned from the provider about an unsettled operation."""

    succeeded: bool
    provider_reference: str
    result: Any = None
    error: str | None = None


#: ``async def hook(op) -> Reconciled | None``; ``None`` means "the provider
#: has no record of it": the effect did not happen and may be attempted again.
ReconcileHook = Callable[[Operation], Awaitable[Reconciled | None]]

#: In place of a reconcile hook (``reconcilers={"wire": MANUAL}``, or an effect's
#: ``reconcile=MANUAL``): an unknown outcome of the action waits for an operator, who
#: settles it with :func:`agentdb.operations.reconcile`; the task is parked until then.
#: Without a hook and without MANUAL, the next attempt calls the provider again with the
#: same idempotency key - the repeat the provider's key makes safe (G13).
MANUAL: Final = "manual"
#: A reconcile hook, or :data:`MANUAL`.
Reconciler = ReconcileHook | Literal["manual"]


_OUTCOMES = (Succeed, Retry, Wait, Fail)
# Wrappers of wrappers are rare; a chain this long is a cycle.


def outcome_of(value: object) -> Outcome:
    """The outcome a handler's return value stands for: ``None`` is :class:`Succeed`, an
    outcome is itself, anything else is :class:`Fail` saying what type came back."""
    if value is None:
        return Succeed()
    if isinstance(value, _OUTCOMES):
        return value
    # The type, not the value: a repr could carry what the handler fetched.
    return Fail(
        f"handler returned {type(value).__name__}, not None or an outcome "
        "(Succeed, Retry, Wait, Fail)"
    )


def check_handlers(
    handlers: Mapping[str, object], reconcilers: Mapping[str, object] | None = None
) -> None:
    """Refuse handlers and reconcile hooks that are not async callables.

    Raises:
        ConfigurationError: naming the first task type (or action) whose handler
            (or hook) is not an async callable, or that is not a non-empty string.
    """
    for kind, table, key in (
        ("handler", handlers, "task type"),
        ("reconcile hook", reconcilers or {}, "action"),
    ):
        for name, fn in table.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"{kind} {key} {name!r} must be a non-empty string")
            if kind == "reconcile hook" and fn == MANUAL:
                continue
            if not is_async_callable(fn):
                got = f"{type(fn).__name__} {getattr(fn, '__qualname__', '')}".strip()
                raise ConfigurationError(
                    f"{kind} for {key} {name!r} is not an async callable (got {got}): "
                    "it must be an async def, or an object whose __call__ is one"
                    + (", or MANUAL" if kind == "reconcile hook" else "")
                )
