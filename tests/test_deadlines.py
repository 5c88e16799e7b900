"""Deadlines (G21): past it a task is not claimed, not finished, starts no effect; swept to dead.

Time is the database's: a test that needs a deadline to pass waits until the
server's clock says it has (``now() > deadline_at``), never a fixed sleep.
The raw-SQL attacks on the guard are in tests/test_attacks.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import children, leases, operations, signals, tasks
from agentdb.errors import ConfigurationError, DeadlineExceeded, LeaseLost, PastDeadline
from agentdb.models import Task
from agentdb.tenancy import delete_tenant
from agentdb.worker import Job, Succeed, Worker
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants

SOON = timedelta(milliseconds=600)


async def _passed(admin: asyncpg.Connection, task_id: uuid.UUID) -> None:
    """Until the database's clock is past the task's deadline."""
    for _ in range(600):
        if await admin.fetchval(
            "SELECT deadline_at < clock_timestamp() FROM agent_tasks WHERE id = $1", task_id
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the deadline never passed")


async def _events(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[asyncpg.Record]:
    return await admin.fetch(
        "SELECT event_type, from_state, to_state, actor_id, payload FROM agent_events"
        " WHERE task_id = $1 AND task_state_version IS NOT NULL ORDER BY task_state_version",
        task_id,
    )


async def _soon(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str, **kw: object) -> Task:
    return await tasks.create(
        pool,
        tenant,
        task_type,
        deadline=datetime.now(UTC) + SOON,
        **kw,  # type: ignore[arg-type]
    )


async def test_G21_a_deadline_needs_a_time_zone(pool: asyncpg.Pool, tenants: Tenants) -> None:
    with pytest.raises(ConfigurationError, match="no time zone"):
        await tasks.create(pool, tenants.a, "d-naive", deadline=datetime(2030, 1, 1))
    when = datetime(2030, 1, 1, tzinfo=UTC)
    on_time = await tasks.create(pool, tenants.a, "d-aware", deadline=when)
    assert on_time.deadline_at == when


async def test_G21_a_task_past_its_deadline_is_not_claimed_and_the_sweep_ends_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    late = await _soon(pool, tenants.a, "d-claim")
    on_time = await tasks.create(
        pool, tenants.a, "d-claim", deadline=datetime.now(UTC) + timedelta(hours=1)
    )
    await _passed(admin_conn, late.id)
    claimed = await leases.claim(pool, "w", batch=10, task_types=["d-claim"])
    assert [t.id for t in claimed] == [on_time.id]  # the control is claimed, the late one not

    swept = await leases.expire_deadlines(pool, actor="sweeper")
    assert swept == [(tenants.a, late.id)]
    dead = await tasks.get(pool, tenants.a, late.id)
    assert (dead.state, dead.lease_owner) == ("dead", None)
    assert (dead.last_error or "").startswith("deadline passed at ")
    last = (await _events(admin_conn, late.id))[-1]
    assert (last["event_type"], last["from_state"], last["to_state"], last["actor_id"]) == (
        "task.deadline_passed", "pending", "dead", "sweeper",
    )  # fmt: skip
    assert "deadline_at" in json.loads(last["payload"])
    assert await leases.expire_deadlines(pool) == []  # nothing twice
    assert (await tasks.get(pool, tenants.a, on_time.id)).state == "running"


async def test_G21_a_finish_after_the_deadline_is_refused_by_the_database(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await _soon(pool, tenants.a, "d-finish")
    [held] = await leases.claim(pool, "holder", task_types=["d-finish"])
    assert held.lease is not None
    lease = held.lease
    # Positive control, before the deadline: the holder reserves.
    early = await operations.reserve(
        pool, tenants.a, task.id, "d-1", "charge", {"n": 1}, lease=lease
    )
    assert early.fresh
    await _passed(admin_conn, task.id)
    for to_state in ("succeeded", "failed", "pending", "running"):
        with pytest.raises(DeadlineExceeded) as refused:
            await tasks.transition(
                pool, tenants.a, task.id, expected_version=held.state_version,
                to_state=to_state, lease=lease,
            )  # fmt: skip
        assert refused.value.guarantee == "G21"
    # Nor put to sleep: a wait keeps it alive as a finish would
    # (kills edges-deadline-guard-lets-a-late-task-wait).
    with pytest.raises(DeadlineExceeded):
        await tasks.wait_for_signal(pool, held, "approval", lease=lease)
    with pytest.raises(DeadlineExceeded):
        await leases.release(pool, lease)
    with pytest.raises(DeadlineExceeded):  # not even kept alive by a heartbeat
        await leases.renew(pool, lease)
    with pytest.raises(DeadlineExceeded):  # no new effect starts for a late task
        await operations.reserve(pool, tenants.a, task.id, "d-2", "charge", {"n": 2}, lease=lease)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "running"

    await leases.expire_deadlines(pool)  # the sweep takes the lease with it
    with pytest.raises(PastDeadline) as renewed:
        await leases.renew(pool, lease)
    assert isinstance(renewed.value, LeaseLost)
    assert renewed.value.guarantee == "G21"
    with pytest.raises(PastDeadline):
        await operations.complete(pool, early.operation, result={"ok": True}, lease=lease)
    # What was reserved in time stays in the ledger, to be reconciled without a lease.
    assert (await operations.complete(pool, early.operation, result={"ok": 1})).state == (
        "succeeded"
    )
    last = (await _events(admin_conn, task.id))[-1]
    assert (last["event_type"], last["from_state"]) == ("task.deadline_passed", "running")
    assert json.loads(last["payload"])["lease_owner"] == "holder"


async def test_G21_a_cancel_still_ends_a_late_task(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await _soon(pool, tenants.a, "d-cancel")
    await _passed(admin_conn, task.id)
    assert (await tasks.cancel(pool, tenants.a, task.id)).state == "cancelled"
    assert await leases.expire_deadlines(pool) == []


async def test_G21_the_worker_sweeps_a_late_task_and_stops_its_handler(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    stopped = asyncio.Event()

    async def handler(job: Job) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    task = await _soon(pool, tenants.a, "d-worker", lease_ttl=timedelta(seconds=1))
    worker = Worker(pool, {"d-worker": handler}, poll_interval=0.05, maintenance_interval=0.1)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(stopped.wait(), 20)
        await F.until(lambda: worker.stats.past_deadline == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert (worker.stats.succeeded, worker.stats.failed) == (0, 0)
    assert (await tasks.get(pool, tenants.a, task.id)).state == "dead"
    assert [e["event_type"] for e in await _events(admin_conn, task.id)] == [
        "task.created", "task.claimed", "task.deadline_passed",
    ]  # fmt: skip


async def test_G21_a_handler_that_returns_after_the_deadline_writes_nothing_and_the_task_dies(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async def handler(job: Job) -> Succeed:
        await _passed(admin_conn, job.task.id)
        return Succeed()

    task = await _soon(pool, tenants.a, "d-late")
    # Maintenance runs once at start and then not for an hour: the refusal, not the
    # periodic sweep, is what ends this task.
    worker = Worker(pool, {"d-late": handler}, poll_interval=0.05, maintenance_interval=3600)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await F.until(lambda: worker.stats.late_writes_refused == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert worker.stats.succeeded == 0
    assert (await tasks.get(pool, tenants.a, task.id)).state == "dead"
    types = [e["event_type"] for e in await _events(admin_conn, task.id)]
    assert types == ["task.created", "task.claimed", "task.deadline_passed"]


async def test_G21_a_late_task_in_a_batched_finish_is_refused_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    late = await _soon(pool, tenants.a, "d-batch")
    await tasks.create(pool, tenants.a, "d-batch", deadline=datetime.now(UTC) + timedelta(hours=1))
    held = await leases.claim(pool, "w", batch=10, task_types=["d-batch"])
    assert len(held) == 2
    await _passed(admin_conn, late.id)
    results = await tasks.finish_many(pool, held)
    by_id = dict(zip([t.id for t in held], results, strict=True))
    assert isinstance(by_id[late.id], DeadlineExceeded)
    [on_time] = [r for tid, r in by_id.items() if tid != late.id]
    assert isinstance(on_time, Task)
    assert on_time.state == "succeeded"  # the rest of the batch committed
    assert (await tasks.get(pool, tenants.a, late.id)).state == "running"  # for the sweep


async def test_G21_a_tenant_whose_due_work_is_all_late_takes_no_turn_of_the_claim(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The claim's walk over tenants skips late tasks: a claim of one task that reaches the
    late tenant first still finds the other tenant's work (counted as a tenant with due
    work, the late one would use the claim's only turn and give nothing)."""
    late = await _soon(pool, tenants.a, "d-walk")
    other = await tasks.create(pool, tenants.b, "d-walk")
    await _passed(admin_conn, late.id)
    # The walk starts after `after`: put the late tenant first in its order.
    after = None if tenants.a < tenants.b else tenants.b
    got = await leases.claim(pool, "w", batch=1, task_types=["d-walk"], after_tenant=after)
    assert [t.id for t in got] == [other.id]
    assert (await tasks.get(pool, tenants.a, late.id)).state == "pending"


async def test_G21_a_late_task_under_an_expired_lease_is_not_taken_over(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Recovery of expired leases skips late tasks too: the sweep ends them instead."""
    task = await _soon(pool, tenants.a, "d-recover")
    assert await leases.claim(pool, "gone", task_types=["d-recover"])
    await F.expire_lease(admin_conn, task.id)  # the holder died, before the deadline
    await _passed(admin_conn, task.id)
    assert await leases.claim(pool, "rescuer", task_types=["d-recover"]) == []
    assert await leases.expire_deadlines(pool) == [(tenants.a, task.id)]


# ---- every non-final state (issue 35's blind class "deadline rules") -------------------

_WAITS = ("timer", "signal", "approval", "children")


async def _waiting(pool: asyncpg.Pool, tenant: uuid.UUID, wait: str) -> tuple[Task, int]:
    """A task of ``d-wait-<wait>`` put to wait by its holder, as a handler does; and the
    holder's lease token."""
    kind = f"d-wait-{wait}"
    await tasks.create(pool, tenant, kind, deadline=datetime.now(UTC) + timedelta(hours=1))
    [held] = await leases.claim(pool, "holder", task_types=[kind])
    assert held.lease is not None
    lease = held.lease
    if wait == "timer":  # due again at once: only the deadline keeps a claim off it
        return await tasks.wait_until(pool, held, datetime.now(UTC), lease=lease), lease.token
    if wait == "children":
        await children.spawn(pool, held, "d-child", "only")
        return await children.wait_for(pool, held, lease=lease), lease.token
    name = "approval" if wait == "approval" else "go"
    return await tasks.wait_for_signal(pool, held, name, lease=lease), lease.token


@pytest.mark.parametrize("wait", _WAITS)
async def test_G21_a_waiting_task_past_its_deadline_only_ends_whatever_it_waits_for(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, wait: str
) -> None:
    """Closes issue 35's blind class "deadline rules in every non-final state": 'waiting'
    (on a timer, a signal, an approval, its children), beside the pending and running ones
    above. Past its deadline a waiting task is not claimed, a write that keeps it alive -
    its claim, its deadline pushed back, a wake - is refused whoever writes it (AG013),
    it takes no signal or approval, and the sweep moves it to dead from 'waiting'. Kills
    the hand mutants edges-deadline-guard-skips-waiting (agent_tasks_deadline_guard's
    WHEN without 'waiting', as gen-0013.operator-agent_tasks_deadline_guard-list-2, whose
    mapped tests have no waiting task) and edges-sweep-spares-waiting (the sweep without
    'waiting', as gen-leases-lease_expire_deadlines-list-2, mapped to test_leases.py,
    which never sweeps)."""
    waiting, token = await _waiting(pool, tenants.a, wait)
    assert waiting.state == "waiting"
    # The deadline passes while the task waits: one not passed yet may move, versioned.
    passed = await admin_conn.fetchval("SELECT now() - interval '1 second'")
    version = await F.update_task(admin_conn, tenants.a, waiting.id, deadline_at=passed,
                                  state_version=waiting.state_version + 1)  # fmt: skip

    assert await leases.claim(pool, "rescuer", task_types=[waiting.task_type]) == []
    keep_alive: list[dict[str, object]] = [
        {"state": "running", "lease_owner": "rogue", "lease_token": token + 1,
         "lease_acquired_at": passed, "lease_expires_at": passed + timedelta(hours=1)},
        {"deadline_at": passed + timedelta(hours=1)},
    ]  # fmt: skip
    for write in keep_alive:
        with pytest.raises(asyncpg.PostgresError) as refused:
            await F.update_task(admin_conn, tenants.a, waiting.id, **write,
                                state_version=version + 1)  # fmt: skip
        assert refused.value.sqlstate == "AG013"
        assert _pg.constraint_of(refused.value) == _pg.guard("agent_tasks_deadline_guard")
    late = await tasks.get(pool, tenants.a, waiting.id)
    with pytest.raises(DeadlineExceeded):
        await tasks.wake(pool, late)
    with pytest.raises(DeadlineExceeded):
        await tasks.signal(pool, tenants.a, late.id, "go")
    with pytest.raises(DeadlineExceeded):
        await signals.approve(pool, tenants.a, late.id, approver="reviewer")
    assert (await tasks.get(pool, tenants.a, late.id)).state_version == version

    assert await leases.expire_deadlines(pool, actor="sweeper") == [(tenants.a, late.id)]
    dead = await tasks.get(pool, tenants.a, late.id)
    assert (dead.state, dead.lease_owner) == ("dead", None)
    last = (await _events(admin_conn, late.id))[-1]
    assert (last["event_type"], last["from_state"], last["to_state"]) == (
        "task.deadline_passed", "waiting", "dead",
    )  # fmt: skip


async def test_G21_a_deadline_has_passed_at_its_own_instant_for_the_guard_and_the_sweep(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "deadline rules": the instant itself. A write's instant
    is its transaction's start, so in one transaction a deadline of now() is exactly now:
    the guard refuses a claim then, and the sweep ends the task then - the two agree the
    deadline has passed. Kills edges-deadline-guard-open-at-its-instant (as gen-0006.
    control_flow-agentdb_guard_deadline-cmp-1, `>=`) and edges-sweep-spares-its-instant (as
    gen-leases-lease_expire_deadlines-cmp-1, `<`)."""
    async with admin_conn.transaction():
        now = await admin_conn.fetchval("SELECT now()")
        task_id = await F.create_task(admin_conn, tenants.a, deadline_at=now)
        with pytest.raises(asyncpg.PostgresError) as refused:
            await F.claim_task(admin_conn, tenants.a, task_id)  # in a savepoint of its own
        assert refused.value.sqlstate == "AG013"
        assert await leases.expire_deadlines(admin_conn) == [(tenants.a, task_id)]
    assert (await tasks.get(pool, tenants.a, task_id)).state == "dead"


async def test_G21_the_sweep_ends_the_late_task_not_another_tenant_s_of_the_same_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "deadline rules": what the sweep ends. A task id is
    unique per tenant only (agent_tasks_pkey is (tenant_id, id)): tenant b may hold a task
    of the id of a's late one, and the sweep must leave it as it is. Kills
    edges-sweep-joins-by-id-alone (as gen-leases-lease_expire_deadlines-tenant-1)."""
    passed = await admin_conn.fetchval("SELECT now() - interval '1 second'")
    late = await F.create_task(admin_conn, tenants.a, deadline_at=passed)
    await F.create_task(admin_conn, tenants.b, id=late)  # no deadline: b's work
    assert await leases.expire_deadlines(pool) == [(tenants.a, late)]
    assert (await tasks.get(pool, tenants.a, late)).state == "dead"
    other = await tasks.get(pool, tenants.b, late)
    assert (other.state, other.state_version) == ("pending", 0)


@pytest.mark.plain_postgres("reads pg_stat_activity for the sweep's backend")
async def test_G21_the_sweep_skips_a_late_task_another_writer_holds(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection, db: Database,
) -> None:  # fmt: skip
    """Closes issue 35's blind class "deadline rules": the sweep against a writer that holds
    the late task - here a cancel, open in its transaction on another connection. The
    sweep neither waits for it nor ends the task under it (rows another writer holds are
    left for the next sweep), and once the cancel commits, the task is cancelled with one
    event and no sweep takes it. Kills edges-sweep-waits-for-a-held-task (as
    gen-leases-lease_expire_deadlines-lock-2) and edges-sweep-locks-nothing (as -lock-1),
    by the interleaving, observed in pg_stat_activity - not by a timeout."""
    passed = await admin_conn.fetchval("SELECT now() - interval '1 second'")
    late = await F.create_task(admin_conn, tenants.a, task_type="d-held", deadline_at=passed)
    sweeper = await db.connect()
    try:
        async with other_conn.transaction():
            cancelled = await tasks.cancel(other_conn, tenants.a, late, reason="withdrawn")
            assert cancelled.state == "cancelled"
            sweep = asyncio.ensure_future(leases.expire_deadlines(sweeper))
            await _pg.done_or_blocked(admin_conn, sweeper.get_server_pid(), sweep)
            assert sweep.done()  # it skipped the held row: it did not queue behind the cancel
            assert await sweep == []
        assert await leases.expire_deadlines(sweeper) == []
    finally:
        await sweeper.close()
    assert (await tasks.get(pool, tenants.a, late)).state == "cancelled"
    assert [e["event_type"] for e in await _events(admin_conn, late)] == [
        "test", "task.cancelled",
    ]  # fmt: skip


async def test_G21_a_task_finished_in_time_is_still_anonymised_after_its_deadline(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The guard holds back unfinished tasks (and a retry to pending) only: a task that
    succeeded in time is written to after its deadline when its tenant is deleted - its
    params anonymised, its state kept. Kills
    ``gen-0013.operator-agent_tasks_deadline_guard-and-2`` (the guard fired for every
    task with a deadline: the deletion's UPDATE of the finished task is refused as a late
    write, and the deletion with it)."""
    task = await _soon(pool, tenants.a, "d-done", params={"customer": "Ada Lovelace"})
    [held] = await leases.claim(pool, "w", task_types=["d-done"])
    done = await tasks.transition(
        pool, tenants.a, task.id, expected_version=held.state_version, to_state="succeeded",
        lease=held.lease,
    )  # fmt: skip
    await _passed(admin_conn, task.id)
    await delete_tenant(admin_conn, tenants.a, dry_run=False)
    row = await admin_conn.fetchrow(
        "SELECT state, state_version, params FROM agent_tasks WHERE tenant_id = $1 AND id = $2",
        tenants.a,
        task.id,
    )
    assert row is not None
    assert (row["state"], row["state_version"], json.loads(row["params"])) == (
        "succeeded",
        done.state_version + 1,
        {},
    )


async def test_G21_a_claim_passes_over_a_late_task_behind_a_due_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task past its deadline queued after the walk's first due task is inside the
    batch's range (lease_claim reads from ``first_wake`` on): the batch's own deadline
    test must refuse it. Kills the hand mutant ``deadline-claim-takes-late``."""
    due = await tasks.create(pool, tenants.a, "late-behind")
    late = await tasks.create(pool, tenants.a, "late-behind")
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the deadline guard is off
        await admin_conn.execute(
            "UPDATE agent_tasks SET deadline_at = now() - interval '1 s',"
            " wake_at = now() - interval '1 s' WHERE id = $1",
            late.id,
        )
        await admin_conn.execute(
            "UPDATE agent_tasks SET wake_at = now() - interval '2 s' WHERE id = $1", due.id
        )
    got = await leases.claim(pool, "w", batch=2, task_types=["late-behind"])
    assert [t.id for t in got] == [due.id]
