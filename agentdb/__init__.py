"""agentdb: Postgres enforces what AI agents must not get wrong.

Tenant scope, idempotency, legal state transitions, fenced leases, an
append-only audit trail and reliable outbox delivery live in the schema under
``sql/``; the modules here run its statements:

* :mod:`agentdb.tasks` - create, read and transition tasks (one round trip each)
* :mod:`agentdb.leases` - claim, renew, release (fenced by lease token)
* :mod:`agentdb.operations` - reserve -> call the provider -> complete / fail / reconcile
* :mod:`agentdb.outbox`, :mod:`agentdb.inbox` - delivery at least once, processing once
* :mod:`agentdb.tenancy` - tenants and per-transaction tenant scope
* :mod:`agentdb.errors` - everything raised, mapped by SQLSTATE and constraint name
* :mod:`agentdb.guarantees` - G1-G17 and the schema objects that enforce each
* :func:`create_pool` - the pool factory every worker, relay and tool connects through

The processes are :mod:`agentdb.worker` and :mod:`agentdb.relay`; schema
management is :mod:`agentdb.migrate` (and :mod:`agentdb.schema`), operator
status :mod:`agentdb.status`. The tools (CLI, audit, bench, demo, chaos) live
in :mod:`agentdb.tools`, which nothing here imports.
"""

from __future__ import annotations

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
