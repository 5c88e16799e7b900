"""What the console's pictures are drawn from (agentdb.overview): the last hour's throughput
and backlog per tenant, budget use per tenant - counted from the rows, one tenant at a
time, and run as ``agentdb_operator`` blind to every other tenant (G15)."""

from __future__ import annotations

import re
import uuid

import asyncpg

from agentdb import budgets, leases, operations, overview, tasks, tenancy
from agentdb.tools.console.pages import budget_bar, chart
from tests.conftest import OPERATOR, Database, Tenants


async def _finish_one(pool: asyncpg.Pool) -> None:
    [claimed] = await leases.claim(pool, "w1", task_types=["job"], batch=1)
    await tasks.transition(
        pool, claimed.tenant_id, claimed.id, expected_version=claimed.state_version,
        to_state="succeeded", lease=claimed.lease,
    )  # fmt: skip


async def test_G2_activity_counts_one_tenants_creations_finishes_and_backlog(
    pool: asyncpg.Pool, tenants: Tenants, db: Database
) -> None:
    for n in range(3):
        await tasks.create(pool, tenants.a, "job", params={"n": n})
    await tasks.create(pool, tenants.b, "other", params={"n": "b"})  # another tenant's
    await _finish_one(pool)

    points = await overview.activity(pool, tenants.a, minutes=5)
    assert len(points) == 5
    assert sum(p.created for p in points) == 3
    assert sum(p.finished for p in points) == 1
    assert points[-1].backlog == 2  # what is pending now
    assert points[0].backlog <= points[-1].backlog + 1  # worked back, never negative
    assert min(p.backlog for p in points) >= 0

    # As the console's role, scoped to tenant b: tenant a's rows are not there at all.
    conn = await db.connect(OPERATOR)
    try:
        async with tenancy.tenant_scope(conn, tenants.b) as scoped:
            blind = await overview.activity(scoped, tenants.a, minutes=5)
            own = await overview.activity(scoped, tenants.b, minutes=5)
    finally:
        await conn.close()
    assert sum(p.created for p in blind) == 0
    assert sum(p.created for p in own) == 1


async def test_G19_budget_use_shows_spent_held_and_limit_and_draws_them(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await budgets.set_budget(pool, tenants.a, "usd_micros", 10_000)
    task = (await tasks.create(pool, tenants.a, "llm", params={"k": uuid.uuid4().hex})).id
    done = await operations.reserve(
        pool, tenants.a, task, "k1", "charge", {}, cost={"usd_micros": 2_000}
    )
    await operations.complete(pool, done.operation, result={"ok": True}, cost={"usd_micros": 1_500})
    await operations.reserve(pool, tenants.a, task, "k2", "charge", {}, cost={"usd_micros": 3_000})

    [b] = await overview.budgets(pool, tenants.a)
    assert (b["unit"], b["limit"], b["spent"], b["held"]) == ("usd_micros", 10_000, 1_500, 3_000)
    assert await overview.budgets(pool, tenants.b) == []

    bar = budget_bar(b, width=200)
    widths = [float(w) for w in re.findall(r'<rect (?:x="[\d.]+" )?width="([\d.]+)"', bar)]
    assert widths == [200.0, 30.0, 60.0]  # the limit, spent 15 %, held 30 %
    assert "spent 1500 + held 3000 of 10000" in bar


async def test_the_chart_draws_one_bar_per_minute_scaled_to_the_busiest(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    for n in range(4):
        await tasks.create(pool, tenants.a, "job", params={"n": n})
    await _finish_one(pool)
    points = await overview.activity(pool, tenants.a, minutes=10)
    svg = chart(points)
    drawn = [tuple(map(int, m)) for m in re.findall(r"(\d+) finished, (\d+) created", svg)]
    assert len(drawn) == 10  # one bar per minute
    assert (sum(f for f, _ in drawn), sum(c for _, c in drawn)) == (1, 4)
    top = max(max(p.created, p.finished, p.backlog) for p in points)
    assert f"max {top}<" in svg  # the busiest value sets the scale
    assert chart([]) == ""


async def test_G2_a_task_that_ends_dead_or_cancelled_counts_as_finished(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Every end counts in the activity's "finished", not only success. Kills generated
    ``gen-overview-overview_activity-list-4`` ('dead' left out)."""
    for end in ("dead", "cancelled"):
        task = await tasks.create(pool, tenants.a, "job", params={"end": end})
        await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state=end)
    points = await overview.activity(pool, tenants.a, minutes=5)
    assert sum(p.finished for p in points) == 2
