"""Fair claiming and per-tenant concurrency caps (G18).

The claim walks the tenants with due work round-robin and gives each its
share of the batch; a cap on a tenant (or one of its task types) is applied
by the claim and enforced by a trigger for every other writer.

The bound the fairness test proves: with B the batch size and n tenants
with due work (n <= B), every claim offers each tenant ceil(B/n) tasks and
takes at least floor(B/n) from each that has that many unlocked, whatever
the others' backlogs. So a tenant with k due tasks is fully started within
ceil(k / floor(B/n)) claims of any one worker - here 20 tasks, B = 10,
n = 3: within 7 rounds - while the tenant with 20,000 gets at most
ceil(B/n) = 4 per claim meanwhile. Claiming in wake_at order across tenants
(what the claim once did) would start all 20,000 first.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from agentdb import _db, leases, tasks, tenancy
from agentdb._citus import routed
from agentdb.errors import ConfigurationError, NotFound, TransientError
from agentdb.models import Task
from agentdb.worker import Job, Worker
from tests import factories as F
from tests._procs import stop_workers, worker_processes
from tests.conftest import RUNTIME, Database, Tenants

ROOT = Path(__file__).resolve().parent.parent

_SEED = """
WITH t AS (
    INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, wake_at)
    SELECT $1, $2, 'v1', now() - $4::text::interval + g * interval '1 millisecond'
    FROM generate_series(1, $3) AS g
    RETURNING tenant_id, id, workflow_version
)
INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version, to_state,
                          task_state_version)
SELECT tenant_id, id, 'task.created', 'test', workflow_version, 'pending', 0 FROM t
"""


async def _seed(
    conn: asyncpg.Connection, tenant: uuid.UUID, n: int, *, kind: str = "t", age: str = "1 minute"
) -> None:
    """``n`` due tasks of ``kind`` for ``tenant``, the oldest due ``age`` ago."""
    await conn.execute(_SEED, tenant, kind, n, age)


async def _tenant(conn: asyncpg.Connection, name: str) -> uuid.UUID:
    tid = uuid.uuid4()
    await conn.execute("INSERT INTO agent_tenants (id, name) VALUES ($1, $2)", tid, name)
    return tid


async def test_G18_a_backlog_does_not_delay_the_other_tenants(
    db: Database, admin_conn: asyncpg.Connection
) -> None:
    x, y, z = [await _tenant(admin_conn, n) for n in ("x", "y", "z")]
    # X's backlog is older than anything Y or Z has: in wake_at order it would all go first.
    await _seed(admin_conn, x, 20_000, age="1 hour")
    await _seed(admin_conn, y, 20)
    await _seed(admin_conn, z, 20)
    conns = [await db.connect(RUNTIME) for _ in range(4)]
    after: list[uuid.UUID | None] = [None] * 4

    async def claim(i: int) -> list[Task]:
        got = await leases.claim(conns[i], f"w{i}", batch=10, after_tenant=after[i])
        if got:
            after[i] = got[-1].tenant_id
        return got

    started: Counter[uuid.UUID] = Counter()
    rounds = 0
    try:
        while started[y] < 20 or started[z] < 20:
            rounds += 1
            # The bound proved: a claim that reaches Y while Y has due rows no one
            # holds takes at least 2 of them (shares 4, 4, 2 of a batch of 10 in the
            # walk's order), and rows the round's other claims hold start in this
            # round anyway - so at least 2 of Y's start each round: all 20 within 10
            # rounds (40 claims). In wake_at order they would wait for X's 20,000.
            assert rounds <= 10, f"after 10 rounds of 4 claims only {dict(started)} started"
            # X's share of a batch is a third (4) when Y and Z both still have a
            # due row this claim can lock, a half (5) when one of them does. A
            # tenant is sure to when the other three claims of the round cannot take
            # or hold all it has left: each takes at most 5 of it (X always gives,
            # so a batch is shared by two tenants at least). When neither is sure, a
            # tenant whose last rows the other claims hold gives nothing and X may
            # fill the batch: the workers are not left idle, and no one waits.
            left = (20 - started[y], 20 - started[z])
            share = 4 if min(left) > 3 * 5 else 5 if max(left) > 3 * 5 else 10
            for batch in await asyncio.gather(*(claim(i) for i in range(4))):
                per = Counter(t.tenant_id for t in batch)
                assert per[x] <= share, (per, left)
                started.update(per)
    finally:
        for c in conns:
            await c.close()


async def test_G18_successive_claims_rotate_through_the_tenants(
    pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    ts = sorted([await _tenant(admin_conn, f"t{i}") for i in range(3)])
    for i, t in enumerate(ts):
        await _seed(admin_conn, t, 5, age=f"{10 - i} minutes")
    order: list[uuid.UUID] = []
    after: uuid.UUID | None = None
    for _ in range(9):
        [task] = await leases.claim(pool, "w", batch=1, after_tenant=after)
        order.append(task.tenant_id)
        after = task.tenant_id
    assert order == ts * 3  # round-robin, not the oldest tenant three times over


async def test_G18_the_walk_comes_back_to_the_tenant_it_started_after(
    pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """The walk starts after the worker's last tenant, wraps, and one full turn still
    reaches that tenant: a batch of two, after the later of two busy tenants, shares
    itself between both rather than taking both from the first."""
    a, b = sorted([await _tenant(admin_conn, f"w{i}") for i in range(2)])
    for t in (a, b):
        await _seed(admin_conn, t, 5, age="1 minute")
    got = await leases.claim(pool, "w", batch=2, after_tenant=b)
    assert sorted(t.tenant_id for t in got) == [a, b]


async def test_G18_the_walk_wraps_past_a_tenant_whose_tasks_used_up_their_attempts(
    pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """The walk starts after y, takes z, and wraps to the first tenant with due work: y,
    not x, whose one pending task used up its attempts (lease_bury_exhausted's, never
    claimed). A batch of two gives one task of z and one of y. Kills generated
    ``gen-leases-lease_claim-cmp-17`` (``attempts <= max_attempts`` where the walk wraps:
    x counted as a tenant with due work, its share of the batch empty, y's turn lost)."""
    x, y, z = sorted([await _tenant(admin_conn, n) for n in ("x", "y", "z")])
    for t in (y, z):
        await _seed(admin_conn, t, 2)
    await admin_conn.execute(
        "WITH t AS (INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, wake_at,"
        " attempts, max_attempts) VALUES ($1, 't', 'v1', now() - interval '2 hours', 3, 3)"
        " RETURNING tenant_id, id, workflow_version)"
        " INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,"
        " to_state, task_state_version)"
        " SELECT tenant_id, id, 'task.created', 'test', workflow_version, 'pending', 0 FROM t",
        x,
    )
    got = await leases.claim(pool, "w", batch=2, after_tenant=y)
    assert [t.tenant_id for t in got] == [z, y]


async def test_G18_one_claim_shares_its_batch_between_the_tenants(
    pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    big, small = await _tenant(admin_conn, "big"), await _tenant(admin_conn, "small")
    await _seed(admin_conn, big, 100, age="1 hour")
    await _seed(admin_conn, small, 3)
    got = await leases.claim(pool, "w", batch=6)
    assert Counter(t.tenant_id for t in got) == {big: 3, small: 3}
    # Alone with due work, a tenant takes the whole batch.
    got = await leases.claim(pool, "w", batch=6)
    assert Counter(t.tenant_id for t in got) == {big: 6}


async def _claim_as(
    how: str, conn: asyncpg.Connection, batch: int, after: uuid.UUID | None
) -> list[Task]:
    """``leases.claim`` (what this database runs), or the Citus claim's walk itself."""
    if how == "statement":
        return await leases.claim(conn, "w", batch=batch, after_tenant=after)
    rows = await routed.claim(
        conn, "w", batch=batch, lease_ttl=None, task_types=None, after_tenant=after
    )
    return [Task.from_record(r) for r in rows]


@pytest.mark.parametrize("how", ["statement", "routed"])
@pytest.mark.parametrize("batch", [4, 5])
async def test_G18_a_batch_not_a_multiple_of_the_tenants_is_filled_and_shared(
    batch: int, how: str, db: Database, admin_conn: asyncpg.Connection
) -> None:
    """Blind class "windows the suite never ran" (issue 35): a claim batch that is not
    a multiple of the tenants with due work - every other test's batch divides evenly,
    or is 1, or is bounded only from above.

    Three tenants with due work and a batch of 4 or 5: each offers ceil(B/3) = 2, and
    the batch takes every tenant's first task, then second ones in the walk's order:
    exactly B tasks, every tenant at least one, none more than its share. The worker's
    next claim starts after the tenant of the last task it was given, so the extra
    tasks rotate: over three claims each tenant starts B. Kills
    windows-claim-share-rounds-down (a share of floor(B/3) = 1: the batch comes back
    under-filled with 3), windows-claim-takes-a-tenant-whole-first (shares taken tenant
    by tenant: the last tenant of the walk starves) and windows-claim-batch-unbounded
    (no LIMIT on the pick: the three shares, 6 tasks, for a batch of 4 or 5).

    ``routed``: the Citus claim's walk (agentdb._citus.routed.claim, which runs here
    too) must share the same way. It took each tenant's whole share in the walk's order
    and returned the rows tenant by tenant: with a batch of 4 the third tenant got
    nothing, and with 5 it got 1 to the others' 2 in every claim, for ever, since the
    next walk started after it again (windows-routed-claim-takes-a-tenant-whole-first,
    windows-routed-claim-rows-tenant-by-tenant).
    """
    ts = sorted([await _tenant(admin_conn, f"t{i}") for i in range(3)])
    for t in ts:
        await _seed(admin_conn, t, 10)
    started: Counter[uuid.UUID] = Counter()
    after: uuid.UUID | None = None
    conn = await db.connect(RUNTIME)
    try:
        for _ in range(3):
            got = await _claim_as(how, conn, batch, after)
            per = Counter(t.tenant_id for t in got)
            assert len(got) == batch, per
            assert set(per) == set(ts), per  # no tenant starves
            assert max(per.values()) == 2, per  # ceil(B/3), and no more
            started.update(per)
            after = got[-1].tenant_id
    finally:
        await conn.close()
    assert started == dict.fromkeys(ts, batch)


async def test_G18_a_cap_holds_the_claim_to_the_free_slots(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    await _seed(admin_conn, tenants.a, 10)
    await _seed(admin_conn, tenants.b, 10)
    await tenancy.set_concurrency_limit(pool, tenants.a, 2)
    # Each tenant's share is 5; A's cap leaves it 2 (the worker claims again at once).
    got = await leases.claim(pool, "w", batch=10)
    assert Counter(t.tenant_id for t in got) == {tenants.a: 2, tenants.b: 5}
    got = await leases.claim(pool, "w", batch=10)
    assert Counter(t.tenant_id for t in got) == {tenants.b: 5}  # A is full
    [limit] = await tenancy.concurrency_limits(pool, tenants.a)
    assert (limit.task_type, limit.max_running, limit.running) == ("*", 2, 2)
    # A finished task frees its slot for the next claim.
    first = (await _running(admin_conn, tenants.a))[0]
    await tasks.transition(
        pool, tenants.a, first.id, expected_version=first.state_version, to_state="succeeded",
        lease=first.lease,
    )  # fmt: skip
    got = await leases.claim(pool, "w", batch=10)
    assert Counter(t.tenant_id for t in got) == {tenants.a: 1}
    # 0 pauses the tenant; NULL lifts the cap.
    await tenancy.set_concurrency_limit(pool, tenants.b, 0)
    await _seed(admin_conn, tenants.b, 1)
    assert await leases.claim(pool, "w", batch=10) == []
    await tenancy.set_concurrency_limit(pool, tenants.a, None)
    got = await leases.claim(pool, "w", batch=10)
    assert Counter(t.tenant_id for t in got) == {tenants.a: 7}


async def test_G18_a_cap_on_one_task_type_leaves_the_others_free(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    await _seed(admin_conn, tenants.a, 10, kind="llm", age="1 hour")
    await _seed(admin_conn, tenants.a, 10, kind="email")
    await tenancy.set_concurrency_limit(pool, tenants.a, 1, task_type="llm")
    got = await leases.claim(pool, "w", batch=8)
    assert Counter(t.task_type for t in got) == {"llm": 1, "email": 7}
    got = await leases.claim(pool, "w", batch=8)
    assert Counter(t.task_type for t in got) == {"email": 3}
    # A worker that only handles the capped type finds nothing, and no other tenant is held up.
    await _seed(admin_conn, tenants.b, 2, kind="llm")
    got = await leases.claim(pool, "w", batch=8, task_types=["llm"])
    assert Counter(t.tenant_id for t in got) == {tenants.b: 2}


@pytest.mark.parametrize("step", ["first", "later"])
async def test_G18_a_type_s_cap_counts_that_type_s_running_tasks_only_at_any_step_of_the_walk(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, step: str
) -> None:
    """One "email" task of tenant a runs; its "llm" cap of one has its slot free, so a
    claim takes an llm task - whether llm is the walk's first step (a's only due type) or
    a later one (after a's "batch" type). Kills ``gen-leases-lease_claim-and-10``,
    ``-cmp-26`` and ``-cmp-27`` (the walk's later steps counting the tenant's running tasks
    of every type, or of the others, against a type's cap: llm looks full and is passed
    over) and their first-step twins."""
    await _seed(admin_conn, tenants.a, 1, kind="email")
    [running] = await leases.claim(pool, "w", batch=1, after_tenant=uuid.UUID(int=0))
    assert running.task_type == "email"
    if step == "later":
        await _seed(admin_conn, tenants.a, 1, kind="batch")  # before "llm" in the walk
    await _seed(admin_conn, tenants.a, 2, kind="llm")
    await tenancy.set_concurrency_limit(pool, tenants.a, 1, task_type="llm")
    got = await leases.claim(pool, "w", batch=3, after_tenant=uuid.UUID(int=0))
    want = ["batch", "llm"] if step == "later" else ["llm"]
    assert sorted(t.task_type for t in got) == want


async def test_G18_the_walk_wraps_round_to_a_tenant_whose_due_task_is_waiting(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task waiting on a timer that has passed is due like a pending one, also where the
    walk wraps round: starting after tenant a, the walk takes b's task, wraps, and comes
    to a's, which is waiting. Kills ``gen-leases-lease_claim-list-8`` (the wrap finding
    pending tasks only: a's waiting task missed, the claim brings b's alone)."""
    a, b = sorted([tenants.a, tenants.b])
    past = datetime.now(UTC) - timedelta(minutes=1)
    waiting = await F.create_task(admin_conn, a, state="waiting", wake_at=past)
    await _seed(admin_conn, b, 1)
    got = await leases.claim(pool, "w", batch=2, after_tenant=a)
    assert [t.tenant_id for t in got] == [b, a]
    assert got[1].id == waiting


async def test_G18_a_capped_tenant_spoils_no_batch_of_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A full tenant first in the walk must not make a one-slot worker come back empty."""
    a, b = sorted([tenants.a, tenants.b])
    await _seed(admin_conn, a, 5, age="1 hour")
    await _seed(admin_conn, b, 5)
    await tenancy.set_concurrency_limit(pool, a, 0)
    for _ in range(3):
        [task] = await leases.claim(pool, "w", batch=1, after_tenant=uuid.UUID(int=0))
        assert task.tenant_id == b


async def test_G18_set_concurrency_limit_refuses_bad_input(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    for bad in (-1, 1.5, True, "3", 2**31):
        with pytest.raises(ConfigurationError):
            await tenancy.set_concurrency_limit(pool, tenants.a, bad)  # type: ignore[arg-type]
    for kind in ("", "x" * 201):
        with pytest.raises(ConfigurationError):
            await tenancy.set_concurrency_limit(pool, tenants.a, 1, task_type=kind)
    with pytest.raises(NotFound):
        await tenancy.set_concurrency_limit(pool, uuid.uuid4(), 1)
    assert await tenancy.concurrency_limits(pool, tenants.a) == []


async def _running(conn: asyncpg.Connection, tenant: uuid.UUID) -> list[Task]:
    rows = await conn.fetch(
        "SELECT * FROM agent_tasks WHERE tenant_id = $1 AND state = 'running' ORDER BY id", tenant
    )
    return [Task.from_record(r) for r in rows]


async def test_G18_a_cap_is_never_exceeded_by_in_process_workers(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """4 Workers (own pools) race for a tenant capped at 3; a sampler watches from outside."""
    await _seed(admin_conn, tenants.a, 120)
    await _seed(admin_conn, tenants.b, 40)
    setup = await db.connect(RUNTIME)
    try:
        await tenancy.set_concurrency_limit(setup, tenants.a, 3)
    finally:
        await setup.close()

    async def brief(job: Job) -> None:
        await asyncio.sleep(0.01)

    pools = [await asyncpg.create_pool(db.url(RUNTIME), min_size=1, max_size=4) for _ in range(4)]
    workers = [Worker(p, {"t": brief}, concurrency=8, poll_interval=0.05) for p in pools]
    runs = [asyncio.create_task(w.run(install_signals=False)) for w in workers]
    peak = 0
    try:
        deadline = time.monotonic() + 120
        while True:
            running = await admin_conn.fetchval(
                "SELECT count(*) FROM agent_tasks WHERE tenant_id = $1 AND state = 'running'",
                tenants.a,
            )
            peak = max(peak, running)
            assert running <= 3
            left = await admin_conn.fetchval(
                "SELECT count(*) FROM agent_tasks WHERE state <> 'succeeded'"
            )
            if left == 0:
                break
            assert time.monotonic() < deadline, f"{left} tasks unfinished"
            await asyncio.sleep(0.002)
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*runs)
        for p in pools:
            await p.close()
    assert peak == 3  # the cap was reached, so the check above was tested


def test_G18_a_cap_is_never_exceeded_by_worker_processes(db: Database, tenants: Tenants) -> None:
    """4 ``agentdb worker`` processes, a cap of 3 on one type of one tenant, a cap of 5
    on the tenant; sampled continuously from another connection."""
    asyncio.run(_seed_for_processes(db, tenants))
    procs = worker_processes(db.url(RUNTIME), "tests.fixture_handlers:BRIEF", 4, 6)
    try:
        peaks = asyncio.run(_sample_until_done(db, tenants.a))
    finally:
        errs = stop_workers(procs)
    assert all(p.returncode == 0 for p in procs), errs
    assert peaks == {"capped": 3, "*": 5}, peaks


async def _seed_for_processes(db: Database, tenants: Tenants) -> None:
    conn = await db.connect()
    try:
        await _seed(conn, tenants.a, 150, kind="capped")
        await _seed(conn, tenants.a, 150, kind="free")
        await _seed(conn, tenants.b, 100, kind="free")
        await tenancy.set_concurrency_limit(conn, tenants.a, 5)
        await tenancy.set_concurrency_limit(conn, tenants.a, 3, task_type="capped")
    finally:
        await conn.close()


async def _sample_until_done(db: Database, tenant: uuid.UUID) -> dict[str, int]:
    conn = await db.connect()
    peaks = {"capped": 0, "*": 0}
    try:
        deadline = time.monotonic() + 180
        while True:
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE task_type = 'capped') AS capped, count(*) AS all"
                " FROM agent_tasks WHERE tenant_id = $1 AND state = 'running'",
                tenant,
            )
            assert row is not None
            assert row["capped"] <= 3, dict(row)
            assert row["all"] <= 5, dict(row)
            peaks = {
                "capped": max(peaks["capped"], row["capped"]),
                "*": max(peaks["*"], row["all"]),
            }
            left = await conn.fetchval(
                "SELECT count(*) FROM agent_tasks WHERE state <> 'succeeded'"
            )
            if left == 0:
                return peaks
            assert time.monotonic() < deadline, f"{left} tasks unfinished"
            await asyncio.sleep(0.002)
    finally:
        await conn.close()


async def test_G18_concurrent_claimers_never_overfill_a_tenant(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Rounds of eight claims at once against a cap of 5: together they take exactly 5."""
    await _seed(admin_conn, tenants.a, 50)
    await tenancy.set_concurrency_limit(admin_conn, tenants.a, 5)
    conns = [await db.connect(RUNTIME) for _ in range(8)]
    total = 0
    try:
        for _ in range(4):
            got = await asyncio.gather(
                *(leases.claim(c, f"w{i}", batch=4, lease_ttl=timedelta(minutes=5))
                  for i, c in enumerate(conns))
            )  # fmt: skip
            total += sum(len(g) for g in got)
            assert total <= 5
    finally:
        for c in conns:
            await c.close()
    assert len(await _running(admin_conn, tenants.a)) == 5


async def _blocked_or_done(admin: asyncpg.Connection, pid: int, start: asyncio.Task[Any]) -> None:
    """Until ``pid`` waits on a lock or ``start`` is over (never an assertion on time)."""
    for _ in range(400):
        if start.done():
            return
        waiting = await admin.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
        if waiting:
            return
        await asyncio.sleep(0.025)


@pytest.mark.parametrize("cap", [1, 2])
async def test_G18_two_starts_racing_for_the_last_slot_are_serialised_by_the_cap(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection, cap: int
) -> None:
    """The cap trigger (agentdb_guard_concurrency) locks the tenant's cap row, so a second
    transaction starting a task waits for the first to end and then counts its task.

    An explicit interleaving on two connections: A starts task 1 and holds its
    transaction open; B starts task 2; A commits; B must then be refused under a cap
    of 1 (and, the control, pass under a cap of 2). Kills the generated mutant of the
    class "races the suite never runs": agentdb_guard_concurrency without its FOR
    UPDATE (gen-...-agentdb_guard_concurrency-lock-1), under which B counts only its
    own task in a snapshot without A's and both run.
    """
    await tenancy.set_concurrency_limit(admin_conn, tenants.a, cap)
    first = await F.create_task(admin_conn, tenants.a)
    second = await F.create_task(admin_conn, tenants.a)
    a, b = await db.connect(), await db.connect()
    try:
        held = a.transaction()
        await held.start()
        await F.claim_task(a, tenants.a, first)

        async def start_second() -> None:
            async with b.transaction():
                await F.claim_task(b, tenants.a, second, owner="worker-2")

        racing = asyncio.ensure_future(start_second())
        await _blocked_or_done(admin_conn, b.get_server_pid(), racing)
        await held.commit()
        if cap == 1:
            with pytest.raises(asyncpg.PostgresError) as refused:
                await racing
            assert refused.value.sqlstate == "AG009"
        else:
            await racing
    finally:
        await a.close()
        await b.close()
    assert len(await _running(admin_conn, tenants.a)) == cap


async def _three_tenants(conn: asyncpg.Connection) -> list[uuid.UUID]:
    """Three tenants in the order the walk takes them (by id), three due tasks each."""
    ids = sorted(uuid.uuid4() for _ in range(3))
    for tid, name in zip(ids, "xyz", strict=True):
        await conn.execute("INSERT INTO agent_tenants (id, name) VALUES ($1, $2)", tid, name)
        await _seed(conn, tid, 3)
    return ids


async def _walk(db: Database, *, after: uuid.UUID | None) -> list[Any]:
    """The Citus claim's walk (agentdb._citus.routed.claim), batch 9, on a runtime connection."""
    conn = await db.connect(RUNTIME)
    try:
        return await routed.claim(
            conn, "w", batch=9, lease_ttl=timedelta(minutes=5), task_types=None,
            after_tenant=after,
        )  # fmt: skip
    finally:
        await conn.close()


# A task of the tenant moved to running by hand, over its cap: what a writer that
# committed after the claim statement's snapshot makes the cap trigger answer.
_OVER_THE_CAP = """
UPDATE agent_tasks
SET state = 'running', state_version = state_version + 1, lease_owner = 'elsewhere',
    lease_token = lease_token + 1, lease_acquired_at = now(),
    lease_expires_at = now() + interval '5 minutes', attempts = attempts + 1
WHERE tenant_id = $1
  AND id = (SELECT id FROM agent_tasks WHERE tenant_id = $1 AND state = 'pending' LIMIT 1)
"""


async def test_G18_a_tenant_refused_mid_walk_loses_only_its_own_claim(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Citus claim (agentdb._citus.routed.claim) takes tenant after tenant, each in a
    transaction of its own. When one tenant's claim is refused by the cap trigger (AG009),
    the tenants already claimed must still come back: raised, their leases would run out
    unworked with an attempt spent on each (seen on Citus as a flaky claim error)."""
    x, y, z = await _three_tenants(admin_conn)
    await tenancy.set_concurrency_limit(admin_conn, y, 0)
    real = _db.fetch_many

    async def refused_for_y(conn: Any, q: Any, /, **params: Any) -> list[Any]:
        if q.name == "routed_claim" and params["tenant_id"] == y:
            try:  # in the claim's own transaction: the trigger refuses, it rolls back
                await conn.execute(_OVER_THE_CAP, y)
            except asyncpg.PostgresError as exc:
                raise _db.translate(exc) from exc
        return await real(conn, q, **params)

    monkeypatch.setattr(_db, "fetch_many", refused_for_y)
    rows = await _walk(db, after=None)
    monkeypatch.undo()
    got = Counter(r["tenant_id"] for r in rows)
    assert got == {x: 3, z: 3}, got
    # No lease left behind: every running task is one the caller was given; y's untouched.
    running = await admin_conn.fetch(
        "SELECT id, tenant_id FROM agent_tasks WHERE state = 'running'"
    )
    assert sorted(r["id"] for r in running) == sorted(r["id"] for r in rows)
    assert await admin_conn.fetchval(
        "SELECT count(*) FROM agent_tasks WHERE tenant_id = $1 AND state = 'pending'"
        " AND attempts = 0", y
    ) == 3  # fmt: skip


async def test_G18_a_connection_lost_mid_walk_hands_back_what_was_claimed(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Citus claim's walk loses its connection at the second tenant (a failover, a
    restarted pooler): the first tenant's claim committed, so it must come back."""
    x, y, _ = await _three_tenants(admin_conn)
    real = _db.fetch_many

    async def lost_at(tenant: uuid.UUID) -> Any:
        async def fetch_many(conn: Any, q: Any, /, **params: Any) -> list[Any]:
            if q.name == "routed_claim" and params["tenant_id"] == tenant:
                pid = _db.raw_connection(conn).get_server_pid()
                await admin_conn.execute("SELECT pg_terminate_backend($1::int, 10000)", pid)
            return await real(conn, q, **params)

        return fetch_many

    monkeypatch.setattr(_db, "fetch_many", await lost_at(y))
    rows = await _walk(db, after=None)
    assert Counter(r["tenant_id"] for r in rows) == {x: 3}
    running = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE state = 'running'")
    assert sorted(r["id"] for r in running) == sorted(r["id"] for r in rows)
    # Lost before anything was claimed, the walk raises: the caller claims again.
    monkeypatch.setattr(_db, "fetch_many", await lost_at(y))
    with pytest.raises(TransientError):
        await _walk(db, after=x)
    monkeypatch.undo()


async def test_G18_the_pick_takes_only_due_tasks_with_attempts_left(
    tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The walk finds a tenant's task type by its first due task; the pick inside it
    must still leave a task that is not due yet and one that used up its attempts."""
    await _seed(admin_conn, tenants.a, 2)
    later = await tasks.create(
        admin_conn, tenants.a, "t", wake_at=datetime.now(UTC) + timedelta(hours=1)
    )
    exhausted = await admin_conn.fetchval(
        "WITH t AS (INSERT INTO agent_tasks (tenant_id, task_type, workflow_version, wake_at,"
        " attempts, max_attempts) VALUES ($1, 't', 'v1', now() - interval '2 hours', 3, 3)"
        " RETURNING tenant_id, id, workflow_version)"
        " INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,"
        " to_state, task_state_version)"
        " SELECT tenant_id, id, 'task.created', 'test', workflow_version, 'pending', 0 FROM t"
        " RETURNING task_id",
        tenants.a,
    )
    got = await leases.claim(admin_conn, "w", batch=10, lease_ttl=timedelta(minutes=5))
    assert len(got) == 2  # positive control: both due tasks with attempts left
    assert {later.id, exhausted}.isdisjoint(t.id for t in got)


# ---- the Citus claim's discovery, amortised (issue 40) ----------------------------------------


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict[str, Any]]:
    """Every run of statement ``name`` through _db.fetch_many, with its parameters."""
    seen: list[dict[str, Any]] = []
    real = _db.fetch_many

    async def fetch_many(conn: Any, q: Any, /, **params: Any) -> list[Any]:
        if q.name == name:
            seen.append(params)
        return await real(conn, q, **params)

    monkeypatch.setattr(_db, "fetch_many", fetch_many)
    return seen


async def _rotation(db: Database, claims: int, *, outbox: bool = False) -> list[uuid.UUID]:
    """The tenant of each of ``claims`` routed claims of batch 1 on one runtime connection,
    each after the last one's tenant (as a worker walks)."""
    conn = await db.connect(RUNTIME)
    got: list[uuid.UUID] = []
    after: uuid.UUID | None = None
    try:
        for _ in range(claims):
            if outbox:
                rows = await routed.outbox_claim(
                    conn, "r", batch=1, visibility=timedelta(minutes=5), after_tenant=after
                )
            else:
                rows = await routed.claim(
                    conn, "w", batch=1, lease_ttl=timedelta(minutes=5), task_types=None,
                    after_tenant=after,
                )  # fmt: skip
            if not rows:
                break
            after = rows[-1]["tenant_id"]
            got.append(after)
    finally:
        await conn.close()
    return got


async def _tenants_with_work(conn: asyncpg.Connection, n: int, each: int) -> list[uuid.UUID]:
    ids = sorted(uuid.uuid4() for _ in range(n))
    for i, tid in enumerate(ids):
        await conn.execute("INSERT INTO agent_tenants (id, name) VALUES ($1, $2)", tid, f"r{i}")
        await _seed(conn, tid, each)
    return ids


async def test_G18_the_citus_claim_discovers_once_and_walks_the_ring_round_robin(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Citus a discovery (routed_due_tenants) reads every shard and a tenant's claim one:
    twenty claims of batch 1 over five tenants must walk what one discovery found, round
    robin, wrapping round it - not ask every shard again each claim (36 and 68 remote
    commands a claim, measured). Fails on a ring used only when enough tenants follow the
    last one (the old rule), on a ring never wrapped, and on a walk that is not fair."""
    ids = await _tenants_with_work(admin_conn, 5, 4)
    discoveries = _counting(monkeypatch, "routed_due_tenants")
    got = await _rotation(db, 20)
    assert got == ids * 4
    assert len(discoveries) == 1, discoveries


async def test_G18_an_arc_of_the_walk_is_walked_on_past_its_end_by_one_more_discovery(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More tenants with work than one discovery asks for: the ring holds an arc of the walk,
    and the walk past its end asks again from there (never wraps inside the arc, which
    would starve the tenants beyond it). Fails on wrapping an incomplete ring."""
    monkeypatch.setattr(routed, "_RING_SIZE", 3)
    monkeypatch.setattr(routed, "_PROBE", 1)
    ids = await _tenants_with_work(admin_conn, 7, 2)
    discoveries = _counting(monkeypatch, "routed_due_tenants")
    got = await _rotation(db, 14)
    assert got == ids * 2
    # One discovery per arc of three, each from where the walk stood; not one per claim.
    assert len(discoveries) <= 14 // 3 + 2, len(discoveries)
    assert [d["after_tenant"] for d in discoveries][:3] == [None, ids[2], ids[5]]


async def test_G18_a_ring_is_read_again_when_its_tenants_run_dry_or_it_ages(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant drained is passed over; work that arrives later for a tenant the ring does
    not hold is found once the ring ages (or every tenant in it ran dry)."""
    ids = await _tenants_with_work(admin_conn, 2, 1)
    conn = await db.connect(RUNTIME)
    try:
        first = await routed.claim(
            conn, "w", batch=4, lease_ttl=timedelta(minutes=5), task_types=None, after_tenant=None
        )
        assert sorted(r["tenant_id"] for r in first) == ids
        late = await _tenant(admin_conn, "late")
        await _seed(admin_conn, late, 1)
        discoveries = _counting(monkeypatch, "routed_due_tenants")
        claims = _counting(monkeypatch, "routed_claim")
        # Both tenants gave less than they were asked for: dry. The next claim asks no
        # claim of them, asks every shard again, and finds the new one.
        again = await routed.claim(
            conn, "w", batch=4, lease_ttl=timedelta(minutes=5), task_types=None,
            after_tenant=ids[-1],
        )  # fmt: skip
        assert [r["tenant_id"] for r in again] == [late]
        assert len(discoveries) == 1
        assert {c["tenant_id"] for c in claims} == {late}  # none of the dry ones
    finally:
        await conn.close()


async def test_G18_a_ring_drained_by_another_worker_is_read_again_at_once(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker drained the tenants this worker's ring holds (they are not dry in
    its ring: it never saw them run out): the claim that finds nothing there must ask
    every shard again at once and take the work that is there, not return nothing while
    a tenant waits for the ring to age."""
    x, y = await _tenants_with_work(admin_conn, 2, 2)
    mine, other = await db.connect(RUNTIME), await db.connect(RUNTIME)
    try:
        ttl = timedelta(minutes=5)
        first = await routed.claim(
            mine, "w1", batch=1, lease_ttl=ttl, task_types=None, after_tenant=None
        )
        assert [r["tenant_id"] for r in first] == [x]
        rest = await routed.claim(
            other, "w2", batch=10, lease_ttl=ttl, task_types=None, after_tenant=None
        )
        assert sorted(r["tenant_id"] for r in rest) == sorted([x, y, y])
        late = await _tenant(admin_conn, "late")
        await _seed(admin_conn, late, 1)
        got = await routed.claim(mine, "w1", batch=1, lease_ttl=ttl, task_types=None,
                                 after_tenant=x)  # fmt: skip
        assert [r["tenant_id"] for r in got] == [late]
    finally:
        await mine.close()
        await other.close()


async def test_G10_the_citus_relay_claim_discovers_once_and_walks_the_ring(
    db: Database, admin_conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's claim on Citus (routed.outbox_claim) keeps its discovery as the task
    claim does: ten claims of batch 1 over five tenants, one discovery, round robin."""
    ids = sorted(uuid.uuid4() for _ in range(5))
    for i, tid in enumerate(ids):
        await admin_conn.execute(
            "INSERT INTO agent_tenants (id, name) VALUES ($1, $2)", tid, f"o{i}"
        )
        for _ in range(2):
            await admin_conn.execute(
                "INSERT INTO agent_outbox (tenant_id, topic, payload) VALUES ($1, 't', '{}')", tid
            )
    discoveries = _counting(monkeypatch, "routed_outbox_due_tenants")
    got = await _rotation(db, 10, outbox=True)
    assert got == ids * 2
    assert len(discoveries) == 1, discoveries


async def test_G18_a_cap_counts_its_own_tenant_s_running_tasks_only(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant b's five running tasks take none of tenant a's slots. Only a has due work,
    so the walk starts at a whatever the tenants' ids. (Generated
    ``gen-leases-lease_claim-tenant-4`` - the walk's later steps counting every tenant's
    running tasks against the cap - survives this: the walk meets a at its first step
    only, where the count is a's own; the test below meets the capped tenant later.)"""
    await _seed(admin_conn, tenants.b, 5)
    assert len(await leases.claim(pool, "w", batch=5)) == 5  # b's five, running
    await tenancy.set_concurrency_limit(pool, tenants.a, 2)
    await _seed(admin_conn, tenants.a, 3)
    got = await leases.claim(pool, "w", batch=1)
    assert [t.tenant_id for t in got] == [tenants.a]
    got = await leases.claim(pool, "w", batch=5)
    assert [t.tenant_id for t in got] == [tenants.a]  # its second slot, no more


async def test_G18_a_tenant_with_two_due_task_types_takes_one_turn_in_the_walk(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The walk steps one (tenant, task type) at a time but counts tenants: the first
    tenant's two due types are one tenant, so a batch of two still reaches the second
    tenant, and each gives one. Kills generated ``gen-leases-lease_claim-and-6`` (every
    takeable step counted as a tenant found: the walk stops at the first tenant's second
    type, and that tenant takes the whole batch)."""
    first, second = sorted([tenants.a, tenants.b])
    for task_type in ("kind-1", "kind-2"):
        await tasks.create(pool, first, task_type)
    await tasks.create(pool, second, "kind-1")
    routed._RINGS.clear()  # on Citus: a discovery of its own
    got = await leases.claim(pool, "w", batch=2)
    assert Counter(t.tenant_id for t in got) == {first: 1, second: 1}


async def test_G18_a_cap_met_past_the_walk_s_first_step_counts_its_own_tenant_only(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The walk's later steps judge a capped tenant by its own running tasks too: the
    tenant first in the walk runs five, the capped one second in the walk none of its
    two slots, so each takes a turn. Kills ``gen-leases-lease_claim-tenant-4`` (the
    walk's recursive step counting every tenant's running tasks against the cap: the
    capped tenant looks full, takes no turn, and the claim brings the first one's task
    alone)."""
    first, second = sorted([tenants.a, tenants.b])
    await _seed(admin_conn, first, 5)
    assert len(await leases.claim(pool, "w", batch=5)) == 5  # first's five, running
    await _seed(admin_conn, first, 1)
    await tenancy.set_concurrency_limit(pool, second, 2)
    await _seed(admin_conn, second, 3)
    # On Citus the claim above kept its discovery (only `first` had work) for a second:
    # this claim is to walk both tenants, not that ring (tested above).
    routed._RINGS.clear()
    got = await leases.claim(pool, "w", batch=2)
    assert Counter(t.tenant_id for t in got) == {first: 1, second: 1}


async def test_G18_a_type_s_cap_lowered_below_its_running_tasks_stops_only_that_type(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Two tasks of type x run; then x's cap is lowered to 1 (allowed: they finish
    normally). A task of type y, under no cap, still starts - x's cap, over-full, is x's
    alone - and a third x does not. Kills generated
    ``gen-0002.tasks-agentdb_guard_concurrency-and-1`` (every cap of the tenant checked
    at any start: y refused for x's)."""
    for _ in range(2):
        await tasks.create(pool, tenants.a, "x")
    assert len(await leases.claim(pool, "w", batch=2, task_types=["x"])) == 2
    await tenancy.set_concurrency_limit(pool, tenants.a, 1, task_type="x")
    await tasks.create(pool, tenants.a, "x")
    y = await tasks.create(pool, tenants.a, "y")
    assert [t.id for t in await leases.claim(pool, "w", batch=5, task_types=["x", "y"])] == [y.id]
