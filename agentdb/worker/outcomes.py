"""What a handler returns, and what the worker then writes (one statement each).

Returning ``None`` is :class:`Succeed`. Raising is :class:`Retry` with the
exception as the error (an :class:`~agentdb.errors.IdempotencyConflict` is
:class:`Fail`: another attempt would only conflict again).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agentdb.models import Message, Operation

if TYPE_CHECKING:
    from agentdb.worker.job import Job

__all__ = [
    "Fail",
    "Handler",
    "Outcome",
    "ReconcileHook",
    "Reconciled",
    "Retry",
    "Succeed",
    "Wait",
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


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep: the task lands in 'waiting' until ``until`` with event ``task.waiting``
    (``step`` recorded when given); the next claim after that resumes it."""

    until: datetime
    step: str | None = None


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
    result: Mapping[str, Any] | None = None
    error: str | None = None


#: ``async def hook(op) -> Reconciled | None``; ``None`` means "the provider
#: has no record of it": the effect did not happen and may be attempted again.
ReconcileHook = Callable[[Operation], Awaitable[Reconciled | None]]
