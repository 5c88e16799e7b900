"""Every error agentdb raises, and the catalogue that ties database objects to guarantees.

Database errors are recognised by SQLSTATE and constraint name only, never by
message text (messages are localised and change between versions). Constraint,
trigger, index and policy names are public API: :data:`CONSTRAINTS` lists each
one with the guarantee (G1...G17, see the README) it enforces, and a test
checks that this catalogue and the migrated schema agree exactly.

The tree::

    AgentDBError
    +-- ConfigurationError        bad input from the caller
    +-- DatabaseUnavailable       cannot connect / login refused
    +-- MigrationError            migrations failed or the database is ahead
    +-- TransientError            safe to retry: serialization failure, deadlock,
    |                             lock not available, lost connection
    +-- InvariantViolation        Postgres refused the write (named object)
    |   +-- InvalidTransition, VersionRuleViolation, AppendOnlyViolation,
    |   |   ImmutableColumn, LeaseTokenRegression, MissingEvent,
    |   |   TenantScopeMissing          (agentdb's own SQLSTATEs AG001-AG007)
    |   +-- TenantMismatch, DuplicateKey, PayloadTooLarge, SecretInPayload
    +-- StaleWrite                the statement matched no row
    |   +-- NotFound, StaleVersion, LeaseLost
    +-- IdempotencyConflict       same key, different input (G4)
    +-- OperationInFlight         same key, first attempt not settled (G4, G13)
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Final

__all__ = [
    "CONSTRAINTS",
    "SQLSTATES",
    "AgentDBError",
    "AppendOnlyViolation",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DuplicateKey",
    "IdempotencyConflict",
    "ImmutableColumn",
    "InvalidTransition",
    "InvariantViolation",
    "LeaseLost",
    "LeaseTokenRegression",
    "MigrationError",
    "MissingEvent",
    "NotFound",
    "OperationInFlight",
    "PayloadTooLarge",
    "SecretInPayload",
    "StaleVersion",
    "StaleWrite",
    "TenantMismatch",
    "TenantScopeMissing",
    "TransientError",
    "VersionRuleViolation",
]


class AgentDBError(Exception):
    """Base class of every error agentdb raises."""


class ConfigurationError(AgentDBError):
    """Bad input from the caller: a malformed DSN, schema name, option or argument."""


class DatabaseUnavailable(AgentDBError):
    """The database could not be reached or refused the login."""


class MigrationError(AgentDBError):
    """A migration could not be applied or rolled back, or the database is ahead of this code."""


class TransientError(AgentDBError):
    """A failure that says nothing about the data: retrying the whole transaction is safe.

    Serialization failure (40001), deadlock (40P01), lock not available (55P03),
    a cached plan invalidated by a migration, or a lost connection.

    Attributes:
        sqlstate: the SQLSTATE, or ``""`` for a lost connection.
    """

    def __init__(self, message: str, *, sqlstate: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class InvariantViolation(AgentDBError):
    """Postgres refused a write because it would break a guarantee.

    Attributes:
        guarantee: the guarantee id (``"G6"``...) the refusing object enforces.
        sqlstate: the SQLSTATE Postgres reported.
        constraint: the constraint, trigger or index name Postgres reported.
    """

    guarantee: str = ""
    sqlstate_code: ClassVar[str] = ""

    def __init__(self, message: str, *, sqlstate: str = "", constraint: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate or self.sqlstate_code
        self.constraint = constraint
        if constraint is not None and constraint in CONSTRAINTS and not self.guarantee:
            self.guarantee = CONSTRAINTS[constraint]


class InvalidTransition(InvariantViolation):
    """G6: the lifecycle move is not an edge of ``agent_transitions`` (SQLSTATE AG001)."""

    guarantee = "G6"
    sqlstate_code = "AG001"


class VersionRuleViolation(InvariantViolation):
    """G7: a raw UPDATE did not move ``state_version`` by exactly +1 (SQLSTATE AG002)."""

    guarantee = "G7"
    sqlstate_code = "AG002"


class AppendOnlyViolation(InvariantViolation):
    """G8: an UPDATE, DELETE or TRUNCATE of the audit log was refused (SQLSTATE AG003)."""

    guarantee = "G8"
    sqlstate_code = "AG003"


class ImmutableColumn(InvariantViolation):
    """G2/G4: a tenant id, id or key/hash column of a versioned row changed (SQLSTATE AG004)."""

    guarantee = "G2"
    sqlstate_code = "AG004"


class LeaseTokenRegression(InvariantViolation):
    """G12: a lease was granted without a new, larger token (SQLSTATE AG005)."""

    guarantee = "G12"
    sqlstate_code = "AG005"


class MissingEvent(InvariantViolation):
    """G8: a state change reached COMMIT without its audit event (SQLSTATE AG006)."""

    guarantee = "G8"
    sqlstate_code = "AG006"


class TenantScopeMissing(InvariantViolation):
    """G15: the session is not pinned or scoped to a tenant (SQLSTATE AG007)."""

    guarantee = "G15"
    sqlstate_code = "AG007"


class TenantMismatch(InvariantViolation):
    """G2: a row referenced a parent that does not exist in its own tenant (SQLSTATE 23503)."""

    guarantee = "G2"
    sqlstate_code = "23503"


class DuplicateKey(InvariantViolation):
    """G3 and friends: a unique key is already taken (SQLSTATE 23505)."""

    sqlstate_code = "23505"


class PayloadTooLarge(InvariantViolation):
    """G9: a payload, params or result document is over its cap (or not a JSON object).

    Raised by the write path before anything is sent, and mapped from the
    size CHECKs (SQLSTATE 23514) when Postgres refuses it.
    """

    guarantee = "G9"
    sqlstate_code = "23514"


class SecretInPayload(InvariantViolation):
    """G9: an event payload carried a secret-looking key or value (SQLSTATE 23514)."""

    guarantee = "G9"
    sqlstate_code = "23514"


class StaleWrite(AgentDBError):
    """A guarded statement matched no row. Reload before deciding anything.

    Attributes:
        entity: ``"task"``, ``"operation"`` or ``"outbox"``.
        tenant_id, id: the row the caller addressed.
    """

    def __init__(self, message: str, *, entity: str, tenant_id: uuid.UUID, id: uuid.UUID) -> None:
        super().__init__(message)
        self.entity = entity
        self.tenant_id = tenant_id
        self.id = id


class NotFound(StaleWrite):
    """The row does not exist in this tenant."""


class StaleVersion(StaleWrite):
    """G7: another writer moved the row on; ``expected`` is what the caller had, ``actual`` is now.

    Also raised when an operation is no longer in a state the write starts from
    (``expected_state`` / ``actual_state``).
    """

    def __init__(
        self,
        message: str,
        *,
        entity: str,
        tenant_id: uuid.UUID,
        id: uuid.UUID,
        expected: int,
        actual: int,
        actual_state: str | None = None,
    ) -> None:
        super().__init__(message, entity=entity, tenant_id=tenant_id, id=id)
        self.expected = expected
        self.actual = actual
        self.actual_state = actual_state


class LeaseLost(StaleWrite):
    """G12: the caller's lease was taken over (or the task left 'running'); nothing was written.

    Attributes:
        owner, token: the lease the caller presented.
        current_owner, current_token: the lease on the row now (``None`` if none).
    """

    def __init__(
        self,
        message: str,
        *,
        entity: str,
        tenant_id: uuid.UUID,
        id: uuid.UUID,
        owner: str,
        token: int,
        current_owner: str | None,
        current_token: int | None,
    ) -> None:
        super().__init__(message, entity=entity, tenant_id=tenant_id, id=id)
        self.owner = owner
        self.token = token
        self.current_owner = current_owner
        self.current_token = current_token


class IdempotencyConflict(AgentDBError):
    """G4: the key was already used for a different input; the stored result is never returned.

    Attributes:
        tenant_id, key: the key reused.
        stored_hash, given_hash: input hashes of the first request and this one.
    """

    guarantee: ClassVar[str] = "G4"

    def __init__(
        self, message: str, *, tenant_id: uuid.UUID, key: str, stored_hash: str, given_hash: str
    ) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.key = key
        self.stored_hash = stored_hash
        self.given_hash = given_hash


class OperationInFlight(AgentDBError):
    """G4/G13: the key's first attempt has not settled (reserved, in flight or unknown).

    Do not call the provider again: wait, or reconcile the operation first.

    Attributes:
        tenant_id, key, operation_id, state: the operation holding the key.
    """

    guarantee: ClassVar[str] = "G4"

    def __init__(
        self, message: str, *, tenant_id: uuid.UUID, key: str, operation_id: uuid.UUID, state: str
    ) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.key = key
        self.operation_id = operation_id
        self.state = state


#: agentdb's own SQLSTATEs (class AG), raised by the guard triggers and functions.
SQLSTATES: Final[Mapping[str, type[InvariantViolation]]] = MappingProxyType(
    {
        cls.sqlstate_code: cls
        for cls in (
            InvalidTransition,
            VersionRuleViolation,
            AppendOnlyViolation,
            ImmutableColumn,
            LeaseTokenRegression,
            MissingEvent,
            TenantScopeMissing,
        )
    }
)


def _named(guarantee: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, guarantee)


#: Every named constraint, guard trigger, unique/claim index and RLS policy
#: in the schema, mapped to the guarantee it enforces or serves.
CONSTRAINTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        # G1: tasks and operations are separate; G2: tenant-leading keys and
        # composite tenant foreign keys on every child.
        **_named(
            "G2",
            "agent_tenants_pkey",
            "agent_tasks_pkey",
            "agent_operations_pkey",
            "agent_events_pkey",
            "agent_outbox_pkey",
            "agent_artifacts_pkey",
            "agent_credential_refs_pkey",
            "agent_principals_pkey",
            "agent_principals_tenant_fkey",
            "agent_tasks_tenant_fkey",
            "agent_operations_task_fkey",
            "agent_events_task_fkey",
            "agent_events_operation_fkey",
            "agent_outbox_tenant_fkey",
            "agent_outbox_task_fkey",
            "agent_inbox_tenant_fkey",
            "agent_artifacts_tenant_fkey",
            "agent_artifacts_task_fkey",
            "agent_artifacts_operation_fkey",
            "agent_credential_refs_tenant_fkey",
            "agent_operations_task_idx",
            "agent_events_task_idx",
            "agent_outbox_task_idx",
            "agent_artifacts_task_idx",
            "agent_artifacts_operation_idx",
        ),
        # G3: one logical operation / task per key per tenant.
        **_named("G3", "agent_tasks_dedupe_key", "agent_operations_idempotency_key"),
        # G4: keys come with the hash of the request they answered.
        **_named(
            "G4",
            "agent_tasks_dedupe_has_hash",
            "agent_tasks_input_hash_format",
            "agent_operations_input_hash_format",
        ),
        # G5: valid states, owners, counters and lengths.
        **_named(
            "G5",
            "agent_tenants_state_valid",
            "agent_tenants_name_valid",
            "agent_principals_role_name_valid",
            "agent_tasks_state_valid",
            "agent_tasks_task_type_valid",
            "agent_tasks_workflow_version_valid",
            "agent_tasks_current_step_valid",
            "agent_tasks_due_has_wake_at",
            "agent_tasks_attempts_valid",
            "agent_tasks_last_error_valid",
            "agent_tasks_dedupe_key_valid",
            "agent_operations_state_valid",
            "agent_operations_idempotency_key_valid",
            "agent_operations_action_valid",
            "agent_operations_attempts_valid",
            "agent_operations_provider_reference_valid",
            "agent_operations_error_valid",
            "agent_operations_succeeded_has_no_error",
            "agent_events_event_type_valid",
            "agent_events_actor_id_valid",
            "agent_events_policy_version_valid",
            "agent_events_state_valid",
            "agent_events_operation_version_has_operation",
            "agent_outbox_topic_valid",
            "agent_outbox_attempts_valid",
            "agent_outbox_last_error_valid",
            "agent_inbox_consumer_valid",
            "agent_artifacts_kind_valid",
            "agent_artifacts_uri_valid",
            "agent_artifacts_sha256_format",
            "agent_artifacts_size_valid",
            "agent_artifacts_content_type_valid",
            "agent_credential_refs_name_key",
            "agent_credential_refs_name_valid",
            "agent_credential_refs_provider_valid",
        ),
        # G6: lifecycle edges.
        **_named(
            "G6",
            "agent_transitions_pkey",
            "agent_transitions_entity_valid",
            "agent_transitions_no_self_loop",
            "agent_tasks_transition_guard",
            "agent_operations_transition_guard",
            "agent_outbox_transition_guard",
        ),
        # G7: versioned writes (the guard also keeps tenant_id immutable).
        **_named(
            "G7",
            "agent_tasks_state_version_valid",
            "agent_operations_state_version_valid",
            "agent_tasks_version_guard",
            "agent_operations_version_guard",
        ),
        # G8: append-only audit, one event per state change.
        **_named(
            "G8",
            "agent_events_append_only",
            "agent_events_no_truncate",
            "agent_tasks_event_required",
            "agent_operations_event_required",
            "agent_events_task_version_key",
            "agent_events_operation_version_key",
        ),
        # G9: bounded, redacted payloads and their retention.
        **_named(
            "G9",
            "agent_tasks_params_valid",
            "agent_operations_result_valid",
            "agent_events_payload_size",
            "agent_events_payload_no_secrets",
            "agent_events_retention_order",
            "agent_events_retain_until_idx",
            "agent_events_payload_expiry_idx",
            "agent_outbox_payload_size",
            "agent_operations_settled_idx",
            "agent_events_operation_idx",
            "agent_tasks_finished_idx",
        ),
        # G10: outbox delivery state (and the wake-up hint for relays).
        **_named(
            "G10",
            "agent_outbox_notify",
            "agent_outbox_state_valid",
            "agent_outbox_delivered_at_valid",
            "agent_outbox_lease_owner_valid",
            "agent_outbox_lease_token_valid",
            "agent_outbox_pending_idx",
            "agent_outbox_delivered_idx",
            "agent_outbox_dead_idx",
        ),
        # G11: consumer-side dedupe.
        **_named("G11", "agent_inbox_pkey", "agent_inbox_processed_at_idx"),
        # G12: leases and fencing tokens (and the wake-up hint for workers).
        **_named(
            "G12",
            "agent_tasks_notify",
            "agent_tasks_lease_complete",
            "agent_tasks_lease_window",
            "agent_tasks_running_is_leased",
            "agent_tasks_lease_owner_valid",
            "agent_tasks_lease_token_valid",
            "agent_tasks_lease_ttl_valid",
            "agent_tasks_due_idx",
            "agent_tasks_lease_expiry_idx",
        ),
        # G13: operations that still need reconciling are found by index.
        **_named("G13", "agent_operations_unsettled_idx"),
        # G15: row-level security.
        **_named(
            "G15",
            "agentdb_tenant_scope",
            *(
                f"agent_{table}_{policy}"
                for table in (
                    "tenants",
                    "tasks",
                    "operations",
                    "events",
                    "outbox",
                    "inbox",
                    "artifacts",
                    "credential_refs",
                )
                for policy in ("owner_all", "runtime_all")
            ),
            *(
                f"agent_{table}_agent_scope"
                for table in ("tenants", "tasks", "operations", "events", "artifacts")
            ),
        ),
        # G16: W3C trace-context ids.
        **_named(
            "G16",
            *(
                f"agent_{table}_{column}_format"
                for table in ("tasks", "operations", "events", "outbox")
                for column in ("trace_id", "span_id")
            ),
        ),
        # G16: the pinned GenAI semantic-conventions version, append-only history.
        **_named(
            "G16",
            "agent_semconv_pins_pkey",
            "agent_semconv_pins_version_format",
            "agent_semconv_pins_append_only",
        ),
        # G17: credentials are references, never secrets.
        **_named("G17", "agent_credential_refs_is_reference"),
    }
)
