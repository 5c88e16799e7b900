"""What the console's pictures are drawn from (agentdb.overview): the last hour's throughput
and backlog per tenant, budget use per tenant - counted from the rows, one tenant at a
time, and run as ``agentdb_operator`` blind to every other tenant (G15)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import asyncpg

from agentdb import budgets, leases, operations, outbox, overview, steps, tasks, tenancy
from agentdb.tools.console.pages import budget_bar, chart
from tests import factories as F
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


async def _asleep_on_approval(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str) -> uuid.UUID:
    """A task that recorded a step, an ask ("approve/asked") and the wait ("approve"), then
    went to sleep on signal "approval" - what an agent framework adapter leaves behind."""
    recorded = (
        ("fetch", "step", '{"rows": 3}'),
        ("approve/asked", "step", '{"tool": "refund"}'),
        ("approve", "signal", None),
    )
    return await _asleep_with(pool, tenant, task_type, "w-approvals", recorded)


async def test_G22_approvals_show_each_waiting_task_once_with_its_ask_and_last_step(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """One row per task asleep on a signal: its waiting step, the ask recorded beside it
    and the last step before it. A task not waiting any more is not listed. Kills generated
    ``gen-overview-overview_approvals-and-7`` (the ask joined to any step of the task: a
    row per step), ``gen-overview-overview_approvals-cmp-4`` (the waiting step looked for
    in other tenants: no step, no ask) and ``gen-overview-overview_approvals-cmp-16``
    (tasks that are not waiting listed instead)."""
    waiting = await _asleep_on_approval(pool, tenants.a, "refund")
    woken = await _asleep_on_approval(pool, tenants.a, "refund-woken")
    await tasks.signal(pool, tenants.a, woken, "approval")  # wakes it: pending, not waiting
    assert (await tasks.get(pool, tenants.a, woken)).state == "pending"
    await _asleep_on_approval(pool, tenants.b, "refund")  # another tenant's

    rows = await overview.approvals(pool, tenants.a)
    assert [(r["id"], r["wait_signal"], r["step"]) for r in rows] == [
        (str(waiting), "approval", "approve")
    ]
    [row] = rows
    assert row["asked"] == {"tool": "refund"}
    assert (row["last_step"], row["last_result"]) == ("fetch", {"rows": 3})
    assert row["lease_holders"] == ["w-approvals"]


async def _asleep_with(
    pool: asyncpg.Pool,
    tenant: uuid.UUID,
    task_type: str,
    owner: str,
    recorded: tuple[tuple[str, str, str | None], ...],
    task_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """A task that recorded ``recorded`` in order - ``(name, kind, result)``, a step with
    no result left waiting (a sleep of 0 s: over at once, and its row stays waiting) -
    then went to sleep on signal "approval"."""
    task = await tasks.create(pool, tenant, task_type, task_id=task_id)
    [held] = await leases.claim(pool, owner, task_types=[task_type])
    assert held.lease is not None
    for name, kind, result in recorded:
        await steps.record(
            pool, tenant, task.id, name, kind=kind, input_hash=F.HASH, result=result,
            lease=held.lease, waiting=result is None,
            wait=timedelta(0) if kind == "sleep" else None,
        )  # fmt: skip
    await tasks.wait_for_signal(pool, held, "approval", lease=held.lease)
    return task.id


async def test_G22_approvals_name_the_newest_waiting_signal_step_whatever_else_is_recorded(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The step a task waits on is its newest step of kind signal still waiting - not a
    sleep recorded after it (a sleep's row stays waiting once it is over: no write says it
    ended), not a signal step taken after it (done) - and a task that left an earlier wait
    open (its handler changed between attempts) is still one row. Kills generated
    ``gen-overview-overview_approvals-and-4`` (any kind: the sleep), ``-and-5`` (any
    state: the taken signal) and ``-int-1`` (two waiting steps, two rows); each row names
    its own holder - ``-and-1`` (every claimer of the tenant's tasks named)."""
    ask = ("approve", "signal", None)
    recorded = {
        "ap-slept": (ask, ("cool-off", "sleep", None)),
        "ap-took": (ask, ("got-note", "signal", '{"note": 1}')),
        "ap-left-open": (("old-ask", "signal", None), ask),
    }
    ids = {
        str(await _asleep_with(pool, tenants.a, kind, f"w-{kind}", steps_)): kind
        for kind, steps_ in recorded.items()
    }
    rows = await overview.approvals(pool, tenants.a)
    assert sorted((ids[r["id"]], r["step"], tuple(r["lease_holders"])) for r in rows) == sorted(
        (kind, "approve", (f"w-{kind}",)) for kind in recorded
    )


async def test_G2_approvals_of_a_task_read_its_own_tenant_s_rows_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Task ids are unique per tenant only (agent_tasks_pkey is (tenant_id, id)) and
    create takes the caller's: tenant b's task of the same id, asleep on the same signal
    with newer rows of the same names - its own holder, last step, ask and a newer wait -
    changes nothing in a's page, and is not on it. Kills generated
    ``gen-overview-overview_approvals-tenant-1`` (b's holder named), ``-tenant-2`` (b's
    wait step), ``-tenant-3`` (b's ask joined too: two rows), ``-tenant-4`` (b's last
    step) and ``-tenant-5`` (b's task listed); and, with a's two steps, ``-int-3`` (the
    last two steps: two rows) and ``-cmp-12`` (the last step of another task: a has none)."""
    mine = await _asleep_with(
        pool, tenants.a, "ap-mine", "w-a",
        (("plan", "step", '{"pages": 2}'), ("fetch", "step", '{"rows": 3}'),
         ("approve/asked", "step", '{"tool": "refund"}'), ("approve", "signal", None)),
    )  # fmt: skip
    await _asleep_with(
        pool, tenants.b, "ap-twin", "w-b",
        (("fetch", "step", '{"rows": 9}'), ("approve/asked", "step", '{"tool": "wire"}'),
         ("approve-b", "signal", None)),
        task_id=mine,
    )  # fmt: skip
    [row] = await overview.approvals(pool, tenants.a)
    assert (row["id"], row["step"], row["asked"]) == (str(mine), "approve", {"tool": "refund"})
    assert (row["last_step"], row["last_result"]) == ("fetch", {"rows": 3})
    assert row["lease_holders"] == ["w-a"]


async def test_G13_unsettled_pairs_each_effect_with_its_own_tasks_lease(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """An effect is the operator's to reconcile when its own task holds no live lease: one
    of a pending task is listed, one of a task running under a live lease is not. Kills
    generated ``gen-overview-overview_unsettled-cmp-2`` (each effect judged by the other
    tasks' leases)."""
    idle = await tasks.create(pool, tenants.a, "idle")
    await operations.reserve(pool, tenants.a, idle.id, "k-idle", "psp.charge", {})
    busy = await tasks.create(pool, tenants.a, "busy")
    [held] = await leases.claim(pool, "w1", task_types=["busy"])
    assert held.id == busy.id
    await operations.reserve(pool, tenants.a, busy.id, "k-busy", "psp.charge", {}, lease=held.lease)

    listed = await overview.unsettled(pool, tenants.a)
    assert [(r["task_id"], r["idempotency_key"]) for r in listed] == [(str(idle.id), "k-idle")]


async def test_G13_unsettled_lists_an_effect_in_every_unsettled_state(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Reserved, in flight and unknown are each an effect whose outcome the operator must
    find out (nothing holds the task); a succeeded one is settled and not listed. Kills
    generated ``gen-overview-overview_unsettled-list-2`` (an effect in flight left out:
    the call that crashed mid-flight, the likeliest to have happened, never shown)."""
    idle = await tasks.create(pool, tenants.a, "idle")
    ops = {
        key: (await operations.reserve(pool, tenants.a, idle.id, key, "psp.charge", {})).operation
        for key in ("k-reserved", "k-in-flight", "k-unknown", "k-succeeded")
    }
    await operations.start(pool, ops["k-in-flight"])
    await operations.mark_unknown(pool, ops["k-unknown"], error="timeout")
    await operations.complete(pool, ops["k-succeeded"], result={})

    listed = await overview.unsettled(pool, tenants.a)
    assert {r["idempotency_key"]: r["state"] for r in listed} == {
        "k-reserved": "reserved",
        "k-in-flight": "in_flight",
        "k-unknown": "unknown",
    }


async def test_G2_G13_an_effect_is_judged_by_its_own_tenant_s_task_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Task ids are the caller's: tenant b has an idle task of the same id as a's, which
    runs under a live lease with its effect in flight. a's effect is its worker's, not the
    operator's: not listed. Kills generated ``gen-overview-overview_unsettled-tenant-1``
    (the task joined by id alone: a's effect judged by b's idle twin, and listed)."""
    mine = await tasks.create(pool, tenants.a, "busy")
    [held] = await leases.claim(pool, "w1", task_types=["busy"])
    assert (held.tenant_id, held.id) == (tenants.a, mine.id)
    await operations.reserve(pool, tenants.a, mine.id, "k-mine", "psp.charge", {}, lease=held.lease)
    await tasks.create(pool, tenants.b, "idle", task_id=mine.id)

    assert await overview.unsettled(pool, tenants.a) == []


async def test_G13_an_effect_whose_task_s_lease_ends_this_instant_is_listed(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A lease is live until its expiry, not at it (as the claim's recovery reads it: a
    lease that expires at now() is taken over): an effect of a task whose lease ends this
    very instant is the operator's to reconcile. In one transaction, where now() stands
    still. Kills generated ``gen-overview-overview_unsettled-cmp-5`` (``>=``)."""
    await tasks.create(pool, tenants.a, "ending")
    [held] = await leases.claim(pool, "w1", task_types=["ending"])
    await operations.reserve(pool, tenants.a, held.id, "k-end", "psp.charge", {}, lease=held.lease)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # the lease runs out, to this very instant
        await admin_conn.execute(
            "UPDATE agent_tasks SET lease_expires_at = now() WHERE id = $1", held.id
        )
        listed = await overview.unsettled(admin_conn, tenants.a)
    assert [r["idempotency_key"] for r in listed] == ["k-end"]


async def test_G2_a_timeline_shows_only_its_tenants_events_of_a_shared_task_id(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Task ids are the caller's: two tenants may both use one. A tenant's timeline of it
    shows that tenant's events only. Kills generated
    ``gen-overview-overview_task_events-tenant-1`` (every tenant's events of that id read)."""
    shared = uuid.uuid4()
    await tasks.create(pool, tenants.a, "job", task_id=shared)
    other = await tasks.create(pool, tenants.b, "job", task_id=shared)
    await tasks.transition(
        pool, tenants.b, shared, expected_version=other.state_version, to_state="cancelled"
    )

    a = await overview.timeline(pool, tenants.a, shared)
    assert [(e["event_type"], e["to_state"]) for e in a.events] == [("task.created", "pending")]
    b = await overview.timeline(pool, tenants.b, shared)
    assert [e["to_state"] for e in b.events] == ["pending", "cancelled"]


async def test_G2_a_timeline_shows_only_its_tenants_steps_of_a_shared_task_id(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Both tenants' tasks of one id recorded steps: each tenant's timeline of it shows its
    own, in order. Kills generated ``gen-overview-overview_task_steps-tenant-1`` (every
    tenant's steps of that id read)."""
    shared = await _asleep_with(
        pool, tenants.a, "st-a", "w-a", (("plan", "step", '{"n": 1}'), ("act", "step", "{}"))
    )
    await _asleep_with(
        pool, tenants.b, "st-b", "w-b", (("fetch", "step", '{"n": 2}'),), task_id=shared
    )
    a = await overview.timeline(pool, tenants.a, shared)
    assert [s["name"] for s in a.steps] == ["plan", "act"]
    b = await overview.timeline(pool, tenants.b, shared)
    assert [s["name"] for s in b.steps] == ["fetch"]


async def test_G2_a_task_s_timeline_shows_its_own_effects(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Kills generated ``gen-overview-overview_task_operations-and-1`` (every effect of the
    tenant on each task's page)."""
    mine = await tasks.create(pool, tenants.a, "job")
    other = await tasks.create(pool, tenants.a, "job")
    ops = {}
    for task in (mine, other):
        ops[task.id] = (
            await operations.reserve(pool, tenants.a, task.id, f"k-{task.id}", "send", {})
        ).operation.id
    page = await overview.timeline(pool, tenants.a, mine.id)
    assert [e["id"] for e in page.effects] == [str(ops[mine.id])]


async def test_G2_activity_counts_an_event_in_its_own_minute_only(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task created two minutes ago counts in that minute, not in each minute after it.
    Kills generated ``gen-overview-overview_activity-and-1`` (a minute counting every event
    before its end)."""
    task = await tasks.create(pool, tenants.a, "job")
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the append-only guard is off
        await admin_conn.execute(
            "UPDATE agent_events SET created_at = created_at - interval '2 minutes'"
            " WHERE task_id = $1",
            task.id,
        )
    points = await overview.activity(pool, tenants.a, minutes=5)
    assert [p.created for p in points].count(1) == 1
    assert sum(p.created for p in points) == 1


async def test_G10_G22_the_outbox_page_lists_its_state_and_a_timeline_its_own_signals(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The outbox page of dead messages lists the dead one, not the pending one beside it;
    a task's timeline lists its own tenant's signals, not those of b's task of the same id.
    Kills generated ``gen-overview-overview_outbox-cmp-2`` (``state <> $2``) and
    ``gen-overview-overview_task_signals-cmp-1`` (``tenant_id <> $1``)."""
    from agentdb import outbox

    async with pool.acquire() as conn:
        dead = await outbox.enqueue(conn, tenants.a, "t.dead", {}, max_attempts=1)
        await outbox.enqueue(conn, tenants.a, "t.later", {})
    [claimed] = [m for m in await outbox.claim(pool, "relay", batch=10) if m.id == dead]
    await outbox.mark_failed(pool, claimed, "gone", backoff=timedelta(0))
    assert [r["id"] for r in await overview.outbox(pool, tenants.a, state="dead")] == [str(dead)]
    task = await tasks.create(pool, tenants.a, "job")
    await tasks.create(pool, tenants.b, "job", task_id=task.id)
    for tenant, name in ((tenants.a, "mine"), (tenants.b, "theirs")):
        await tasks.signal(pool, tenant, task.id, name)
    page = await overview.timeline(pool, tenants.a, task.id)
    assert [s["name"] for s in page.signals] == ["mine"]


async def test_G2_the_task_list_is_its_tenant_s_tasks_only(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenant a's list shows a's two tasks, in any state and in the state asked for; b's
    task is b's list alone. Kills generated ``gen-overview-overview_task_list-cmp-1`` (the
    tenant compared with ``<>``: every other tenant's tasks listed)."""
    mine = [str((await tasks.create(pool, tenants.a, "job", params={"n": n})).id) for n in range(2)]
    await tasks.transition(
        pool, tenants.a, uuid.UUID(mine[1]), expected_version=0, to_state="cancelled"
    )
    theirs = str((await tasks.create(pool, tenants.b, "job", params={"n": "b"})).id)
    assert sorted(r["id"] for r in await overview.task_list(pool, tenants.a)) == sorted(mine)
    cancelled = await overview.task_list(pool, tenants.a, state="cancelled")
    assert [r["id"] for r in cancelled] == [mine[1]]
    assert [r["id"] for r in await overview.task_list(pool, tenants.b)] == [theirs]


async def test_G2_a_timeline_shows_only_its_tenants_messages_of_a_shared_task_id(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Both tenants' tasks of one id sent a message: each tenant's timeline of it shows its
    own. Kills generated ``gen-overview-overview_task_outbox-tenant-1`` (every tenant's
    messages of that id read)."""
    shared = uuid.uuid4()
    for tenant, topic in ((tenants.a, "a.sent"), (tenants.b, "b.sent")):
        await tasks.create(pool, tenant, "job", task_id=shared)
        async with pool.acquire() as conn:
            await outbox.enqueue(conn, tenant, topic, {}, task_id=shared)
    a = await overview.timeline(pool, tenants.a, shared)
    assert [m["topic"] for m in a.messages] == ["a.sent"]
    b = await overview.timeline(pool, tenants.b, shared)
    assert [m["topic"] for m in b.messages] == ["b.sent"]


async def test_G2_activity_counts_an_event_made_at_the_instant_its_minute_starts(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task created at the very start of a minute counts in that minute (``>=``). Kills
    generated ``gen-overview-overview_activity-cmp-3`` (``>``: counted in no minute)."""
    task = await tasks.create(pool, tenants.a, "job")
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the append-only guard is off
        await admin_conn.execute(
            "UPDATE agent_events SET created_at = date_trunc('minute', now())"
            " - interval '2 minutes' WHERE task_id = $1",
            task.id,
        )
    points = await overview.activity(pool, tenants.a, minutes=5)
    assert sum(p.created for p in points) == 1


async def test_G2_G13_the_unsettled_effects_are_the_tenant_s_own(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Both tenants have an effect left reserved: each tenant's page lists its own. Kills
    generated ``gen-overview-overview_unsettled-tenant-2`` (every tenant's listed)."""
    for tenant, action in ((tenants.a, "send-a"), (tenants.b, "send-b")):
        task = await tasks.create(pool, tenant, "job")
        await operations.reserve(pool, tenant, task.id, "k", action, {})
    assert [r["action"] for r in await overview.unsettled(pool, tenants.a)] == ["send-a"]
    assert [r["action"] for r in await overview.unsettled(pool, tenants.b)] == ["send-b"]
