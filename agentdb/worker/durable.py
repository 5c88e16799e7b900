"""Straight-line handlers: named steps, effects and waits, each recorded on the ledger (G25).

A handler is re-entered from the top after every wait and every crash. With
these methods of :class:`~agentdb.worker.Job` it is still written as
straight-line code, because each named call answers from what an earlier run
recorded instead of doing the work again::

    async def refund(job: Job) -> Succeed:
        order = await job.step("lookup", shop.get_order, job.task.params["order"])
        review = await job.wait_for_signal("review", "approval")
        if review.decision != "approved":
            return Fail("refused by " + review.sender)
        done = await job.effect("refund", psp.refund, order["charge"], order["total"])
        await job.sleep("cool-off", timedelta(hours=1))
        await job.effect("email", mail.send, order["email"], "refunded")
        return Succeed(payload={"refund": done["id"]})

The rules, one per method:

* :meth:`Durable.step` runs ``fn`` once and records its JSON result under the
  task and the step's name; a re-entry that reaches the name returns the
  recorded result without calling ``fn``. A step is for work that may safely
  run again if a crash lands mid-call (a model request, a read, a
  computation): a run that dies before the record is written runs it again.
* :meth:`Durable.effect` is a step for a side effect: the operation is
  reserved and committed before ``fn`` is called (G13), ``fn`` gets the
  operation's idempotency key (``idempotency_key=``) to hand to the
  provider, and its result is recorded with the operation. How each ending
  is recorded - ``fn`` returned: succeeded; ``fn`` raised
  :class:`NotPerformed` (or a class named ``definite=`` on the call or the
  worker): failed, and the next attempt calls the provider again; anything
  else (a timeout, a crash, an exception nobody declared): unknown - the next
  attempt asks the ``reconcile`` hook if there is one, parks the task for an
  operator if the effect is declared ``reconcile=MANUAL``, and otherwise
  calls the provider again **with the same key**, a repeat the provider's
  key makes safe (the ledger shows it: ``operation.unknown`` then
  ``operation.started``). Exactly once across a crash rests on one of those
  two: a provider that honours the key, or a hook that asks it what
  happened. An effect on a provider that honours no key is declared
  ``MANUAL`` or given a hook.
* :meth:`Durable.wait_for_signal` returns the first signal of a name that no
  other step of the task took, and records which one it took: a re-entry
  returns the same signal whatever arrived since, and each signal is taken
  by one step at most (``agent_steps_signal_key``). None there yet: the
  task sleeps until one commits (``Wait(signal=...)``), holding no worker.
* :meth:`Durable.sleep` sleeps once: the end is fixed by the database's
  clock when the step is first reached.
* :meth:`Durable.run_children` spawns the children once (keys
  ``<name>/<i>``) and returns their results once all of them (or a quorum)
  finished, recorded so a re-entry sees the same results.

Steps are keyed by name (plus the canonical hash of their arguments, G4),
never by position: an ``if`` that skips a step on one run cannot shift the
others, and a name reached with other arguments than it was recorded with is
a :class:`~agentdb.errors.StepConflict` naming both, never a replay of the
other call's result. Name the iterations of a loop (``f"search/{i}"``).

Re-entering reads everything recorded in one statement
(:func:`agentdb.steps.ledger`), on the first named call of the attempt.
A result is JSON: it is returned as the database stores it (a tuple comes
back a list - on the first run too, so every run sees the same value), at
most 64 KiB, with its secrets masked (G9). A cancel or a passed deadline stops
the handler at its next step at the latest: every record is written under
the task's lease, which the cancel took (G20, G21); the worker's lease watch
stops it within about a second while it waits inside a long step.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, overload

from agentdb import _faults, children, redaction, steps
from agentdb._db.jsonb import OBJECT_CAP
from agentdb._db.jsonb import value as json_value
from agentdb._runtime import describe
from agentdb.budgets import Cost
from agentdb.errors import ConfigurationError, IdempotencyConflict, StepConflict
from agentdb.hashing import input_hash
from agentdb.models import Operation, Reservation, Signal
from agentdb.tasks import FINISHED_STATES
from agentdb.worker.outcomes import ReconcileHook, Wait

if TYPE_CHECKING:
    from agentdb import _db
    from agentdb.models import Lease, Task

__all__ = [
    "ChildResult",
    "Durable",
    "NotPerformed",
    "Performed",
    "Suspended",
    "running_job",
]

#: The job whose handler is running in this context (set by the worker around each
#: call): how code the handler calls but does not pass the job to - an agent
#: framework's model and tool calls - finds the ledger to record on.
RUNNING: Final[contextvars.ContextVar[Durable | None]] = contextvars.ContextVar(
    "running_job", default=None
)


def running_job() -> Durable | None:
    """The job whose handler runs in this context, or ``None`` outside a handler."""
    return RUNNING.get()


#: The longest step name (agent_steps_name_valid); a fan-out's child keys add "/<i>".
NAME_MAX: Final = 200
_CHILD_KEY_MAX: Final = 200


class Suspended(BaseException):
    """A durable wait suspends the handler: the worker writes ``wait`` and the task sleeps.

    A ``BaseException``, so a handler's ``except Exception`` does not swallow it; a
    handler never needs to catch it.
    """

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"suspended: {wait}")
        self.wait = wait


class NotPerformed(Exception):
    """Raised by an effect's function: the provider definitely did not perform it (it refused
    the request before doing anything - a 4xx, a 503 with nothing done). The operation is
    recorded failed and the next attempt calls the provider again."""


@dataclass(frozen=True, slots=True)
class Performed:
    """What an effect's function may return instead of its bare value: the value, the
    provider's reference for the effect, and what it cost (G19: settled against what was
    held with ``cost=``)."""

    value: Any
    reference: str | None = None
    cost: Cost | None = None


@dataclass(frozen=True, slots=True)
class ChildResult:
    """One child of :meth:`Durable.run_children`, as it stood when the fan-out completed."""

    key: str
    task_id: uuid.UUID
    task_type: str
    state: str
    #: the payload of its finishing event (``Succeed(payload=...)``); None if it has none.
    result: dict[str, Any] | None
    error: str | None

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"


#: How an effect whose outcome is unknown is settled: a hook that asks the provider,
#: MANUAL (an operator), or None (the worker's hook for the action, else the provider is
#: called again with the same key).
Reconcile = ReconcileHook | Literal["manual"] | None


def _name(name: object, what: str = "step") -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX:
        raise ConfigurationError(
            f"a {what} name is a string of 1 to {NAME_MAX} characters, not {name!r}"
        )
    return name


def _hash(name: str, value: object) -> str:
    try:
        return input_hash(value)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"the arguments of step {name!r} are hashed to bind them to its name, and {exc}; "
            "pass JSON data (bind anything else with functools.partial or a closure)"
        ) from exc


def _stored(name: str, value: Any) -> str | None:
    """``value`` as it is recorded: JSON text, its secrets masked (G9). What a run returns is
    what the database gives back for it, so the first run sees what every replay will.

    Raises:
        ConfigurationError: not JSON data. PayloadTooLarge: over 64 KiB.
    """
    return json_value(redaction.mask(value), cap=OBJECT_CAP, what=f"the result of step {name!r}")


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class Durable:
    """The straight-line API of :class:`~agentdb.worker.Job` (this module's docstring)."""

    pool: _db.Pool
    task: Task
    lease: Lease
    signals_read: int | None
    _ledger: steps.Ledger | None
    _definite: tuple[type[BaseException], ...]

    # Provided by Job.
    async def spawn(
        self, task_type: str, key: str, params: Mapping[str, Any] | None = None, **create: Any
    ) -> Task:
        raise NotImplementedError

    async def _reserve_effect(
        self, key: str, action: str, input: Any, cost: Cost | None, policy: Reconcile
    ) -> Reservation:
        raise NotImplementedError

    async def complete(
        self,
        op: Operation,
        *,
        result: Any = None,
        provider_reference: str | None = None,
        cost: Cost | None = None,
    ) -> Operation:
        raise NotImplementedError

    async def fail(
        self, op: Operation, error: str, *, provider_reference: str | None = None
    ) -> Operation:
        raise NotImplementedError

    async def mark_unknown(self, op: Operation, error: str | None = None) -> Operation:
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------

    async def ledger(self) -> steps.Ledger:
        """What this task's earlier runs recorded (read once per attempt, then kept current)."""
        if self._ledger is None:
            self._ledger = await steps.ledger(self.pool, self.task.tenant_id, self.task.id)
        return self._ledger

    def _recorded(self, led: steps.Ledger, name: str, kind: str, digest: str) -> steps.Step | None:
        found = led.steps.get(name)
        if found is None:
            return None
        if found.kind != kind or found.input_hash != digest:
            what = (
                f"as a {found.kind}, not a {kind}"
                if found.kind != kind
                else "for other arguments than this call's"
            )
            raise StepConflict(
                f"step {name!r} of task {self.task.id} was recorded {what} (hash "
                f"{found.input_hash[:12]}..., this call's {digest[:12]}...): a recorded step "
                "is never answered for a different call - name it anew",
                tenant_id=self.task.tenant_id,
                step=name,
                stored_hash=found.input_hash,
                given_hash=digest,
            )
        return found

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this task and return its JSON result; a re-entry
        returns the recorded result without calling it (G25).

        ``fn`` may be a plain or an async function. Its arguments are hashed with the
        name: a later run that reaches ``name`` with other arguments raises. A crash
        between the call and its record runs ``fn`` again on the next attempt: a step
        is for work that may (a model request, a read); a side effect is an
        :meth:`effect`.

        Raises:
            StepConflict: ``name`` was recorded for other arguments, or as another kind.
            ConfigurationError: a bad name, arguments or a result that are not JSON data.
            PayloadTooLarge: the result is over 64 KiB.
            LeaseLost, Cancelled, PastDeadline: the lease went; nothing was recorded.
            whatever ``fn`` raises (nothing is recorded; the worker retries the task).
        """
        _name(name)
        digest = _hash(name, {"args": list(args), "kwargs": kwargs})
        led = await self.ledger()
        found = self._recorded(led, name, "step", digest)
        if found is not None:
            return found.result
        value = await _faults.inside("during_step", _call(fn, *args, **kwargs))
        step = await steps.record(
            self.pool, self.task.tenant_id, self.task.id, name, kind="step",
            input_hash=digest, result=_stored(name, value), lease=self.lease,
        )  # fmt: skip
        led.steps[name] = step
        # An earlier write of this name whose answer was lost is what came back: the
        # same call's (returned as recorded), or another's (a conflict).
        self._recorded(led, name, "step", digest)
        return step.result

    def effect_key(self, name: str) -> str:
        """The idempotency key :meth:`effect` uses for ``name`` when given none: the task's id
        and the name, so each task's effect is its own."""
        return f"{self.task.id}/{_name(name, 'effect')}"

    async def effect(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        key: str | None = None,
        action: str | None = None,
        reconcile: Reconcile = None,
        definite: tuple[type[BaseException], ...] = (),
        cost: Cost | None = None,
        **kwargs: Any,
    ) -> Any:
        """Perform a side effect once: reserve it (committed) before calling
        ``fn(*args, idempotency_key=<key>, **kwargs)``, record what it returned; a re-entry
        returns the recorded result without calling the provider (G13, G25).

        ``key`` is the operation's idempotency key (default :meth:`effect_key`: one per task
        and name; give your own to share an effect between tasks). ``action`` names it for
        reconcile hooks, rate limits and budgets (default: the name up to its first ``/``).
        ``cost`` holds an estimate on the tenant's budgets (G19), settled with what
        ``fn`` reports in :class:`Performed`, else the whole estimate. ``fn`` may return a
        :class:`Performed` to give the provider's reference and the actual cost. How each
        ending of ``fn`` is recorded, and what the next attempt does about it, is this
        module's docstring: returned -> succeeded; :class:`NotPerformed` or ``definite`` ->
        failed, called again; anything else -> unknown: ``reconcile`` (a hook, or
        ``MANUAL`` for an operator), else called again with the same key.

        Raises:
            StepConflict: the key was used for other arguments or another action.
            OperationUnsettled: a ``MANUAL`` effect's outcome is unknown: the worker parks
                the task until an operator settles it (``operations.reconcile``).
            OperationInFlight: another task holds ``key`` unsettled.
            BudgetExceeded, RateLimited: as :meth:`Job.reserve`.
            whatever ``fn`` raises, after recording it failed or unknown.
        """
        op_key = key if key is not None else self.effect_key(name)
        act = action if action is not None else name.split("/", 1)[0]
        request = {"args": list(args), "kwargs": kwargs}
        digest = _hash(name, request)
        led = await self.ledger()
        found = led.effects.get(op_key)
        if found is not None and found.state == "succeeded":
            if found.input_hash != digest or found.action != act:
                raise self._conflict(name, found.input_hash, digest)
            return _replayed(name, found.result)
        try:
            res = await self._reserve_effect(op_key, act, request, cost, reconcile)
        except StepConflict:
            raise
        except IdempotencyConflict as exc:
            raise self._conflict(name, exc.stored_hash, exc.given_hash) from exc
        op = res.operation
        if not res.fresh:  # done by an earlier attempt, another task, or reconciled just now
            led.effects[op_key] = steps.Effect(op.idempotency_key, op.action, op.state,
                                               op.input_hash, op.result)  # fmt: skip
            return _replayed(name, op.result)
        not_done: tuple[type[BaseException], ...] = (NotPerformed, *self._definite, *definite)
        try:
            value = await _faults.inside(
                "during_effect", _call(fn, *args, idempotency_key=op_key, **kwargs)
            )
        except not_done as exc:
            await self.fail(op, describe(exc))
            raise
        except Exception as exc:
            # May have happened: unknown, for the next attempt to settle (see above).
            await self.mark_unknown(op, describe(exc))
            raise
        done = value if isinstance(value, Performed) else Performed(value)
        try:
            text = _stored(name, done.value)
        except ConfigurationError:
            # It happened, and what it returned cannot be recorded: recorded as done (with
            # a marker a replay refuses the same way), never as unknown - which would
            # call the provider again and again for a value it can never keep.
            unrecorded = {"$agentdb": "unrecorded", "type": type(done.value).__name__}
            await self.complete(op, result=unrecorded, provider_reference=done.reference)
            raise
        completed = await self.complete(
            op, result=None if text is None else json.loads(text),
            provider_reference=done.reference, cost=done.cost,
        )  # fmt: skip
        led.effects[op_key] = steps.Effect(
            completed.idempotency_key, completed.action, completed.state, completed.input_hash,
            completed.result,
        )  # fmt: skip
        return completed.result

    def _conflict(self, name: str, stored: str, given: str) -> StepConflict:
        return StepConflict(
            f"effect {name!r} of task {self.task.id} was recorded for other arguments or another "
            f"action (hash {stored[:12]}..., this call's {given[:12]}...): its result is never "
            "handed to a different call - name it anew",
            tenant_id=self.task.tenant_id,
            step=name,
            stored_hash=stored,
            given_hash=given,
        )

    @overload
    async def wait_for_signal(self, name: str, signal: str = ..., /) -> Signal: ...

    @overload
    async def wait_for_signal(
        self,
        name: str,
        signal: str = ...,
        /,
        *,
        timeout: timedelta,  # noqa: ASYNC109 - a durable wait's timeout, not this call's
    ) -> Signal | None: ...

    async def wait_for_signal(
        self,
        name: str,
        signal: str = "approval",
        /,
        *,
        timeout: timedelta | None = None,  # noqa: ASYNC109 - a durable wait's, not this call's
    ) -> Signal | None:
        """The first signal named ``signal`` no other step of this task took (an approval, with
        its ``decision``, ``sender`` and ``payload["comment"]``), taken by step ``name`` once
        (G22, G25): a re-entry returns the same one, whatever arrived since.

        None has arrived: the task sleeps - holding no worker - until one commits (or until
        ``timeout`` after the step was first reached: then None is returned, and recorded,
        even if the signal comes later).

        Raises:
            StepConflict: ``name`` was recorded for another signal or timeout, or another kind.
            Suspended: (not for the handler to catch) the task sleeps.
        """
        _name(name)
        seconds = None if timeout is None else timeout.total_seconds()
        if seconds is not None and not seconds >= 0:
            raise ConfigurationError(f"a timeout is 0 seconds or more, not {timeout}")
        digest = _hash(name, {"signal": signal, "timeout": seconds})
        led = await self.ledger()
        found = self._recorded(led, name, "signal", digest)
        if found is not None and found.state == "done":
            return found.signal
        tenant, task = self.task.tenant_id, self.task.id
        taken = await steps.take_signal(
            self.pool, tenant, task, name, signal, input_hash=digest, lease=self.lease
        )
        if taken.step is not None:
            led.steps[name] = taken.step
            return taken.step.signal
        if found is None:
            found = await steps.record(
                self.pool, tenant, task, name, kind="signal", input_hash=digest, result=None,
                lease=self.lease, waiting=True, wait=timeout,
            )  # fmt: skip
            led.steps[name] = found
        if found.wake_at is not None and found.due:
            led.steps[name] = await steps.finish(
                self.pool, tenant, task, name, result='{"timed_out": true}', lease=self.lease
            )
            return None
        # Every signal of this name up to the last one is taken: the wait sleeps past them.
        self.signals_read = max(self.signals_read or 0, taken.last_seq) or None
        raise Suspended(Wait(until=found.wake_at, step=name, signal=signal))

    async def sleep(self, name: str, duration: timedelta, /) -> None:
        """Sleep ``duration`` once: the end is fixed (by the database's clock) when step
        ``name`` is first reached; the task sleeps until then holding no worker, and a
        re-entry after it returns at once.

        Raises:
            StepConflict: ``name`` was recorded for another duration, or another kind.
            Suspended: (not for the handler to catch) the task sleeps.
        """
        _name(name)
        if not isinstance(duration, timedelta) or duration < timedelta(0):
            raise ConfigurationError(f"a sleep lasts a timedelta of 0 or more, not {duration!r}")
        digest = _hash(name, {"sleep": duration.total_seconds()})
        led = await self.ledger()
        found = self._recorded(led, name, "sleep", digest)
        if found is None:
            found = await steps.record(
                self.pool, self.task.tenant_id, self.task.id, name, kind="sleep",
                input_hash=digest, result=None, lease=self.lease, waiting=True, wait=duration,
            )  # fmt: skip
            led.steps[name] = found
        # Its row records when it ends; once that has passed the sleep is over - no write
        # says so (a step of a handler that sleeps often costs one row, not two writes).
        if found.due or found.state == "done":
            return
        raise Suspended(Wait(until=found.wake_at, step=name))

    async def run_children(
        self,
        name: str,
        specs: Sequence[tuple[str, Mapping[str, Any] | None]],
        /,
        *,
        quorum: int | None = None,
        **create: Any,
    ) -> list[ChildResult]:
        """Spawn one child per ``(task_type, params)`` once (keys ``<name>/<i>``, G23), sleep
        until all of them - or ``quorum`` of them - finished, and return each child's result
        as it stood then, recorded: a re-entry returns the same list. A child that failed,
        died or was cancelled is in the list too (:attr:`ChildResult.succeeded` is false).
        ``create``: :func:`agentdb.tasks.create`'s options for every child.

        Raises:
            ConfigurationError: no children, a quorum out of 1..their number, a name too
                long for their keys.
            StepConflict: ``name`` was recorded for other children or another quorum.
            PayloadTooLarge: the children's results are over 64 KiB together.
            Suspended: (not for the handler to catch) the task sleeps.
        """
        _name(name)
        wanted = [(str(t), dict(p or {})) for t, p in specs]
        need = len(wanted) if quorum is None else quorum
        if not wanted or not 1 <= need <= len(wanted):
            raise ConfigurationError(
                f"run_children {name!r} needs at least one child and a quorum between 1 and "
                f"their number ({len(wanted)}), not {quorum!r}"
            )
        if len(f"{name}/{len(wanted) - 1}") > _CHILD_KEY_MAX:
            raise ConfigurationError(f"step name {name!r} is too long for its children's keys")
        digest = _hash(name, {"children": [list(w) for w in wanted], "quorum": quorum})
        led = await self.ledger()
        found = self._recorded(led, name, "children", digest)
        if found is not None and found.state == "done":
            return [_child(c) for c in found.result or []]
        tenant, task = self.task.tenant_id, self.task.id
        if found is None:
            led.steps[name] = await steps.record(
                self.pool, tenant, task, name, kind="children", input_hash=digest, result=None,
                lease=self.lease, waiting=True,
            )  # fmt: skip
        prefix = f"{name}/"
        kids = await children.children(self.pool, tenant, task)
        mine = {c.key: c for c in kids if c.key is not None and c.key.startswith(prefix)}
        for i, (task_type, params) in enumerate(wanted):
            if f"{name}/{i}" not in mine:  # once per key: a retried fan-out gets the same ones
                child = await self.spawn(task_type, f"{name}/{i}", params, **create)
                mine[f"{name}/{i}"] = children.Child(child, f"{name}/{i}", None)
        ours = [mine[f"{name}/{i}"] for i in range(len(wanted))]
        done = sum(c.task.state in FINISHED_STATES for c in ours)
        if done >= need:
            snapshot = [
                {"key": c.key, "task_id": str(c.task.id), "task_type": c.task.task_type,
                 "state": c.task.state, "result": c.result, "error": c.task.last_error}
                for c in ours
            ]  # fmt: skip
            text = json_value(snapshot, cap=OBJECT_CAP, what=f"the results of children {name!r}")
            step = await steps.finish(self.pool, tenant, task, name, result=text, lease=self.lease)
            led.steps[name] = step
            return [_child(c) for c in step.result or []]
        others = sum(
            c.task.state in FINISHED_STATES
            for c in kids
            if c.key is None or not c.key.startswith(prefix)
        )
        raise Suspended(Wait(children=others + need, step=name))


def _replayed(name: str, result: Any) -> Any:
    """A recorded effect's result - unless it was recorded without one (see effect()).

    Raises:
        ConfigurationError: the effect happened and returned what is not JSON data.
    """
    if isinstance(result, dict) and result.get("$agentdb") == "unrecorded":
        raise ConfigurationError(
            f"effect {name!r} was performed and returned a {result.get('type')}, which is not "
            "JSON data: it is recorded without its value. Return a dict (or a Performed whose "
            "value is one)"
        )
    return result


def _child(doc: Mapping[str, Any]) -> ChildResult:
    return ChildResult(
        key=doc["key"],
        task_id=uuid.UUID(doc["task_id"]),
        task_type=doc["task_type"],
        state=doc["state"],
        result=doc.get("result"),
        error=doc.get("error"),
    )
