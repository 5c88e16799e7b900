"""Signals and approvals (G22): recorded once, in order, waking their task, read once.

The raw-SQL attacks on the triggers, keys and CHECKs are in tests/test_attacks.py
and the agent role's policy in tests/test_access.py; here the runtime and the
races: concurrent senders on separate connections, a signal against the wait
that would miss it (both orders, interleaved by lock waits observed in the
server), and a worker whose handler waits for an approval and reads each
signal once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import leases, retention, signals, tasks, tenancy
from agentdb.errors import (
    ConfigurationError,
    DeadlineExceeded,
    IdempotencyConflict,
    NotFound,
    SignalRuleViolation,
    TaskFinished,
)
from agentdb.models import Lease, Signal, Task
from agentdb.worker import Job, Succeed, Wait, Worker
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants

#: Schema objects shown at work here rather than by a refusal (tests/test_catalogue.py).
BEHAVIOUR_NAMES = {
    "agent_signals_deliver",
    # tests/test_access.py: what an agent learns by signalling another tenant's task.
    "agent_signals_access",
}


async def _claimed(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str) -> tuple[Task, Lease]:
    task = await tasks.create(pool, tenant, task_type)
    [held] = await leases.claim(pool, "holder", task_types=[task_type])
    assert held.id == task.id
    assert held.lease is not None
    return held, held.lease


async def _events(
    admin: asyncpg.Connection, task_id: uuid.UUID
) -> list[tuple[str, str, dict[str, object]]]:
    rows = await admin.fetch(
        "SELECT event_type, actor_id, payload FROM agent_events WHERE task_id = $1"
        " ORDER BY created_at, id",  # as the timelines: ids share a millisecond by chance
        task_id,
    )
    return [(r["event_type"], r["actor_id"], json.loads(r["payload"])) for r in rows]


def _due(task: Task) -> bool:
    return task.wake_at is not None and task.wake_at <= datetime.now(UTC)


async def test_G22_a_signal_is_recorded_once_per_key_with_its_event(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "s-once")
    first = await tasks.signal(pool, tenants.a, task.id, "note", {"n": 1}, dedupe_key="k1",
                               sender="ops")  # fmt: skip
    again = await tasks.signal(pool, tenants.a, task.id, "note", {"n": 1}, dedupe_key="k1",
                               sender="ops")  # fmt: skip
    assert (first.created, again.created, again.id, again.seq) == (True, False, first.id, 1)
    with pytest.raises(IdempotencyConflict):
        await tasks.signal(pool, tenants.a, task.id, "note", {"n": 2}, dedupe_key="k1",
                           sender="ops")  # fmt: skip
    unkeyed = await tasks.signal(pool, tenants.a, task.id, "note", {"n": 1})
    assert unkeyed.seq == 2
    assert [(e[0], e[1], e[2].get("seq")) for e in await _events(admin_conn, task.id)] == [
        ("task.created", "agentdb", None),
        ("task.signalled", "ops", 1),
        ("task.signalled", "agentdb", 2),
    ]
    assert [s.seq for s in await signals.received(pool, tenants.a, task.id)] == [1, 2]


async def test_G22_a_replayed_key_is_answered_even_after_the_task_finished(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "s-replay")
    first = await signals.approve(pool, tenants.a, task.id, approver="alice", dedupe_key="r")
    await tasks.cancel(pool, tenants.a, task.id)
    again = await signals.approve(pool, tenants.a, task.id, approver="alice", dedupe_key="r")
    assert (again.id, again.created, again.decision) == (first.id, False, "approved")
    with pytest.raises(TaskFinished):  # a new signal is refused: the task is over
        await signals.approve(pool, tenants.a, task.id, approver="alice", dedupe_key="r2")


async def test_G22_concurrent_senders_get_one_place_each_in_the_tasks_order(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "s-order")
    conns = [await asyncpg.connect(db.dsn) for _ in range(6)]
    try:
        sent = await asyncio.gather(
            *(tasks.signal(c, tenants.a, task.id, f"n{i}") for i, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    assert sorted(s.seq for s in sent) == [1, 2, 3, 4, 5, 6]
    history = await signals.received(pool, tenants.a, task.id)
    assert [s.seq for s in history] == [1, 2, 3, 4, 5, 6]
    assert {s.id for s in history} == {s.id for s in sent}


async def test_G22_a_waiting_task_is_woken_by_its_signal_and_not_by_another(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    held, lease = await _claimed(pool, tenants.a, "s-wake")
    waiting = await tasks.wait_for_signal(pool, held, "approval", lease=lease)
    assert (waiting.state, waiting.wake_at) == ("waiting", datetime.max)
    await tasks.signal(pool, tenants.a, held.id, "note")
    assert (await tasks.get(pool, tenants.a, held.id)).state == "waiting"  # not its name
    assert await leases.claim(pool, "w", task_types=["s-wake"]) == []
    approval = await signals.approve(pool, tenants.a, held.id, approver="alice", comment="ok")
    woken = await tasks.get(pool, tenants.a, held.id)
    assert (woken.state, woken.state_version) == ("pending", waiting.state_version + 1)
    assert (await _events(admin_conn, held.id))[-2:] == [
        ("task.approved", "alice", {"signal": "approval", "seq": 2, "signal_id": str(approval.id),
                                    "kind": "approval", "decision": "approved"}),
        ("task.woken", "alice", {"signal": "approval", "seq": 2}),
    ]  # fmt: skip
    [again] = await leases.claim(pool, "w", task_types=["s-wake"])
    assert again.id == held.id
    unread = await signals.unread(pool, tenants.a, held.id)
    assert [(s.name, s.kind, s.payload) for s in unread] == [
        ("note", "signal", {}), ("approval", "approval", {"comment": "ok"}),
    ]  # fmt: skip


async def test_G22_a_signal_sent_before_the_wait_makes_the_wait_due_at_once(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    held, lease = await _claimed(pool, tenants.a, "s-early")
    await signals.approve(pool, tenants.a, held.id, approver="alice")  # while it runs
    waiting = await tasks.wait_for_signal(pool, held, "approval", lease=lease)
    assert (waiting.state, _due(waiting)) == ("waiting", True)
    [again] = await leases.claim(pool, "w", task_types=["s-early"])
    assert again.id == held.id
    # Read (cursor past it), the same approval no longer ends a new wait: it sleeps.
    rerun = again.lease
    assert rerun is not None
    slept = await tasks.wait_for_signal(pool, again, "approval", lease=rerun, signals_read=1)
    assert slept.wake_at == datetime.max


async def test_G22_a_signal_committing_while_the_wait_waits_for_its_lock_wakes_it(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    runtime_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
) -> None:
    held, lease = await _claimed(pool, tenants.a, "s-race-1")
    async with runtime_conn.transaction():
        await signals.approve(runtime_conn, tenants.a, held.id, approver="alice")
        wait = asyncio.create_task(tasks.wait_for_signal(other_conn, held, "approval", lease=lease))
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    waited = await asyncio.wait_for(wait, 20)
    # Due at once, not lost.
    assert (waited.state, _due(waited)) == ("waiting", True)


async def test_G22_a_wait_committing_while_the_signal_waits_for_its_lock_is_woken(
    pool: asyncpg.Pool,
    tenants: Tenants,
    admin_conn: asyncpg.Connection,
    runtime_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
) -> None:
    held, lease = await _claimed(pool, tenants.a, "s-race-2")
    async with runtime_conn.transaction():
        await tasks.wait_for_signal(runtime_conn, held, "approval", lease=lease)
        send = asyncio.create_task(
            signals.approve(other_conn, tenants.a, held.id, approver="alice")
        )
        await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    await asyncio.wait_for(send, 20)
    woken = await tasks.get(pool, tenants.a, held.id)
    assert woken.state == "pending"
    assert [e[0] for e in await _events(admin_conn, held.id)][-3:] == [
        "task.waiting", "task.approved", "task.woken",
    ]  # fmt: skip


async def test_G22_the_database_refuses_what_a_task_may_not_be_sent(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    done = await tasks.create(pool, tenants.a, "s-refused")
    await tasks.cancel(pool, tenants.a, done.id)
    with pytest.raises(TaskFinished):
        await tasks.signal(pool, tenants.a, done.id, "note")
    late = await tasks.create(pool, tenants.a, "s-refused",
                              deadline=datetime.now(UTC) - timedelta(seconds=1))  # fmt: skip
    with pytest.raises(DeadlineExceeded):
        await tasks.signal(pool, tenants.a, late.id, "note")
    held, _ = await _claimed(pool, tenants.a, "s-self")
    with pytest.raises(SignalRuleViolation) as self_approval:
        await signals.approve(pool, tenants.a, held.id, approver="holder")
    assert self_approval.value.guarantee == "G22"
    await signals.approve(pool, tenants.a, held.id, approver="reviewer")  # control
    with pytest.raises(NotFound):  # another tenant's task: not there, for this tenant
        await signals.approve(pool, tenants.b, held.id, approver="reviewer")
    with pytest.raises(ConfigurationError):
        await signals.approve(pool, tenants.a, held.id, approver="reviewer", decision="maybe")
    with pytest.raises(ConfigurationError):
        Wait()


async def test_G22_the_cursor_only_moves_forward_to_a_signal_that_exists(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    held, lease = await _claimed(pool, tenants.a, "s-cursor")
    await tasks.signal(pool, tenants.a, held.id, "note")
    with pytest.raises(SignalRuleViolation):
        await tasks.wait_for_signal(pool, held, "go", lease=lease, signals_read=2)
    waiting = await tasks.wait_for_signal(pool, held, "go", lease=lease, signals_read=1)
    assert await signals.unread(pool, tenants.a, held.id) == []
    with pytest.raises(SignalRuleViolation):
        await tasks.transition(pool, tenants.a, held.id, expected_version=waiting.state_version,
                               to_state="pending", signals_read=0)  # fmt: skip


async def test_G22_a_worker_handler_waits_for_approval_and_reads_each_signal_once(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    runs: list[list[tuple[int, str]]] = []
    waiting = asyncio.Event()

    async def handler(job: Job) -> Wait | Succeed:
        seen = await job.signals()
        runs.append([(s.seq, s.name) for s in seen])
        if not any(s.kind == "approval" and s.decision == "approved" for s in seen):
            waiting.set()
            return Wait(signal="approval")
        return Succeed(payload={"approved_by": seen[-1].sender})

    task = await tasks.create(pool, tenants.a, "s-worker")
    worker = Worker(pool, {"s-worker": handler}, poll_interval=0.05)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await asyncio.wait_for(waiting.wait(), 20)
        await F.until(lambda: worker.stats.waiting == 1)
        await tasks.signal(pool, tenants.a, task.id, "note", {"text": "looks fine"})
        waiting.clear()
        # The note is not what it waits for; a rejection is, and it reads both, once.
        await signals.approve(pool, tenants.a, task.id, approver="bob", decision="rejected")
        await asyncio.wait_for(waiting.wait(), 20)
        await F.until(lambda: worker.stats.waiting == 2)
        await signals.approve(pool, tenants.a, task.id, approver="alice")
        await F.until(lambda: worker.stats.succeeded == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert runs == [[], [(1, "note"), (2, "approval")], [(3, "approval")]]
    done = await tasks.get(pool, tenants.a, task.id)
    assert done.state == "succeeded"


async def test_G22_a_tenants_signals_go_with_its_deletion_and_a_purged_task(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.b, "s-gone")
    sent: Signal = await tasks.signal(pool, tenants.b, task.id, "note")
    dry = await tenancy.delete_tenant(admin_conn, tenants.b, dry_run=True)
    assert [(s.object, s.affected) for s in dry.steps if s.step == 19] == [("agent_signals", 1)]
    await tenancy.delete_tenant(admin_conn, tenants.b, dry_run=False)
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_signals WHERE id = $1",
                                     sent.id) == 0  # fmt: skip
    # A purged task's signals go first (class 'signals', in bounded batches), once its
    # events have gone; the tasks purge skips a task with signals left, without failing.
    old = await tasks.create(pool, tenants.a, "s-purge")
    for n in range(5):
        await tasks.signal(pool, tenants.a, old.id, f"note-{n}")
    await tasks.cancel(pool, tenants.a, old.id)
    async with admin_conn.transaction():  # its events past retention, the task long over
        await F.replica_mode(admin_conn)
        await admin_conn.execute("DELETE FROM agent_events WHERE task_id = $1", old.id)
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '400 days' WHERE id = $1", old.id
        )
    kept = await retention.purge(admin_conn, classes=("tasks",))
    assert kept.removed["tasks"] == 0
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE id = $1", old.id) == 1
    report = await retention.purge(admin_conn, batch=2, classes=("signals", "tasks"))
    # 2 + 2 + 1 signals, one statement each; then the task (1 < 2: done). On Citus each
    # class runs tenant by tenant: every other tenant adds one empty step per class.
    assert (report.removed["signals"], report.removed["tasks"]) == (5, 1)
    others = await admin_conn.fetchval("SELECT count(*) - 1 FROM agent_tenants")
    assert report.statements == 4 + (2 * others if _pg.ON_CITUS else 0)
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE id = $1", old.id) == 0


async def test_G22_a_past_holder_cannot_approve_the_work_it_did(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """agent_signals_guard: the holder waits (its lease released), then tries to approve."""
    held, lease = await _claimed(pool, tenants.a, "s-past-holder")
    await tasks.wait_for_signal(pool, held, "approval", lease=lease)
    assert (await tasks.get(pool, tenants.a, held.id)).lease_owner is None
    with pytest.raises(SignalRuleViolation) as refused:
        await signals.approve(pool, tenants.a, held.id, approver="holder")
    assert refused.value.sqlstate == "AG014"
    # Citus drops the constraint field of a worker's error (README, "Scaling out with Citus").
    assert refused.value.constraint == (None if _pg.ON_CITUS else "agent_signals_guard")
    # Control: a reviewer who never held it approves, and the task wakes.
    await signals.approve(pool, tenants.a, held.id, approver="reviewer")
    assert (await tasks.get(pool, tenants.a, held.id)).state == "pending"


async def test_G22_signals_are_read_after_a_place_and_per_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """``received(after=n)`` starts past place n; a task's unread signals are its own, not
    another task's of the tenant. Kills generated ``gen-signals-signal_list-cmp-3``
    (``seq >= after``: place n read again), ``gen-signals-signal_unread-and-2`` (every
    task's unread signals) and ``gen-signals-signal_list-and-1`` (every task's history)."""
    mine = await tasks.create(pool, tenants.a, "s-read")
    other = await tasks.create(pool, tenants.a, "s-read")
    for name in ("one", "two"):
        await tasks.signal(pool, tenants.a, mine.id, name)
    await tasks.signal(pool, tenants.a, other.id, "theirs")
    assert [s.name for s in await signals.received(pool, tenants.a, mine.id, after=1)] == ["two"]
    assert [s.name for s in await signals.received(pool, tenants.a, mine.id)] == ["one", "two"]
    assert [s.name for s in await signals.unread(pool, tenants.a, mine.id)] == ["one", "two"]


async def test_G2_G22_a_task_s_signals_are_its_own_tenant_s_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Task ids are the caller's: tenants a and b each have a task of one id, each sent
    signals. a's history of it is a's alone. Kills generated
    ``gen-signals-signal_list-tenant-1`` (the signals read by task id alone: b's in a's
    history, at the same places)."""
    shared = uuid.uuid4()
    for tenant, names in ((tenants.a, ("one", "two")), (tenants.b, ("theirs",))):
        await tasks.create(pool, tenant, "s-twin", task_id=shared)
        for name in names:
            await tasks.signal(pool, tenant, shared, name)
    got = await signals.received(pool, tenants.a, shared)
    assert [(s.tenant_id, s.seq, s.name) for s in got] == [
        (tenants.a, 1, "one"),
        (tenants.a, 2, "two"),
    ]
