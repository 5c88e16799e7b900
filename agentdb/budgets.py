"""Spend budgets and provider rate limits, refused by the database at reserve (G19).

Set them here; :func:`agentdb.operations.reserve` with ``cost=...`` holds an
estimate against every budget of its units in the same statement as the
operation, and every reservation counts against its action's rate limits::

    await budgets.set_budget(pool, tenant, "tokens", 100_000, period="day")
    await budgets.set_rate_limit(pool, tenant, "openai.chat", 60, timedelta(minutes=1))
    res = await operations.reserve(pool, tenant, task, key, "openai.chat", req,
                                   cost={"tokens": 8000})        # BudgetExceeded, RateLimited
    ...                                                          # call, no transaction open
    await operations.complete(pool, res.operation, cost={"tokens": 5321})  # spend, release rest

The limit itself is a CHECK (``spent + held <= limit_amount``) on the budget
row, so it also holds for hand-written SQL.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from agentdb import _db, schema
from agentdb.errors import ConfigurationError

__all__ = [
    "PERIODS",
    "Budget",
    "RateLimit",
    "list_budgets",
    "list_rate_limits",
    "set_budget",
    "set_global_rate_limit",
    "set_rate_limit",
]

_Q = _db.queries(__name__)
#: The windows a budget can have: its whole life, a UTC day, a UTC month.
PERIODS = ("total", "day", "month")
_UNIT = re.compile(r"[a-z][a-z0-9_]{0,62}")
_INT4_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget and its books now: ``spent + held <= limit`` always."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    task_id: uuid.UUID | None
    unit: str
    period: str
    limit: int
    spent: int
    held: int
    window_start: datetime

    @property
    def remaining(self) -> int:
        """What a reservation may still hold."""
        return self.limit - self.spent - self.held

    @classmethod
    def from_record(cls, r: _db.Record) -> Budget:
        return cls(
            r["id"], r["tenant_id"], r["task_id"], r["unit"], r["period"],
            r["limit_amount"], r["spent"], r["held"], r["window_start"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One rate limit: ``max_calls`` per window of ``per``; ``tenant_id`` None: global."""

    tenant_id: uuid.UUID | None
    action: str
    max_calls: int
    per: timedelta
    used: int
    window_start: datetime

    @classmethod
    def from_record(cls, r: _db.Record) -> RateLimit:
        return cls(
            r["tenant_id"], r["action"], r["max_calls"], r["per"], r["used"], r["window_start"]
        )


async def set_budget(
    db: _db.Executor,
    tenant_id: uuid.UUID,
    unit: str,
    limit: int,
    *,
    period: str = "total",
    task_id: uuid.UUID | None = None,
) -> Budget:
    """Set (or change) the tenant's budget in ``unit``; with ``task_id``, one task's budget.

    Reservations of that unit are then held against it (and against the
    tenant's, for a task budget): whichever is tighter refuses.

    Raises:
        ConfigurationError: a malformed unit, a negative or non-integer limit,
            an unknown period.
        BudgetExceeded: the new limit is below what is already spent and held.
        TenantMismatch: no such tenant (or task in it).
    """
    if _UNIT.fullmatch(unit) is None:
        raise ConfigurationError(f"budget unit {unit!r} is not a lower-case identifier")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**62:
        raise ConfigurationError(f"budget limit must be an integer >= 0, not {limit!r}")
    if period not in PERIODS:
        raise ConfigurationError(f"budget period must be one of {PERIODS}, not {period!r}")
    row = await _db.fetch_one(
        db, _Q["budget_set"], tenant_id=tenant_id, task_id=task_id, unit=unit,
        limit_amount=limit, period=period,
    )  # fmt: skip
    return Budget.from_record(row)


async def list_budgets(db: _db.Executor, tenant_id: uuid.UUID | None = None) -> list[Budget]:
    """The tenant's budgets (every tenant's with ``None``), with their books now."""
    rows = await _db.fetch_many(db, _Q["budget_list"], tenant_id=tenant_id)
    return [Budget.from_record(r) for r in rows]


def _check_limit(action: str, max_calls: int, per: timedelta) -> None:
    if not isinstance(action, str) or not 1 <= len(action) <= 200:
        raise ConfigurationError("rate limit action must be 1 to 200 characters")
    if isinstance(max_calls, bool) or not isinstance(max_calls, int):
        raise ConfigurationError(f"max_calls must be an integer, not {max_calls!r}")
    if not 0 <= max_calls <= _INT4_MAX:
        raise ConfigurationError(f"max_calls must be between 0 and {_INT4_MAX}")
    if not isinstance(per, timedelta) or per <= timedelta(0):
        raise ConfigurationError(f"the rate limit window must be a positive timedelta, not {per!r}")


async def set_rate_limit(
    db: _db.Executor, tenant_id: uuid.UUID, action: str, max_calls: int, per: timedelta
) -> RateLimit:
    """Allow the tenant at most ``max_calls`` operations of ``action`` per window of ``per``.

    Windows are aligned bins of ``per`` from 2000-01-01 UTC. A reservation
    over the limit raises :class:`~agentdb.errors.RateLimited`; ``0`` pauses
    the action.

    Raises:
        ConfigurationError: a malformed action, count or window.
        TenantMismatch: no such tenant.
    """
    _check_limit(action, max_calls, per)
    row = await _db.fetch_one(
        db, _Q["rate_limit_set"], tenant_id=tenant_id, action=action, max_calls=max_calls,
        per=per,
    )  # fmt: skip
    return RateLimit.from_record(row)


async def set_global_rate_limit(
    db: _db.Executor, action: str, max_calls: int, per: timedelta
) -> RateLimit:
    """:func:`set_rate_limit` across every tenant (a provider's own limit).

    Every reservation of ``action`` then locks the one global row: it
    serialises them, which is the point. On Citus that row would make every
    reservation a two-phase commit across nodes, so there are no global
    limits there: set one per tenant.

    Raises:
        ConfigurationError: on a distributed (Citus) schema; a malformed action,
            count or window.
    """
    _check_limit(action, max_calls, per)
    if await schema.distributed(db):
        raise ConfigurationError(
            "global rate limits are not available on Citus (every reservation would be a "
            "two-phase commit); set a rate limit per tenant instead"
        )
    row = await _db.fetch_one(
        db, _Q["global_rate_limit_set"], action=action, max_calls=max_calls, per=per
    )
    return RateLimit.from_record(row)


async def list_rate_limits(
    db: _db.Executor, tenant_id: uuid.UUID | None = None, *, include_global: bool = True
) -> list[RateLimit]:
    """The tenant's rate limits (every tenant's with ``None``), then the global ones."""
    rows = await _db.fetch_many(db, _Q["rate_limit_list"], tenant_id=tenant_id)
    if include_global and not await schema.distributed(db):
        rows += await _db.fetch_many(db, _Q["global_rate_limit_list"])
    return [RateLimit.from_record(r) for r in rows]
