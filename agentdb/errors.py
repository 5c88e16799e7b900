"""Every error agentdb raises.

Database errors are recognised by SQLSTATE and constraint name only, never by
message text (messages are localised and change between versions):
:func:`agentdb._db.errormap.error_for`, beside the driver, is the whole
mapping. The object names it keys on, and the guarantee each object
enforces, live in :mod:`agentdb.guarantees`; every error that stands for a
guarantee carries its id as ``.guarantee``.

The tree::

    AgentDBError
    +-- ConfigurationError        bad input from the caller
    |   +-- PoolerMismatch        a transaction pooler agentdb was not told about
    +-- DatabaseUnavailable       cannot connect / login refused
    +-- MigrationError            migrations failed, or the schema is not the one this code needs
    +-- TransientError            safe to retry: serialization failure, deadlock,
    |                             lock not available, lost connection
    +-- InvariantViolation        Postgres refused the write (named object)
    |   +-- InvalidTransition, VersionRuleViolation, AppendOnlyViolation,
    |   |   ImmutableColumn (+ ImmutableKey), LeaseTokenRegression, MissingEvent,
    |   |   TenantScopeMissing, ConcurrencyLimitExceeded, BudgetRuleViolation,
    |   |   TaskFinished, DeadlineExceeded, SignalRuleViolation,
    |   |   ReadCommittedRequired, ScheduleRuleViolation, StepRuleViolation
    |   |   (agentdb's SQLSTATEs AG001-AG018)
    |   +-- TenantMismatch, DuplicateKey, PayloadTooLarge, SecretInPayload
    |   +-- BudgetExceeded, RateLimited   a reservation refused at reserve (G19)
    +-- StaleWrite                the statement matched no row
    |   +-- NotFound, StaleVersion, LeaseLost (+ OutboxLeaseLost, Cancelled, PastDeadline)
    +-- IdempotencyConflict       same key, different input (G4)
    |   +-- StepConflict          a step name recorded with other arguments (G25)
    +-- OperationInFlight         same key, first attempt not settled (G4)
    +-- OperationUnsettled        a crashed attempt's operation could not be reconciled (G13)
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, Final

from agentdb.guarantees import CONSTRAINTS, guarantee_of

if TYPE_CHECKING:
    from agentdb.models import Operation

__all__ = [
    "CONSTRAINTS",
    "RETRYABLE",
    "SQLSTATES",
    "AgentDBError",
    "AppendOnlyViolation",
    "BudgetExceeded",
    "BudgetRuleViolation",
    "Cancelled",
    "ConcurrencyLimitExceeded",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "DuplicateKey",
    "FanInIsolationViolation",
    "IdempotencyConflict",
    "ImmutableColumn",
    "ImmutableKey",
    "InvalidTransition",
    "InvariantViolation",
    "LeaseLost",
    "LeaseTokenRegression",
    "MigrationError",
    "MissingEvent",
    "NotFound",
    "OperationInFlight",
    "OperationUnsettled",
    "OutboxLeaseLost",
    "PastDeadline",
    "PayloadTooLarge",
    "PoolerMismatch",
    "RateLimited",
    "ReadCommittedRequired",
    "ScheduleRuleViolation",
    "SecretInPayload",
    "SignalIsolationViolation",
    "SignalRuleViolation",
    "StaleVersion",
    "StaleWrite",
    "StepConflict",
    "StepRuleViolation",
    "TaskFinished",
    "TenantMismatch",
    "TenantScopeMissing",
    "TransientError",
    "VersionRuleViolation",
]


class AgentDBError(Exception):
    """Base class of every error agentdb raises."""


class ConfigurationError(AgentDBError):
    """Bad input from the caller: a malformed DSN, schema name, option or argument."""


class PoolerMismatch(ConfigurationError):
    """A transaction-pooling proxy sits between agentdb and Postgres, and agentdb was not told.

    A named prepared statement vanished or collided (SQLSTATE 26000 / 42P05)
    because consecutive transactions ran on different server connections; the
    statement never ran. Set ``AGENTDB_POOLER=transaction`` (or pass
    ``--pooler transaction``, or ``pooler="transaction"`` to the pool factory).
    """


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
        # The refusing object's rule is more precise than the class default.
        found = guarantee_of(constraint, self.sqlstate)
        if found is not None:
            self.guarantee = found


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
    """G2: the tenant id, id or creation time of a versioned row changed (SQLSTATE AG004)."""

    guarantee = "G2"
    sqlstate_code = "AG004"


class ImmutableKey(ImmutableColumn):
    """G4: what a key was issued for changed (SQLSTATE AG008).

    A task's type, dedupe key or input hash; an operation's task, idempotency
    key, action or input hash. Were they mutable, a stored result could be
    re-pointed at a different request.
    """

    guarantee = "G4"
    sqlstate_code = "AG008"


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


class ConcurrencyLimitExceeded(InvariantViolation):
    """G18: a task would start while its tenant (or task type) runs its cap (SQLSTATE AG009).

    The claim never asks for more than a cap leaves free; this comes from a
    write outside it (or one racing it), and nothing of that write landed.
    """

    guarantee = "G18"
    sqlstate_code = "AG009"


class BudgetRuleViolation(InvariantViolation):
    """G19: a raw write rewrote a budget's books (SQLSTATE AG010).

    Spent went down inside a window, a budget changed its tenant, task or
    unit, or a settled / released hold was changed.
    """

    guarantee = "G19"
    sqlstate_code = "AG010"


class TaskFinished(InvariantViolation):
    """G20: an operation reserved, or a failed one re-armed, for a finished task (succeeded,
    failed, cancelled, dead) by a writer with no lease to fence it; or (G22) a signal sent
    to one (SQLSTATE AG012)."""

    guarantee = "G20"
    sqlstate_code = "AG012"


class DeadlineExceeded(InvariantViolation):
    """G21: the task passed its deadline; the write would have kept it alive (a claim, a
    finish, a step, a release, a new operation) - it only moves to dead or cancelled now
    (SQLSTATE AG013)."""

    guarantee = "G21"
    sqlstate_code = "AG013"


class SignalRuleViolation(InvariantViolation):
    """G22: an approval by the task's own lease holder, or a signal cursor moved back or past
    the task's last signal (SQLSTATE AG014)."""

    guarantee = "G22"
    sqlstate_code = "AG014"


class ReadCommittedRequired(InvariantViolation):
    """A wake-up rule ran at REPEATABLE READ or SERIALIZABLE: its snapshot cannot see what
    committed before the row lock it takes. Run it at READ COMMITTED, the default."""


class SignalIsolationViolation(ReadCommittedRequired):
    """G22: a signal, or a wait for one that would sleep, outside READ COMMITTED
    (SQLSTATE AG015)."""

    guarantee = "G22"
    sqlstate_code = "AG015"


class FanInIsolationViolation(ReadCommittedRequired):
    """G23: a child's finish that counts its waiting parent's children, or a wait for
    children that would sleep, outside READ COMMITTED (SQLSTATE AG016)."""

    guarantee = "G23"
    sqlstate_code = "AG016"


class ScheduleRuleViolation(InvariantViolation):
    """G24: a scheduled task whose tick is not a due tick of a schedule of its tenant, or a
    change to a task's schedule or tick (SQLSTATE AG017)."""

    guarantee = "G24"
    sqlstate_code = "AG017"


class StepRuleViolation(InvariantViolation):
    """G25: a step written without the task's current lease, a recorded step changed, or a
    signal taken that is not its task's (SQLSTATE AG018)."""

    guarantee = "G25"
    sqlstate_code = "AG018"


class BudgetExceeded(InvariantViolation):
    """G19: a reservation would take spent + held over a budget's limit (SQLSTATE 23514).

    Mapped from the CHECK ``agent_budgets_within_limit``; nothing of the
    reservation was written (no operation, no hold). ``operations.reserve``
    fills in what the budgets had left when it was refused.

    Attributes:
        requested: the cost asked for, unit -> amount (empty when unknown).
        remaining: unit -> what the tightest budget of that unit still allows.
    """

    guarantee = "G19"
    sqlstate_code = "23514"

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str = "",
        constraint: str | None = None,
        requested: Mapping[str, int] | None = None,
        remaining: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(message, sqlstate=sqlstate, constraint=constraint)
        self.requested: Mapping[str, int] = MappingProxyType(dict(requested or {}))
        self.remaining: Mapping[str, int] = MappingProxyType(dict(remaining or {}))


class RateLimited(InvariantViolation):
    """G19: the action used up its rate limit for this window (SQLSTATE AG011).

    Raised by the trigger ``agent_operations_rate_limit`` (and ``..._retry``)
    that counts every reservation, or mapped from the CHECKs
    ``agent_rate_limits_within_limit`` / ``agent_global_rate_limits_within_limit``
    (SQLSTATE 23514) on a raw write of the counters; nothing was reserved. Try
    again at ``retry_after`` (the worker turns this into a wait that costs
    no attempt).

    Attributes:
        action: the operation's action.
        retry_after: when the window that refused it ends (``None`` when unknown).
    """

    guarantee = "G19"
    sqlstate_code = "AG011"

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str = "",
        constraint: str | None = None,
        action: str = "",
        retry_after: datetime | None = None,
    ) -> None:
        super().__init__(message, sqlstate=sqlstate, constraint=constraint)
        self.action = action
        self.retry_after = retry_after


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
        entity: ``"task"``, ``"operation"``, ``"outbox"`` or ``"tenant"``.
        tenant_id, id: the row the caller addressed.
        guarantee: the guarantee whose fence refused the write.
    """

    guarantee: ClassVar[str] = ""

    def __init__(self, message: str, *, entity: str, tenant_id: uuid.UUID, id: uuid.UUID) -> None:
        super().__init__(message)
        self.entity = entity
        self.tenant_id = tenant_id
        self.id = id


class NotFound(StaleWrite):
    """G2: the row does not exist in this tenant (a row of another tenant is never found).

    For example, reading or transitioning a task id under the wrong tenant.
    """

    guarantee = "G2"


class StaleVersion(StaleWrite):
    """G7: another writer moved the row on; ``expected`` is what the caller had, ``actual`` is now.

    Also raised when an operation is no longer in a state the write starts from
    (``expected_state`` / ``actual_state``). For example, completing an
    operation another attempt already settled.
    """

    guarantee = "G7"

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

    For example, a worker that stalled past its TTL and was reclaimed gets
    this from its next renew, reserve, settle or finish.

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

    guarantee = "G12"


class Cancelled(LeaseLost):
    """G20: the task was cancelled (:func:`agentdb.tasks.cancel`) and its lease went with
    it; nothing the holder tried was written. The worker then stops the handler."""

    guarantee = "G20"


class PastDeadline(LeaseLost):
    """G21: the task passed its deadline and the sweep moved it to 'dead'; its lease went
    with it, and nothing the holder tried was written."""

    guarantee = "G21"


class OutboxLeaseLost(LeaseLost):
    """G10: the relay's claim on an outbox message moved on (its visibility ran out and
    another relay claimed it, or it was already marked); nothing was written."""

    guarantee = "G10"


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


class StepConflict(IdempotencyConflict):
    """G25: a handler reached a step name its earlier run recorded with other arguments (or as
    another kind of step); the recorded result is never handed to a different call.

    A step is keyed by its name, never by its position: a deploy that changed what a
    named step is given, or a name reused in a loop, shows up here instead of as a
    wrong replay. Name loop iterations (``f"search/{i}"``).

    Attributes:
        step: the step's name; ``stored_hash`` / ``given_hash`` as for :class:`IdempotencyConflict`.
    """

    guarantee: ClassVar[str] = "G25"

    def __init__(
        self, message: str, *, tenant_id: uuid.UUID, step: str, stored_hash: str, given_hash: str
    ) -> None:
        super().__init__(
            message, tenant_id=tenant_id, key=step, stored_hash=stored_hash, given_hash=given_hash
        )
        self.step = step


class StepMissing(AgentDBError):
    """G25: a re-entered run reached another step than it recorded at that place, or
    finished without reaching an effect it recorded: what it calls was renamed or
    removed (an agent framework's agent, tool or toolset) since the step was recorded.

    The recorded result is never handed to another call and the effect is never
    performed again under a new name; finish or cancel the task with the code that
    started it.

    Attributes:
        tenant_id: the task's tenant; ``step``: the recorded step's name.
    """

    guarantee: ClassVar[str] = "G25"

    def __init__(self, message: str, *, tenant_id: uuid.UUID, step: str) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.step = step


class OperationInFlight(AgentDBError):
    """G4: the key's first attempt has not settled (reserved, in flight or unknown).

    Do not call the provider again: wait, or reconcile the operation first.

    Attributes:
        tenant_id, key: the key reused.
        operation: the operation holding the key, as the reserve read it.
        operation_id, state: its id and state.
    """

    guarantee: ClassVar[str] = "G4"

    def __init__(self, message: str, *, operation: Operation) -> None:
        super().__init__(message)
        self.operation = operation
        self.tenant_id = operation.tenant_id
        self.key = operation.idempotency_key
        self.operation_id = operation.id
        self.state = operation.state


class OperationUnsettled(AgentDBError):
    """G13: an earlier attempt's operation could not be reconciled; the task is retried later.

    The operation is left 'unknown' for an operator or a later reconcile; the
    provider is not called again blindly.
    """

    guarantee: ClassVar[str] = "G13"

    def __init__(self, operation: Operation) -> None:
        super().__init__(
            f"operation {operation.id} ({operation.action}, key {operation.idempotency_key!r}) "
            f"is {operation.state} and has no reconcile hook that could settle it"
        )
        self.operation = operation


def _declared_codes(root: type[InvariantViolation]) -> dict[str, type[InvariantViolation]]:
    """The classes under ``root`` that declare one of agentdb's SQLSTATEs (class AG)."""
    found: dict[str, type[InvariantViolation]] = {}
    for cls in root.__subclasses__():
        code = vars(cls).get("sqlstate_code")
        if isinstance(code, str) and code.startswith("AG"):
            found[code] = cls
        found.update(_declared_codes(cls))
    return found


#: agentdb's own SQLSTATEs (class AG), raised by the guard triggers and functions.
SQLSTATES: Final[Mapping[str, type[InvariantViolation]]] = MappingProxyType(
    dict(sorted(_declared_codes(InvariantViolation).items()))
)

#: SQLSTATEs after which retrying the whole transaction is safe.
RETRYABLE: Final[Mapping[str, str]] = MappingProxyType(
    {
        "40001": "serialization failure",
        "40P01": "deadlock detected",
        "55P03": "lock not available",
        "57P01": "server shutting down",
        "57P02": "crash shutdown",
        "57P03": "server starting up",
    }
)
