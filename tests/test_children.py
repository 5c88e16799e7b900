"""Child tasks (G23): once per key, in the parent's tenant, the parent woken exactly once.

The raw-SQL attacks on the keys, CHECKs and the child guard are in
tests/test_attacks.py; here the fan-in: children finishing at once on
separate connections (the parent is woken once, by whichever commits last),
a wait that begins after its children finished, a quorum, the worker's
fan-out and fan-in, and retention keeping a parent while its children stay.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import children, leases, retention, tasks
from agentdb.errors import (
    ConfigurationError,
    DeadlineExceeded,
    IdempotencyConflict,
    InvariantViolation,
    TaskFinished,
    TenantMismatch,
)
from agentdb.models import Lease, Task
from agentdb.worker import Job, Succeed, Wait, Worker
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants

#: Schema objects shown at work here rather than by a refusal (tests/test_catalogue.py).
BEHAVIOUR_NAMES = {"agent_tasks_fan_in", "agent_tasks_children_guard", "agent_tasks_keep_parent"}


async def _held(pool: asyncpg.Pool, tenant: uuid.UUID, task_type: str) -> tuple[Task, Lease]:
    task = await tasks.create(pool, tenant, task_type)
    [held] = await leases.claim(pool, "parent-worker", task_types=[task_type])
    assert held.id == task.id
    assert held.lease is not None
    return held, held.lease


async def _wakes(admin: asyncpg.Connection, task_id: uuid.UUID) -> list[str]:
    rows = await admin.fetch(
        "SELECT payload FROM agent_events WHERE task_id = $1 AND event_type = 'task.children_done'",
        task_id,
    )
    return [r["payload"] for r in rows]


async def _finish_claimed(
    conn: asyncpg.Connection | asyncpg.Pool, child: Task, to_state: str
) -> None:
    assert child.lease is not None
    await tasks.transition(conn, child.tenant_id, child.id, expected_version=child.state_version,
                           to_state=to_state, lease=child.lease,
                           payload={"line": child.params.get("line")})  # fmt: skip


async def test_G23_a_child_is_created_once_per_key_in_its_parents_tenant(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    parent, _ = await _held(pool, tenants.a, "c-parent")
    first = await children.spawn(pool, parent, "c-line", "line-1", params={"line": 1})
    again = await children.spawn(pool, parent, "c-line", "line-1", params={"line": 1})
    assert (first.created, again.created, again.id) == (True, False, first.id)
    with pytest.raises(IdempotencyConflict):
        await children.spawn(pool, parent, "c-line", "line-1", params={"line": 2})
    with pytest.raises(TenantMismatch):  # tenant b has no such parent
        await tasks.create(pool, tenants.b, "c-line", parent=parent.id, child_key="x")
    with pytest.raises(ConfigurationError):
        await tasks.create(pool, tenants.a, "c-line", child_key="orphan")
    assert [(c.key, c.task.id) for c in await children.children(pool, tenants.a, parent.id)] == [
        ("line-1", first.id)
    ]


async def test_G23_a_finished_parent_takes_no_new_child(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    parent = await tasks.create(pool, tenants.a, "c-over")
    await tasks.cancel(pool, tenants.a, parent.id)
    with pytest.raises(TaskFinished):
        await children.spawn(pool, parent, "c-line", "late")


async def test_G23_a_parent_past_its_deadline_takes_no_new_child(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    soon = await tasks.create(
        pool, tenants.a, "c-late", deadline=datetime.now(UTC) + timedelta(days=1)
    )
    assert (await children.spawn(pool, soon, "c-line", "in-time")).created  # control
    late = await tasks.create(
        pool, tenants.a, "c-late", deadline=datetime.now(UTC) - timedelta(seconds=1)
    )
    with pytest.raises(DeadlineExceeded) as refused:
        await children.spawn(pool, late, "c-line", "too-late")
    # Citus drops the constraint field of a worker's error (README, "Scaling out with Citus").
    assert refused.value.constraint == (None if _pg.ON_CITUS else "agent_tasks_child_guard")


async def test_G23_no_task_takes_a_childs_key_before_its_parent_creates_it(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """agent_tasks_child_dedupe_reserved: a squatter on 'child/<parent>/<key>' would be the
    answer the parent's own creation of that child got back."""
    parent = await tasks.create(pool, tenants.a, "c-squat")
    with pytest.raises(InvariantViolation) as refused:
        await tasks.create(pool, tenants.a, "evil", dedupe_key=f"child/{parent.id}/line-1")
    assert refused.value.constraint == "agent_tasks_child_dedupe_reserved"
    child = await children.spawn(pool, parent, "c-line", "line-1")
    assert (child.created, child.task_type) == (True, "c-line")


async def _finish_in_tx(conn: asyncpg.Connection, child: Task, go: asyncio.Event) -> None:
    async with conn.transaction():
        await _finish_claimed(conn, child, "succeeded")
        await go.wait()


async def test_G23_the_last_of_many_concurrent_finishes_wakes_the_parent_once(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    parent, lease = await _held(pool, tenants.a, "c-race")
    n = 5
    for i in range(n):
        await children.spawn(pool, parent, "c-race-line", f"line-{i}", params={"line": i})
    await children.wait_for(pool, parent, lease=lease)
    claimed = await leases.claim(pool, "line-worker", batch=n, task_types=["c-race-line"])
    assert len(claimed) == n
    conns = [await asyncpg.connect(db.dsn) for _ in range(n)]
    go = asyncio.Event()
    try:
        finishes = [
            asyncio.create_task(_finish_in_tx(c, t, go))
            for c, t in zip(conns, claimed, strict=True)
        ]
        # Whichever finish locked the parent first holds it; the other four wait for it,
        # observed in the server.
        await F.wait_until_n_blocked(admin_conn, [c.get_server_pid() for c in conns], n - 1)
        go.set()  # all commit, one after the other through the parent's row lock
        await asyncio.wait_for(asyncio.gather(*finishes), 30)
    finally:
        for c in conns:
            await c.close()
    wakes = await _wakes(admin_conn, parent.id)
    assert len(wakes) == 1, wakes
    assert json.loads(wakes[0])["waited_for"] == n
    woken = await tasks.get(pool, tenants.a, parent.id)
    assert (woken.state, woken.state_version) == ("pending", parent.state_version + 2)
    results = await children.children(pool, tenants.a, parent.id)
    assert sorted(c.result["line"] for c in results if c.result) == list(range(n))


async def test_G23_a_wait_that_begins_after_the_children_finished_is_due_at_once(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    parent, lease = await _held(pool, tenants.a, "c-late-wait")
    for i in range(2):
        await children.spawn(pool, parent, "c-late-line", f"l{i}", params={"line": i})
    for child in await leases.claim(pool, "w", batch=2, task_types=["c-late-line"]):
        await _finish_claimed(pool, child, "failed")  # a failed child has finished too
    waiting = await children.wait_for(pool, parent, lease=lease)
    assert waiting.wake_at is not None
    assert waiting.wake_at <= datetime.now(UTC)
    [again] = await leases.claim(pool, "w", task_types=["c-late-wait"])
    assert again.id == parent.id
    assert await _wakes(admin_conn, parent.id) == []  # due by its own wait, not woken


async def test_G23_a_quorum_wakes_the_parent_once_and_later_finishes_do_nothing(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    parent, lease = await _held(pool, tenants.a, "c-quorum")
    for i in range(3):
        await children.spawn(pool, parent, "c-quorum-line", f"q{i}", params={"line": i})
    with pytest.raises(ConfigurationError):
        await children.wait_for(pool, parent, lease=lease, finished=4)
    await children.wait_for(pool, parent, lease=lease, finished=2)
    lines = await leases.claim(pool, "w", batch=3, task_types=["c-quorum-line"])
    await _finish_claimed(pool, lines[0], "succeeded")
    assert (await tasks.get(pool, tenants.a, parent.id)).state == "waiting"
    await _finish_claimed(pool, lines[1], "succeeded")
    assert (await tasks.get(pool, tenants.a, parent.id)).state == "pending"
    await _finish_claimed(pool, lines[2], "succeeded")
    assert len(await _wakes(admin_conn, parent.id)) == 1


async def test_G23_a_worker_fans_out_and_is_woken_by_the_last_child(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    runs: list[int] = []

    async def order(job: Job) -> Wait | Succeed:
        done = await job.children()
        runs.append(len(done))
        if not done:
            for i in range(4):
                await job.spawn("c-w-line", f"line-{i}", {"line": i})
            return Wait(children=True)
        total = sum(c.result["amount"] for c in done if c.result)
        return Succeed(payload={"total": total})

    async def line(job: Job) -> Succeed:
        return Succeed(payload={"amount": 10 * job.task.params["line"]})

    parent = await tasks.create(pool, tenants.a, "c-w-order")
    worker = Worker(pool, {"c-w-order": order, "c-w-line": line}, poll_interval=0.05,
                    concurrency=4)  # fmt: skip
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await F.until(lambda: worker.stats.succeeded == 5)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert runs == [0, 4]
    rows = await admin_conn.fetch(
        "SELECT event_type, payload FROM agent_events WHERE task_id = $1 ORDER BY id", parent.id
    )
    assert [r["event_type"] for r in rows].count("task.children_done") == 1
    # (By type, not by id: on Citus event ids come from each node's own sequence range.)
    [done] = [r for r in rows if r["event_type"] == "task.succeeded"]
    assert json.loads(done["payload"]) == {"total": 60}


async def test_G23_retention_keeps_a_parent_while_its_children_stay(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    parent = await tasks.create(pool, tenants.a, "c-keep")
    child = await children.spawn(pool, parent, "c-keep-line", "only")
    for t in (parent, child):
        await tasks.cancel(pool, tenants.a, t.id)
    async with admin_conn.transaction():  # the parent's events past retention, the child's not
        await F.replica_mode(admin_conn)
        await admin_conn.execute("DELETE FROM agent_events WHERE task_id = $1", parent.id)
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '400 days'"
            " WHERE id = ANY ($1::uuid[])",
            [parent.id, child.id],
        )
    # And a parent past retention whose child, without events, has not finished: only the
    # purge's own rule keeps that parent (deleting it would orphan a live child).
    other = await tasks.create(pool, tenants.a, "c-keep")
    live = await children.spawn(pool, other, "c-keep-line", "live")
    await tasks.cancel(pool, tenants.a, other.id)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "DELETE FROM agent_events WHERE task_id = ANY ($1::uuid[])", [other.id, live.id]
        )
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '400 days' WHERE id = $1",
            other.id,
        )
    await retention.purge(admin_conn, classes=("tasks",))
    left = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_tasks WHERE id = ANY ($1::uuid[])",
        [parent.id, child.id, other.id, live.id],
    )
    assert left == 4  # the child keeps its events, the parent its child; the live one too
    # A raw delete of the parent is refused by nothing and does nothing: the row stays.
    assert await admin_conn.execute("DELETE FROM agent_tasks WHERE id = $1", parent.id) == (
        "DELETE 0"
    )
    async with admin_conn.transaction():  # now the child's events have passed too
        await F.replica_mode(admin_conn)
        await admin_conn.execute("DELETE FROM agent_events WHERE task_id = $1", child.id)
    await retention.purge(admin_conn, classes=("tasks",))
    await retention.purge(admin_conn, classes=("tasks",))  # the child, then its parent
    left = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_tasks WHERE id = ANY ($1::uuid[])", [parent.id, child.id]
    )
    assert left == 0
