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
"""

from __future__ import annotations

from agentdb import errors, inbox, leases, operations, outbox, tasks, tenancy
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
    "errors",
    "inbox",
    "input_hash",
    "leases",
    "operations",
    "outbox",
    "tasks",
    "tenancy",
]
