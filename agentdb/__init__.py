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
    from typing import Any

    from agentdb import errors, guarantees, inbox, leases, operations, outbox, tasks, tenancy
    from agentdb._db import create_pool
    from agentdb.errors import (
        AgentDBError,
        IdempotencyConflict,
        InvalidTransition,
        InvariantViolation,
        LeaseLost,
        NotFound,
        OperationInFlight,
        StaleVersion,
        StaleWrite,
        TransientError,
    )
    from agentdb.hashing import input_hash
    from agentdb.models import Lease, Message, Operation, OutboxMessage, Reservation, Task

# Names load on first use (PEP 562): `import agentdb` - which every `agentdb`
# command does first - stays cheap, so a Ctrl-C in the first instant lands in
# the CLI's handler (one line, exit 130) rather than in a half-done import.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        ("errors", "guarantees", "inbox", "leases", "operations", "outbox", "tasks", "tenancy"),
        "",
    ),
    "create_pool": "agentdb._db",
    **dict.fromkeys(
        (
            "AgentDBError",
            "IdempotencyConflict",
            "InvalidTransition",
            "InvariantViolation",
            "LeaseLost",
            "NotFound",
            "OperationInFlight",
            "StaleVersion",
            "StaleWrite",
            "TransientError",
        ),
        "agentdb.errors",
    ),
    "input_hash": "agentdb.hashing",
    **dict.fromkeys(
        ("Lease", "Message", "Operation", "OutboxMessage", "Reservation", "Task"), "agentdb.models"
    ),
}


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


__version__ = "0.1.0"

__all__ = [
    "AgentDBError",
    "IdempotencyConflict",
    "InvalidTransition",
    "InvariantViolation",
    "Lease",
    "LeaseLost",
    "Message",
    "NotFound",
    "Operation",
    "OperationInFlight",
    "OutboxMessage",
    "Reservation",
    "StaleVersion",
    "StaleWrite",
    "Task",
    "TransientError",
    "__version__",
    "create_pool",
    "errors",
    "guarantees",
    "inbox",
    "input_hash",
    "leases",
    "operations",
    "outbox",
    "tasks",
    "tenancy",
]
