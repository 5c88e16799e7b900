"""Leases (G12): claim with SKIP LOCKED, renew, release, and fencing of a taken-over holder."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import leases, operations, tasks
from agentdb.errors import ConfigurationError, LeaseLost
from agentdb.models import Task
from tests import factories as F
from tests.conftest import RUNTIME, Database, Tenants
from tests.test_fences import _hold


async def test_G12_claim_takes_a_lease_counts_an_attempt_and_writes_an_event(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "t", lease_ttl=timedelta(minutes=7))
    [claimed] = await leases.claim(pool, "w1")
    assert claimed.id == task.id
    assert (claimed.state, claimed.state_version, claimed.lease_token, claimed.attempts) == (
        "running",
        1,
        1,
        1,
    )
    assert claimed.lease is not None
    assert claimed.lease_expires_at is not None
    assert claimed.lease_acquired_at is not None
    assert claimed.lease_expires_at - claimed.lease_acquired_at == timedelta(minutes=7)
    ev = await admin_conn.fetchrow(
        "SELECT event_type, actor_id FROM agent_events"
        " WHERE task_id = $1 AND task_state_version = 1",
        task.id,
    )
    assert ev is not None
    assert (ev["event_type"], ev["actor_id"]) == ("task.claimed", "w1")


async def test_G12_concurrent_claimers_get_disjoint_tasks(db: Database, tenants: Tenants) -> None:
    seed = await db.connect("agentdb_test_runtime")
    try:
        for _ in range(20):
            await tasks.create(seed, tenants.a, "t")
    finally:
        await seed.close()
    conns = [await db.connect("agentdb_test_runtime") for _ in range(4)]
    try:
        batches = await asyncio.gather(
            *(leases.claim(c, f"w{i}", batch=5) for i, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    ids = [t.id for batch in batches for t in batch]
    assert len(ids) == 20
    assert len(set(ids)) == 20


async def test_G12_claim_respects_task_types_and_batch(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    for kind in ("a", "b", "a"):
        await tasks.create(pool, tenants.a, kind)
    got = await leases.claim(pool, "w", batch=5, task_types=["a"])
    assert sorted(t.task_type for t in got) == ["a", "a"]
    with pytest.raises(ConfigurationError):
        await leases.claim(pool, "w", batch=0)


async def test_G12_renew_extends_without_a_version_bump(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w1", lease_ttl=timedelta(seconds=30))
    assert claimed.lease is not None
    renewed = await leases.renew(pool, claimed.lease, lease_ttl=timedelta(minutes=10))
    assert renewed.expires_at > claimed.lease.expires_at
    now = await tasks.get(pool, tenants.a, claimed.id)
    assert (now.state_version, now.lease_token) == (claimed.state_version, claimed.lease_token)


async def test_G12_fenced_out_holder_changes_nothing(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The article's 'two workers on the same task': the stale one is refused everywhere."""
    task = await tasks.create(pool, tenants.a, "t")
    [first] = await leases.claim(pool, "w1")
    res = await operations.reserve(
        pool, tenants.a, task.id, "k1", "send", {"x": 1}, lease=first.lease
    )
    await F.expire_lease(admin_conn, task.id)
    [second] = await leases.claim(pool, "w2")
    assert (second.id, second.lease_token, second.attempts) == (task.id, 2, 2)
    before = await admin_conn.fetchrow("SELECT * FROM agent_tasks WHERE id = $1", task.id)
    events_before = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_events WHERE task_id = $1", task.id
    )

    assert first.lease is not None
    with pytest.raises(LeaseLost):
        await leases.renew(pool, first.lease)
    with pytest.raises(LeaseLost):
        await leases.release(pool, first.lease)
    with pytest.raises(LeaseLost):
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=second.state_version, to_state="succeeded",
            lease=first.lease,
        )  # fmt: skip
    with pytest.raises(LeaseLost):
        await operations.complete(pool, res.operation, result={"ok": True}, lease=first.lease)
    with pytest.raises(LeaseLost):
        await operations.reserve(
            pool, tenants.a, task.id, "k2", "send", {"x": 2}, lease=first.lease
        )

    assert await admin_conn.fetchrow("SELECT * FROM agent_tasks WHERE id = $1", task.id) == before
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_events WHERE task_id = $1", task.id)
        == events_before
    )
    assert (await operations.get(pool, tenants.a, res.operation.id)).state == "reserved"
    # The current holder's writes still land.
    assert second.lease is not None
    done = await operations.complete(pool, res.operation, result={"ok": True}, lease=second.lease)
    assert done.state == "succeeded"


async def test_G12_a_finished_task_is_never_leased_again(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    first = await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w1")
    assert claimed.id == first.id
    assert claimed.lease is not None
    await tasks.transition(
        pool, tenants.a, first.id, expected_version=claimed.state_version,
        to_state="succeeded", lease=claimed.lease,
    )  # fmt: skip
    second = await tasks.create(pool, tenants.a, "t")  # due after the finished one
    got = await leases.claim(pool, "w2", batch=5)
    assert [t.id for t in got] == [second.id]  # the positive control: the due one
    assert await leases.claim(pool, "w3", batch=5) == []
    assert (await tasks.get(pool, tenants.a, first.id)).state == "succeeded"


async def test_G12_release_makes_the_task_due_again_and_refund_keeps_attempts(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w1")
    assert claimed.lease is not None
    back = await leases.release(pool, claimed.lease, refund_attempt=True)
    assert (back.state, back.attempts) == ("pending", 0)
    [again] = await leases.claim(pool, "w2")
    assert (again.id, again.attempts, again.lease_token) == (task.id, 1, 2)


async def test_G12_a_release_gives_back_only_the_task_it_names(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """One worker holds two tasks of one tenant, each under its first lease token (1): the
    release of one must leave the other running under its lease. Fails on a release that
    matches the tenant, owner and token without the task's id (a generated mutant,
    leases-lease_release-and-3, survived every test before this one)."""
    first = await tasks.create(pool, tenants.a, "t")
    second = await tasks.create(pool, tenants.a, "t")
    held = await leases.claim(pool, "w1", batch=2)
    assert sorted(t.id for t in held) == sorted([first.id, second.id])
    assert {t.lease_token for t in held} == {1}
    mine = next(t for t in held if t.id == first.id)
    assert mine.lease is not None
    await leases.release(pool, mine.lease)
    rows = await admin_conn.fetch(
        "SELECT id, state, lease_owner FROM agent_tasks WHERE tenant_id = $1", tenants.a
    )
    by_id = {r["id"]: (r["state"], r["lease_owner"]) for r in rows}
    assert by_id == {first.id: ("pending", None), second.id: ("running", "w1")}


async def test_G12_release_after_the_last_attempt_is_dead_and_exhausted_expired_tasks_are_buried(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    one = await tasks.create(pool, tenants.a, "t", max_attempts=1)
    [claimed] = await leases.claim(pool, "w1")
    assert claimed.lease is not None
    assert (await leases.release(pool, claimed.lease, error="boom")).state == "dead"

    two = await tasks.create(pool, tenants.a, "t", max_attempts=1)
    [held] = await leases.claim(pool, "w1")
    assert held.id == two.id
    assert await leases.bury_exhausted(pool) == []  # the lease is live: never bury a working task
    await F.expire_lease(admin_conn, two.id)
    assert await leases.claim(pool, "w2") == []  # no attempts left: not reclaimed
    assert await leases.bury_exhausted(pool) == [(tenants.a, two.id)]
    assert (await tasks.get(pool, tenants.a, two.id)).state == "dead"
    assert one.id != two.id


async def test_G12_a_due_task_without_attempts_left_is_never_claimed_and_spoils_no_batch(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An operator lowered max_attempts below what a pending task already used: claiming it
    would break agent_tasks_attempts_valid for the whole batch. It waits to be buried."""
    spent = await tasks.create(pool, tenants.a, "t", max_attempts=3)
    await F.update_task(
        admin_conn, tenants.a, spent.id, state_version=1, attempts=2, max_attempts=2
    )
    fresh = await tasks.create(pool, tenants.a, "t")
    claimed = await leases.claim(pool, "w", batch=5)
    assert [t.id for t in claimed] == [fresh.id]
    assert await leases.bury_exhausted(pool) == [(tenants.a, spent.id)]
    assert (await tasks.get(pool, tenants.a, spent.id)).state == "dead"


async def _twins_held_by_one_owner(
    pool: asyncpg.Pool, tenants: Tenants, owner: str
) -> tuple[Task, Task]:
    """Tenant a's and tenant b's tasks of one id (ids are the caller's: create's
    ``task_id``), both claimed by ``owner``: the same id, owner and token (1)."""
    shared = uuid.uuid4()
    held = []
    for tenant in (tenants.a, tenants.b):
        kind = f"twin-{tenant.hex[:8]}"
        await tasks.create(pool, tenant, kind, task_id=shared)
        [claimed] = await leases.claim(pool, owner, task_types=[kind])
        held.append(claimed)
    a, b = held
    assert (a.id, a.lease_token) == (b.id, b.lease_token)
    return a, b


async def test_G2_G12_a_release_gives_back_its_own_tenant_s_task_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A release names its lease's tenant: tenant b's task of the same id, held by the same
    owner at the same token, stays running. Kills generated
    ``gen-leases-lease_release-tenant-1`` (both twins released)."""
    a, b = await _twins_held_by_one_owner(pool, tenants, "w")
    assert a.lease is not None
    released = await leases.release(pool, a.lease)
    assert released.state == "pending"
    assert (await tasks.get(pool, tenants.b, b.id)).state == "running"


async def test_G2_G12_the_lease_watch_asks_after_its_own_tenant_s_task_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A worker's lease watch asks which of its (tenant, task) pairs it still holds: tenant
    a's task, taken over by another worker, is no longer its - though it still holds b's
    task of the same id. Kills generated ``gen-leases-lease_held-and-1`` (the tenants not
    asked: b's row answers for a's task) and ``-cmp-1`` (``tenant_id <> ANY``)."""
    a, b = await _twins_held_by_one_owner(pool, tenants, "w")
    for twin in (a, b):
        await F.expire_lease(admin_conn, twin.id, twin.tenant_id)
    [taken] = await leases.claim(pool, "w2", task_types=[a.task_type])
    assert (taken.tenant_id, taken.id) == (tenants.a, a.id)
    assert await leases.held(pool, "w", [(tenants.a, a.id)]) == {}
    # Control: b's, whose lease ran out but which nobody took over, is still w's.
    assert await leases.held(pool, "w", [(tenants.b, b.id)]) == {b.id: b.lease_token}


async def test_G6_a_task_put_back_on_its_last_attempt_is_buried_once_it_is_due(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A holder that puts its task back to pending with a back-off on the task's last
    attempt leaves a task no claim will take: the bury ends it - once it is due, not
    before. Kills generated ``gen-leases-lease_bury_exhausted-and-5`` (a pending or waiting
    task with its attempts used buried whether it is due or not)."""
    await tasks.create(pool, tenants.a, "last-try", max_attempts=1)
    [held] = await leases.claim(pool, "w", task_types=["last-try"])
    later = datetime.now(UTC) + timedelta(milliseconds=300)
    back = await tasks.transition(pool, tenants.a, held.id, expected_version=held.state_version,
                                  to_state="pending", wake_at=later, lease=held.lease)  # fmt: skip
    assert (back.state, back.attempts, back.max_attempts) == ("pending", 1, 1)
    assert await leases.bury_exhausted(pool) == []
    for _ in range(600):
        if await admin_conn.fetchval(
            "SELECT wake_at <= clock_timestamp() FROM agent_tasks WHERE id = $1", held.id
        ):
            break
        await asyncio.sleep(0.01)
    assert await leases.bury_exhausted(pool) == [(tenants.a, held.id)]


async def test_G6_a_bury_skips_an_exhausted_task_another_transaction_holds(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The bury takes what it can now and leaves a row another transaction holds locked for
    its next run - it never waits for it. Kills generated
    ``gen-leases-lease_bury_exhausted-lock-1`` (FOR UPDATE SKIP LOCKED removed: the bury
    waits, and its lock timeout ends it)."""
    ids = {}
    for kind in ("held-back", "free"):
        await tasks.create(pool, tenants.a, kind, max_attempts=1)
        [held] = await leases.claim(pool, "w", task_types=[kind])
        await tasks.transition(pool, tenants.a, held.id, expected_version=held.state_version,
                               to_state="pending", lease=held.lease)  # fmt: skip
        ids[kind] = held.id
    locker = await db.connect(RUNTIME)
    impatient = await db.connect(RUNTIME)
    try:
        await impatient.execute("SET lock_timeout = '2s'")  # it would rather fail than wait
        tx = await _hold(locker, "agent_tasks", tenants.a, ids["held-back"])
        assert await leases.bury_exhausted(impatient) == [(tenants.a, ids["free"])]
        await tx.rollback()
    finally:
        await locker.close()
        await impatient.close()
    assert await leases.bury_exhausted(pool) == [(tenants.a, ids["held-back"])]


@pytest.mark.plain_postgres(
    "one clock: on Citus the claim reads now() on the tenant's worker, the test on the coordinator"
)
async def test_G12_a_lease_that_ends_this_very_instant_is_taken_over(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A lease is live until its expiry, not at it: a claim at the very instant a lease
    ends takes the task over (its attempt counted again, its token bumped). In one
    transaction, where now() stands still. Kills generated
    ``gen-leases-lease_claim-cmp-44`` (the expired step's ``<=`` made ``<``)."""
    task = await tasks.create(pool, tenants.a, "ending", lease_ttl=timedelta(hours=1))
    [held] = await leases.claim(pool, "w1")
    assert held.id == task.id
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # the lease runs out, to this very instant
        await admin_conn.execute(
            "UPDATE agent_tasks SET lease_expires_at = now() WHERE id = $1", task.id
        )
        await admin_conn.execute("SET LOCAL session_replication_role = origin")
        taken = await leases.claim(admin_conn, "w2")
    assert [(t.id, t.attempts) for t in taken] == [(task.id, 2)]
    assert taken[0].lease is not None
    assert (taken[0].lease.owner, taken[0].lease.token) == ("w2", 2)


async def test_G6_an_exhausted_task_due_at_this_very_instant_is_buried(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A pending task whose attempts are used up is buried once it is due, and it is due
    at its wake_at itself (``wake_at <= now()``, as a claim takes it). In one transaction,
    rolled back, whose now() is the task's wake_at, the bury takes it; a second later than
    now() it does not. Kills generated ``gen-leases-lease_bury_exhausted-cmp-4`` (``<``:
    a task due this instant left for later)."""
    await tasks.create(pool, tenants.a, "due-now", max_attempts=1)
    [held] = await leases.claim(pool, "w", task_types=["due-now"])
    later = datetime.now(UTC) + timedelta(hours=1)
    await tasks.transition(pool, tenants.a, held.id, expected_version=held.state_version,
                           to_state="pending", wake_at=later, lease=held.lease)  # fmt: skip
    # A bare wake_at write is no transition (agent_tasks_event_required would refuse it at
    # commit): the bury in between sees the instant.
    wake = (
        "UPDATE agent_tasks SET wake_at = now() + $2, state_version = state_version + 1"
        " WHERE tenant_id = $1 AND id = $3"
    )
    for ahead, buried in ((timedelta(seconds=1), []), (timedelta(0), [(tenants.a, held.id)])):
        tx = admin_conn.transaction()
        await tx.start()
        try:
            await admin_conn.execute(wake, tenants.a, ahead, held.id)
            assert await leases.bury_exhausted(admin_conn) == buried, ahead
        finally:
            await tx.rollback()


async def test_G12_a_claim_passes_over_a_task_that_used_up_its_attempts_behind_a_due_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The batch's own read starts at the first task the walk found (lease_claim's
    ``first_wake``), so a task that used up its attempts *before* that one is out of its
    range anyway; one queued *after* it must still be refused by the batch's own test.
    Kills the hand mutant ``leases-claim-exhausted`` (that test dropped)."""
    due = await tasks.create(pool, tenants.a, "ex")
    spent = await tasks.create(pool, tenants.a, "ex")
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # attempts used up elsewhere: the guards are off
        await admin_conn.execute(
            "UPDATE agent_tasks SET attempts = max_attempts, wake_at = now() - interval '1 s'"
            " WHERE id = $1",
            spent.id,
        )
        await admin_conn.execute(
            "UPDATE agent_tasks SET wake_at = now() - interval '2 s' WHERE id = $1", due.id
        )
    got = await leases.claim(pool, "w", batch=2, task_types=["ex"])
    assert [t.id for t in got] == [due.id]


async def test_G2_G12_a_renewal_extends_its_own_tenant_s_lease_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenants a and b each have a task of one id (task ids are the caller's), each held by
    a worker named w at token 1. Renewing a's lease for an hour leaves b's as it was. Kills
    generated ``gen-leases-lease_renew-tenant-1`` (the renewal matching the task id, owner
    and token in every tenant)."""
    shared = uuid.uuid4()
    held = {}
    for tenant, kind in ((tenants.a, "renew-a"), (tenants.b, "renew-b")):
        await tasks.create(pool, tenant, kind, task_id=shared, lease_ttl=timedelta(minutes=1))
        [claimed] = await leases.claim(pool, "w", task_types=[kind])
        assert claimed.lease is not None
        held[tenant] = claimed.lease
    assert held[tenants.a].token == held[tenants.b].token
    ends = "SELECT lease_expires_at FROM agent_tasks WHERE tenant_id = $1 AND id = $2"
    b_before = await admin_conn.fetchval(ends, tenants.b, shared)
    await leases.renew(pool, held[tenants.a], lease_ttl=timedelta(hours=1))
    assert await admin_conn.fetchval(ends, tenants.b, shared) == b_before
    assert await admin_conn.fetchval(ends, tenants.a, shared) > b_before
