"""agentdb: Postgres enforces what AI agents must not get wrong.

Tenant scope, idempotency, legal state transitions, fenced leases, an
append-only audit trail and reliable outbox delivery live in the schema under
``sql/`` (its migrations; ``sql/schema.sql`` is the current state); the modules
here run its statements:

* :mod:`agentdb.tasks` - create, read and transition tasks (one round trip each)
* :mod:`agentdb.leases` - claim, renew, release (fenced by lease token)
* :mod:`agentdb.operations` - reserve -> call the provider -> complete / fail / reconcile
* :mod:`agentdb.outbox`, :mod:`agentdb.inbox` - delivery at least once, processing once
* :mod:`agentdb.tenancy` - tenants and per-transaction tenant scope
* :mod:`agentdb.errors` - everything raised, mapped by SQLSTATE and constraint name
* :mod:`agentdb.guarantees` - the guarantees and the schema objects that enforce each
* :func:`create_pool` - the pool factory every worker, relay and tool connects through

What a handler's author needs - :class:`Worker`, :class:`Job`, the outcomes
(:class:`Succeed`, :class:`Fail`, :class:`Retry`, :class:`Wait`) and the errors
a handler meets - is importable from here; ``docs/api.md`` lists every public
name by group, and says what stays stable.

The processes are :mod:`agentdb.worker` and :mod:`agentdb.relay`; schema
management is :mod:`agentdb.migrate` (and :mod:`agentdb.schema`), operator
status :mod:`agentdb.status`. The tools (CLI, audit, bench, demo, chaos) live
in :mod:`agentdb.tools`, which nothing here imports.
"""

from __future__ import annotations

# Not even `typing` at run time: a Ctrl-C in the first instant of an `agentdb`
# command must find nothing here half-imported (the CLI's handler turns it into
# one line; a KeyboardInterrupt inside `import typing` would be a traceback).
TYPE_CHECKING = False
if TYPE_CHECKING:
    # For type checkers only (they cannot follow the lazy loading below); the
    # `X as X` form re-exports each name. tests/test_api.py checks this block
    # names exactly what _PUBLIC does, from the same modules.
    from typing import Any

    from agentdb import errors as errors
    from agentdb import guarantees as guarantees
    from agentdb import inbox as inbox
    from agentdb import leases as leases
    from agentdb import operations as operations
    from agentdb import outbox as outbox
    from agentdb import tasks as tasks
    from agentdb import tenancy as tenancy
    from agentdb._db import create_pool as create_pool
    from agentdb.errors import AgentDBError as AgentDBError
    from agentdb.errors import BudgetExceeded as BudgetExceeded
    from agentdb.errors import Cancelled as Cancelled
    from agentdb.errors import ConfigurationError as ConfigurationError
    from agentdb.errors import DatabaseUnavailable as DatabaseUnavailable
    from agentdb.errors import DeadlineExceeded as DeadlineExceeded
    from agentdb.errors import IdempotencyConflict as IdempotencyConflict
    from agentdb.errors import InvalidTransition as InvalidTransition
    from agentdb.errors import InvariantViolation as InvariantViolation
    from agentdb.errors import LeaseLost as LeaseLost
    from agentdb.errors import NotFound as NotFound
    from agentdb.errors import OperationInFlight as OperationInFlight
    from agentdb.errors import OperationUnsettled as OperationUnsettled
    from agentdb.errors import PastDeadline as PastDeadline
    from agentdb.errors import PayloadTooLarge as PayloadTooLarge
    from agentdb.errors import RateLimited as RateLimited
    from agentdb.errors import SecretInPayload as SecretInPayload
    from agentdb.errors import StaleVersion as StaleVersion
    from agentdb.errors import StaleWrite as StaleWrite
    from agentdb.errors import StepConflict as StepConflict
    from agentdb.errors import TaskFinished as TaskFinished
    from agentdb.errors import TransientError as TransientError
    from agentdb.hashing import input_hash as input_hash
    from agentdb.models import Lease as Lease
    from agentdb.models import Message as Message
    from agentdb.models import Operation as Operation
    from agentdb.models import OutboxMessage as OutboxMessage
    from agentdb.models import Reservation as Reservation
    from agentdb.models import Task as Task
    from agentdb.worker import MANUAL as MANUAL
    from agentdb.worker import ChildResult as ChildResult
    from agentdb.worker import Fail as Fail
    from agentdb.worker import Handler as Handler
    from agentdb.worker import Job as Job
    from agentdb.worker import NotPerformed as NotPerformed
    from agentdb.worker import Outcome as Outcome
    from agentdb.worker import Performed as Performed
    from agentdb.worker import Reconciled as Reconciled
    from agentdb.worker import ReconcileHook as ReconcileHook
    from agentdb.worker import Retry as Retry
    from agentdb.worker import Succeed as Succeed
    from agentdb.worker import Wait as Wait
    from agentdb.worker import Worker as Worker
    from agentdb.worker import WorkerStats as WorkerStats

#: The public names, by the module each lives in ("" for the package's own modules):
#: the one list that ``__all__``, the lazy loading and docs/api.md follow.
_PUBLIC: dict[str, tuple[str, ...]] = {
    "": ("errors", "guarantees", "inbox", "leases", "operations", "outbox", "tasks", "tenancy"),
    "agentdb._db": ("create_pool",),
    "agentdb.worker": (
        "MANUAL",
        "ChildResult",
        "Fail",
        "Handler",
        "Job",
        "NotPerformed",
        "Outcome",
        "Performed",
        "ReconcileHook",
        "Reconciled",
        "Retry",
        "Succeed",
        "Wait",
        "Worker",
        "WorkerStats",
    ),
    "agentdb.errors": (
        "AgentDBError",
        "BudgetExceeded",
        "Cancelled",
        "ConfigurationError",
        "DatabaseUnavailable",
        "DeadlineExceeded",
        "IdempotencyConflict",
        "InvalidTransition",
        "InvariantViolation",
        "LeaseLost",
        "NotFound",
        "OperationInFlight",
        "OperationUnsettled",
        "PastDeadline",
        "PayloadTooLarge",
        "RateLimited",
        "SecretInPayload",
        "StaleVersion",
        "StaleWrite",
        "StepConflict",
        "TaskFinished",
        "TransientError",
    ),
    "agentdb.models": ("Lease", "Message", "Operation", "OutboxMessage", "Reservation", "Task"),
    "agentdb.hashing": ("input_hash",),
}

# Names load on first use (PEP 562): `import agentdb` - which every `agentdb`
# command does first - stays cheap, so a Ctrl-C in the first instant lands in
# the CLI's handler (one line, exit 130) rather than in a half-done import.
_LAZY: dict[str, str] = {name: home for home, names in _PUBLIC.items() for name in names}


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module 'agentdb' has no attribute {name!r}")
    import importlib

    value = (
        importlib.import_module(f"agentdb.{name}")
        if home == ""
        else getattr(importlib.import_module(home), name)
    )
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"

__all__ = sorted(["__version__", *_LAZY])
