"""agentdb: Postgres enforces what AI agents must not get wrong.

Tenant scope, idempotency, legal state transitions, fenced leases, an
append-only audit trail and reliable outbox delivery live in the schema under
``sql/``; this package applies it and wraps its statements.
"""

from __future__ import annotations

from agentdb.errors import (
    AgentDBError,
    AppendOnlyViolation,
    ConfigurationError,
    DatabaseUnavailable,
    ImmutableColumn,
    InvalidTransition,
    InvariantViolation,
    LeaseTokenRegression,
    MigrationError,
    MissingEvent,
    StaleVersion,
    TenantScopeMissing,
)

__version__ = "0.1.0"

__all__ = [
    "AgentDBError",
    "AppendOnlyViolation",
    "ConfigurationError",
    "DatabaseUnavailable",
    "ImmutableColumn",
    "InvalidTransition",
    "InvariantViolation",
    "LeaseTokenRegression",
    "MigrationError",
    "MissingEvent",
    "StaleVersion",
    "TenantScopeMissing",
    "__version__",
]
