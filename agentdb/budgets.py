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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agentdb import _db
from agentdb._citus import routed
from agentdb._citus.routing import distributed, twin
from agentdb._db.jsonb import EVENT_PAYLOAD_CAP, document
from agentdb.errors import AgentDBError, BudgetExceeded, ConfigurationError, RateLimited
from agentdb.models import Operation

__all__ = [
    "PERIODS",
    "Budget",
    "Cost",
    "RateLimit",
    "cost_args",
    "hold_retry",
    "list_budgets",
    "list_rate_limits",
    "refusal",
    "set_budget",
    "set_global_rate_limit",
    "set_rate_limit",
]

_Q = _db.queries(__name__)
#: The windows a budget can have: its whole life, a UTC day, a UTC month.
PERIODS = ("total", "day", "month")
_INT4_MAX = 2**31 - 1


#: A cost in named units (G19): ``{"tokens": 8000, "usd_micros": 1200}``.
Cost = Mapping[str, int]
# The unit format of agent_budgets_unit_valid; amounts fit a bigint with room to add.
_UNIT = re.compile(r"[a-z][a-z0-9_]{0,62}")
_MAX_AMOUNT = 2**62


def cost_args(cost: Cost | None) -> dict[str, list[Any] | None]:
    """The ``units`` / ``amounts`` parameters of a cost (both ``None`` for none).

    Raises:
        ConfigurationError: a unit is not a lower-case identifier, or an amount
            is not a non-negative integer.
    """
    if cost is None:
        return {"units": None, "amounts": None}
    units: list[str] = []
    amounts: list[int] = []
    # Sorted: the reserve locks the budgets in its units' order, and two
    # reservations naming the same units must take those locks in one order.
    for unit, amount in sorted(cost.items(), key=lambda item: str(item[0])):
        if not isinstance(unit, str) or _UNIT.fullmatch(unit) is None:
            raise ConfigurationError(f"cost unit {unit!r} is not a lower-case identifier")
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise ConfigurationError(f"cost of {unit!r} must be an integer, not {amount!r}")
        if not 0 <= amount < _MAX_AMOUNT:
            raise ConfigurationError(f"cost of {unit!r} must be between 0 and 2**62, not {amount}")
        units.append(unit)
        amounts.append(amount)
    return {"units": units, "amounts": amounts}


def _usable(db: _db.Executor) -> bool:
    """Whether ``db`` can still run statements after a refusal: not a connection
    whose (caller's) transaction the refused statement aborted."""
    if _db.is_pool(db):
        return True
    return not _db.raw_connection(db).is_in_transaction()  # type: ignore[arg-type]


async def refusal(
    db: _db.Executor,
    refused: BudgetExceeded | RateLimited,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    idempotency_key: str,
    action: str,
    cost: Cost | None,
    actor: str,
    ids: tuple[str | None, str | None],
) -> AgentDBError:
    """The refusal with what the caller needs to know (what is left, when to retry),
    after writing its event (G19). Inside a caller's transaction, which the refusal
    aborted, nothing more can be read or written: the bare refusal is returned."""
    if not _usable(db):
        return refused
    sqlstate, constraint = refused.sqlstate, refused.constraint
    payload: dict[str, Any] = {"action": action, "idempotency_key": idempotency_key}
    out: BudgetExceeded | RateLimited
    if isinstance(refused, BudgetExceeded):
        requested = dict(cost or {})
        rows = await _db.fetch_many(
            db, _Q["budget_left"], tenant_id=tenant_id, task_id=task_id,
            units=list(requested),
        )  # fmt: skip
        remaining: dict[str, int] = {}
        for r in rows:
            remaining[r["unit"]] = min(r["remaining"], remaining.get(r["unit"], r["remaining"]))
        out = BudgetExceeded(
            f"reserving {requested} for {action!r} would exceed the budget; "
            f"remaining: {remaining}",
            sqlstate=sqlstate, constraint=constraint, requested=requested, remaining=remaining,
        )  # fmt: skip
        payload.update(reason="budget", requested=requested, remaining=remaining)
    else:
        rows = await _db.fetch_many(db, _Q["rate_window"], tenant_id=tenant_id, action=action)
        if not await distributed(db):  # no global limits on Citus (sql/migrations/0009)
            rows += await _db.fetch_many(db, _Q["global_rate_window"], action=action)
        ends = [r["retry_after"] for r in rows]
        retry_after = max(ends) if ends else datetime.now(UTC)
        out = RateLimited(
            f"{action!r} is over its rate limit until {retry_after.isoformat()}",
            sqlstate=sqlstate, constraint=constraint, action=action, retry_after=retry_after,
        )  # fmt: skip
        payload.update(reason="rate_limit", retry_after=retry_after.isoformat())
    event = {
        "tenant_id": tenant_id, "task_id": task_id, "actor_id": actor,
        "payload": document(payload, cap=EVENT_PAYLOAD_CAP, what="refusal event"),
        "trace_id": ids[0], "span_id": ids[1],
    }  # fmt: skip
    await _refusal_event(db, event)
    return out


async def _refusal_event_routed(db: _db.Executor, event: dict[str, Any]) -> None:
    """The refusal's event on Citus: the task read, then one row of VALUES (budget_refused_row
    says why)."""
    async with _db.transaction(db) as conn:
        task = await _db.fetch_optional(
            conn, _Q["budget_refused_task"], tenant_id=event["tenant_id"], id=event["task_id"]
        )
        if task is not None:
            await _db.execute_rows(
                conn, _Q["budget_refused_row"], policy_version=task["workflow_version"], **event
            )


@twin(_refusal_event_routed)
async def _refusal_event(db: _db.Executor, event: dict[str, Any]) -> None:
    """The refusal's event, with its task's workflow version, in one statement."""
    await _db.execute_rows(db, _Q["budget_refused"], **event)


async def hold_retry(conn: _db.Executor, op: Operation, cost: Cost) -> None:
    """Hold ``cost`` for the next attempt of the failed operation ``op`` on the budgets
    covering it, inside the caller's transaction (which then re-arms it).

    Raises:
        BudgetExceeded: a budget has no room (the caller's transaction is lost).
        ConfigurationError: ``cost`` is malformed.
    """
    await _hold(conn, op, cost_args(cost))


@twin(routed.hold_retry)
async def _hold(conn: _db.Executor, op: Operation, costed: dict[str, list[Any] | None]) -> None:
    """The next attempt's holds, with their budgets, in one statement."""
    await _db.fetch_many(conn, _Q["budget_hold"], tenant_id=op.tenant_id,
                         operation_id=op.id, attempt=op.attempts + 1, **costed)  # fmt: skip


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
        NotFound: no such tenant (``entity`` ``"tenant"``).
        TenantMismatch: no such task in the tenant.
    """
    if not isinstance(unit, str) or _UNIT.fullmatch(unit) is None:
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
        NotFound: no such tenant (``entity`` ``"tenant"``).
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
    if await distributed(db):
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
    if include_global and not await distributed(db):
        rows += await _db.fetch_many(db, _Q["global_rate_limit_list"])
    return [RateLimit.from_record(r) for r in rows]
