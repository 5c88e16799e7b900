"""Budgets and rate limits on Citus (G19): a costed reservation, its settlement and a
refusal each commit on the tenant's worker without two-phase commit; the limit holds
under racing connections; global rate limits are refused with a clear line."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from datetime import timedelta

import asyncpg
import pytest

from agentdb import budgets, leases, operations, tasks
from agentdb.errors import BudgetExceeded, ConfigurationError, RateLimited
from agentdb.models import Operation, Reservation
from tests.citus.conftest import Cluster, Three
from tests.citus.test_citus import NIL, _begins, _remote, _two_phase
from tests.test_budgets import budgets_lock_before_rate_limits


async def test_G19_costed_reserve_settle_and_refusal_commit_on_one_worker(
    conn: asyncpg.Connection, three: Three
) -> None:
    await budgets.set_budget(conn, three.x, "tokens", 10_000)
    await tasks.create(conn, three.x, "llm-cycle")
    [held] = await leases.claim(conn, "w1", batch=1, task_types=["llm-cycle"], after_tenant=NIL)
    lease = held.lease
    assert lease is not None
    res, cmds = await _remote(
        conn,
        lambda: operations.reserve(
            conn, three.x, held.id, "call-1", "llm", {"p": 1}, lease=lease,
            cost={"tokens": 8_000},
        ),
    )  # fmt: skip
    assert res.fresh
    assert (_two_phase(cmds), _begins(cmds)) == (0, 1), cmds
    with pytest.raises(BudgetExceeded) as refused:
        await _remote(
            conn,
            lambda: operations.reserve(
                conn, three.x, held.id, "call-2", "llm", {"p": 2}, lease=lease,
                cost={"tokens": 3_000},
            ),
        )  # fmt: skip
    assert refused.value.remaining == {"tokens": 2_000}
    done, cmds = await _remote(
        conn, lambda: operations.complete(conn, res.operation, cost={"tokens": 5_000}, lease=lease)
    )
    assert done.state == "succeeded"
    assert (_two_phase(cmds), _begins(cmds)) == (0, 1), cmds
    [b] = await budgets.list_budgets(conn, three.x)
    assert (b.spent, b.held) == (5_000, 0)
    again = await operations.reserve(
        conn, three.x, held.id, "call-2", "llm", {"p": 2}, lease=lease, cost={"tokens": 3_000}
    )
    failed, cmds = await _remote(
        conn, lambda: operations.fail(conn, again.operation, "503", lease=lease)
    )
    assert failed.state == "failed"
    assert (_two_phase(cmds), _begins(cmds)) == (0, 1), cmds
    [b] = await budgets.list_budgets(conn, three.x)
    assert (b.spent, b.held) == (5_000, 0)
    events = await conn.fetch(
        "SELECT event_type, payload FROM agent_events WHERE tenant_id = $1 AND task_id = $2"
        " AND event_type LIKE 'operation.%' ORDER BY id",
        three.x, held.id,
    )  # fmt: skip
    assert [e["event_type"] for e in events] == [
        "operation.reserved", "operation.refused", "operation.succeeded", "operation.reserved",
        "operation.failed",
    ]  # fmt: skip


async def test_G19_racing_reservations_never_overspend_on_citus(
    citus: Cluster, conn: asyncpg.Connection, three: Three
) -> None:
    await budgets.set_budget(conn, three.y, "tokens", 5_000)
    task_ids = [(await tasks.create(conn, three.y, "llm", params={"i": i})).id for i in range(20)]
    conns = [await asyncpg.connect(citus.dsn) for _ in range(20)]
    try:

        async def one(i: int) -> Operation | BudgetExceeded:
            try:
                res = await operations.reserve(
                    conns[i], three.y, task_ids[i], f"k{i}", "llm", {}, cost={"tokens": 1_000}
                )
            except BudgetExceeded as exc:
                return exc
            return res.operation

        results = await asyncio.gather(*(one(i) for i in range(20)))
    finally:
        for c in conns:
            await c.close()
    assert sum(isinstance(r, Operation) for r in results) == 5
    [b] = await budgets.list_budgets(conn, three.y)
    assert (b.spent, b.held, b.limit) == (0, 5_000, 5_000)


async def test_G19_rate_limits_are_per_tenant_on_citus(
    conn: asyncpg.Connection, three: Three
) -> None:
    await budgets.set_rate_limit(conn, three.z, "chat", 2, timedelta(hours=1))
    task = (await tasks.create(conn, three.z, "chat")).id
    for key in ("c0", "c1"):

        def call(key: str = key) -> Awaitable[Reservation]:
            return operations.reserve(conn, three.z, task, key, "chat", {})

        _, cmds = await _remote(conn, call)
        assert _two_phase(cmds) == 0, cmds
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(conn, three.z, task, "c2", "chat", {})
    assert refused.value.retry_after is not None
    # A global limit would be one row every tenant's reservation locks: refused here.
    with pytest.raises(ConfigurationError, match="not available on Citus"):
        await budgets.set_global_rate_limit(conn, "chat", 5, timedelta(minutes=1))
    with pytest.raises(asyncpg.CheckViolationError) as raw:
        await conn.execute(
            "INSERT INTO agent_global_rate_limits (action, max_calls, per)"
            " VALUES ($1, 1, interval '1 minute')",
            f"x-{uuid.uuid4().hex[:6]}",
        )
    assert raw.value.constraint_name == "agent_global_rate_limits_local_only"


async def test_G19_a_routed_reservation_locks_budgets_before_rate_limits(
    citus: Cluster, conn: asyncpg.Connection, three: Three
) -> None:
    """The routed reservation inserts its operation (whose trigger locks the rate
    limit) in a statement of its own: it locks the budgets first."""
    hold, probe = await asyncpg.connect(citus.dsn), await asyncpg.connect(citus.dsn)
    try:
        await budgets_lock_before_rate_limits(
            hold, conn, probe, three.x, "SELECT count(*) > 0 FROM citus_lock_waits"
        )
    finally:
        await hold.close()
        await probe.close()
