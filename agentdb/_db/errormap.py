"""The one mapping of database errors onto agentdb's errors: SQLSTATE and constraint name.

Never message text (messages are localised and change between versions), but
for one Citus error that has nothing else to tell it by (``_CITUS_SHARD_MOVED``). It
lives with the driver layer, the one place that sees asyncpg's errors; the
classes it returns are :mod:`agentdb.errors`'s.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from agentdb.errors import (
    RETRYABLE,
    SQLSTATES,
    AgentDBError,
    BudgetExceeded,
    ConfigurationError,
    DuplicateKey,
    InvariantViolation,
    NotFound,
    PayloadTooLarge,
    PoolerMismatch,
    RateLimited,
    SecretInPayload,
    TenantMismatch,
    TransientError,
)
from agentdb.guarantees import CATALOGUE, CONSTRAINTS

__all__ = ["error_for"]

# Catalogue entries that name their error class (agentdb.guarantees.Entry.error).
_NAMED: Final[Mapping[str, type[InvariantViolation]]] = MappingProxyType(
    {
        "PayloadTooLarge": PayloadTooLarge,
        "SecretInPayload": SecretInPayload,
        "BudgetExceeded": BudgetExceeded,
        "RateLimited": RateLimited,
    }
)
_ERROR_OF: Final[Mapping[str, type[InvariantViolation]]] = MappingProxyType(
    {e.name: _NAMED[e.error] for e in CATALOGUE if e.error}
)


#: SQLSTATEs of input Postgres cannot take: a bad argument (22000), a NUL character in
#: text (22021) or in jsonb (22P05), a document nested deeper than the server's stack
#: allows (54001).
_BAD_INPUT = {
    # asyncpg raises this one itself for an argument it cannot encode (a tenant id that
    # is not a UUID, a lone surrogate): nothing reached the server.
    "22000": "an argument of the wrong type or encoding",
    "22021": "character not in repertoire",
    "22023": "an invalid parameter value",
    "22P05": "untranslatable character",
    "54001": "statement too complex",
}
#: A unique violation on a partition of agent_events (events by month) names the partition's
#: index (agent_events_p2026_12_pkey); the key it enforces is the partitioned table's.
_EVENT_PARTITION_KEY = re.compile(r"agent_events_(?:legacy|default|p[0-9]{4}_[0-9]{2})_pkey")
#: The foreign keys from a row's tenant_id to agent_tenants (named <table>_tenant_fkey;
#: tests/test_tasks.py checks the convention): refused, they say the tenant does not exist.
_TENANT_FKEYS: Final = frozenset(n for n in CONSTRAINTS if n.endswith("_tenant_fkey"))
#: SQLSTATEs a transaction pooler causes when named prepared statements are in use.
_POOLED = {"26000": "invalid_sql_statement_name", "42P05": "duplicate_prepared_statement"}
#: Citus, while a shard group is moved or split (citus_move_shard_placement,
#: isolate_tenant_to_new_shard): a statement planned against the old shard, that
#: waited for the move's write lock, finds it gone - XX000 "could not find valid entry
#: for shard N" (seen in tests/citus/test_citus_rebalance.py, from a signal's trigger
#: and from a step's insert). Nothing was written; run again, it is planned against the
#: new shard. The one place this module reads a message: XX000 is Citus's and
#: Postgres's catch-all, this is its only retryable case, and Citus does not translate
#: its messages.
_CITUS_SHARD_MOVED = "could not find valid entry for shard "


def error_for(
    sqlstate: str, constraint: str | None, message: str, *, tenant_id: uuid.UUID | None = None
) -> AgentDBError | None:
    """The agentdb error for a database error, from its SQLSTATE and constraint name.

    ``tenant_id``: the tenant the statement was given, if one; a refusal by a
    tenant foreign key is then :class:`NotFound` for that tenant (a missing
    tenant, not a row pointing across tenants).

    Returns ``None`` for an error agentdb does not recognise: the caller
    re-raises the original, because agentdb never hides what it does not
    understand. Constraint names outside :data:`agentdb.guarantees.CATALOGUE`
    are not agentdb's (they belong to the user's own schema) and stay unmapped.
    """
    if sqlstate in SQLSTATES:
        return SQLSTATES[sqlstate](message, sqlstate=sqlstate, constraint=constraint)
    if sqlstate in _BAD_INPUT:
        return ConfigurationError(
            f"Postgres cannot store this input ({_BAD_INPUT[sqlstate]}): {message}"
        )
    if sqlstate in _POOLED:
        return PoolerMismatch(
            f"a transaction-pooling proxy is in the way ({_POOLED[sqlstate]}: {message}): "
            "set AGENTDB_POOLER=transaction or pass --pooler transaction"
        )
    if sqlstate == "XX000" and message.startswith(_CITUS_SHARD_MOVED):
        return TransientError(
            f"a shard moved while the statement waited: {message}", sqlstate=sqlstate
        )
    if sqlstate in RETRYABLE or sqlstate.startswith("08"):
        return TransientError(
            f"{RETRYABLE.get(sqlstate, 'connection failure')}: {message}", sqlstate=sqlstate
        )
    if constraint is not None and _EVENT_PARTITION_KEY.fullmatch(constraint):
        constraint = "agent_events_pkey"
    if constraint is None or constraint not in CONSTRAINTS:
        return None
    if sqlstate == "23503" and constraint in _TENANT_FKEYS and tenant_id is not None:
        return NotFound(
            f"agentdb: tenant {tenant_id} not found", entity="tenant", tenant_id=tenant_id,
            id=tenant_id,
        )  # fmt: skip
    if sqlstate == "23503":
        return TenantMismatch(message, sqlstate=sqlstate, constraint=constraint)
    if sqlstate == "23505":
        return DuplicateKey(message, sqlstate=sqlstate, constraint=constraint)
    if sqlstate == "23514" and constraint in _ERROR_OF:
        return _ERROR_OF[constraint](message, sqlstate=sqlstate, constraint=constraint)
    if sqlstate.startswith("23"):
        return InvariantViolation(message, sqlstate=sqlstate, constraint=constraint)
    return None
