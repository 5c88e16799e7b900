"""Child tasks (G23): once per key, in the parent's tenant, the parent woken exactly once.

The raw-SQL attacks on the keys, CHECKs and the child guard are in
tests/test_attacks.py; here the fan-in: children finishing at once on
separate connections (the parent is woken once, by whichever commits last),
a wait that begins after its children finished, a quorum, children that end
other than by success (failed, cancelled, swept dead) and what the parent reads
of them, a parent whose deadline passes while it waits, a child made while its
parent finishes (two connections, both orders), the worker's fan-out and
fan-in, and retention keeping a parent while its children stay.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

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
from agentdb.testing import drain
from agentdb.worker import Job, Succeed, Wait, Worker
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants

T_ = TypeVar("T_")

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


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled", "dead"])
async def test_G23_a_finished_parent_takes_no_new_child(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, end: str
) -> None:
    """Every way a parent ends, not only a cancel: closes issue 35's blind class "children
    that end other than by success" for agent_tasks_child_guard's list of ends - kills
    gen-0006.control_flow-agentdb_guard_child-list-1, -list-2 and -list-4 (a succeeded,
    failed or dead parent takes a child; their mapped attack only cancels the parent)."""
    parent = await tasks.create(pool, tenants.a, "c-over")
    if end in ("succeeded", "failed"):
        [held] = await leases.claim(pool, "parent-worker", task_types=["c-over"])
        assert held.lease is not None
        await tasks.transition(pool, tenants.a, held.id, expected_version=held.state_version,
                               to_state=end, lease=held.lease)  # fmt: skip
    elif end == "cancelled":
        await tasks.cancel(pool, tenants.a, parent.id)
    else:  # as the claim path buries a task whose attempts are used up
        await F.update_task(admin_conn, tenants.a, parent.id, state="dead",
                            state_version=parent.state_version + 1)  # fmt: skip
    assert (await tasks.get(pool, tenants.a, parent.id)).state == end
    with pytest.raises(TaskFinished):
        await children.spawn(pool, parent, "c-line", "late")
    assert await children.count(pool, tenants.a, parent.id) == 0


async def test_G23_a_parent_past_its_deadline_takes_no_new_child(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
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
    # A deadline at the spawn's own instant has passed too: the clock is the database's, a
    # write's instant its transaction's start (docs/guides/cancellation.md, "Whose clock").
    # Kills gen-0006.control_flow-agentdb_guard_child-cmp-3 (`<` for `<=`).
    edge = await tasks.create(
        pool, tenants.a, "c-late", deadline=datetime.now(UTC) + timedelta(days=1)
    )
    async with admin_conn.transaction():
        now = await admin_conn.fetchval("SELECT now()")
        await F.update_task(admin_conn, tenants.a, edge.id, deadline_at=now,
                            state_version=edge.state_version + 1)  # fmt: skip
        with pytest.raises(DeadlineExceeded):
            await children.spawn(admin_conn, edge, "c-line", "on-the-dot")
    assert await children.count(pool, tenants.a, edge.id) == 0


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


class _Calls(list[asyncio.Task[Any]]):
    """The concurrent calls a test started, to be waited for before their connections close."""

    def add(self, call: Coroutine[Any, Any, T_]) -> asyncio.Task[T_]:
        task = asyncio.create_task(call)
        self.append(task)
        return task


async def _reached(flag: asyncio.Event, call: asyncio.Task[Any]) -> None:
    """Until ``call`` sets ``flag`` (its write is in, its transaction open); its error if it
    ends first."""
    flagged = asyncio.create_task(flag.wait())
    await asyncio.wait({flagged, call}, return_when=asyncio.FIRST_COMPLETED)
    if not flag.is_set():
        flagged.cancel()
        call.result()
        raise AssertionError("ended without reaching its flag")


async def _waits_for_a_lock(
    admin: asyncpg.Connection,
    conn: asyncpg.Connection,
    call: asyncio.Task[Any],
    past: asyncio.Event,
) -> bool:
    """Whether ``call`` on ``conn`` waits on a lock (True) or gets ``past`` its write without
    waiting (False) - observed in the server, not slept for (on Citus: on a worker, on its
    behalf)."""
    query = (
        "SELECT count(*) > 0 FROM citus_lock_waits WHERE waiting_gpid % 10000000000 = $1"
        if _pg.ON_CITUS
        else "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
    )
    pid = conn.get_server_pid()
    for _ in range(2000):
        if past.is_set():
            return False
        if call.done():
            call.result()  # its error
            return False
        if await admin.fetchval(query, pid):
            return True
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} neither blocked on a lock nor got past its write")


@pytest.mark.parametrize("first", ["finish", "spawn"])
async def test_G23_a_child_made_while_its_parent_finishes_is_refused_or_came_first(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection,
    first: str,
) -> None:  # fmt: skip
    """Closes issue 35's blind class "a child created while its parent finishes": the
    parent's finishing transaction and a child's insert on two connections take turns on
    the parent's row (the child guard's FOR SHARE against the finish's row lock), so a
    child is either refused by the finished parent or was there before the finish - never
    inserted beside a finish it did not see. ``finish`` first: the spawn waits for it, then
    raises TaskFinished. ``spawn`` first: the finish waits for the child's transaction,
    then goes on. Kills gen-0006.control_flow-agentdb_guard_child-lock-1 (the guard reads
    the parent without the lock: the spawn reads 'running' and inserts beside the finish)."""
    parent, lease = await _held(pool, tenants.a, "c-racing-parent")
    finisher, spawner = await db.connect(), await db.connect()
    finished, spawned, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    calls = _Calls()

    async def finish() -> None:
        async with finisher.transaction():
            await tasks.transition(finisher, tenants.a, parent.id, to_state="succeeded",
                                   expected_version=parent.state_version, lease=lease)  # fmt: skip
            finished.set()  # written, not committed
            await go.wait()

    async def spawn() -> Task:
        async with spawner.transaction():
            child = await children.spawn(spawner, parent, "c-racing-kid", "k")
            spawned.set()
            await go.wait()
        return child

    try:
        if first == "finish":
            finishing = calls.add(finish())
            await _reached(finished, finishing)
            spawning = calls.add(spawn())
            assert await _waits_for_a_lock(admin_conn, spawner, spawning, spawned), (
                "the spawn went on beside an uncommitted finish of its parent"
            )
            go.set()
            await asyncio.wait_for(finishing, 30)
            with pytest.raises(TaskFinished):
                await asyncio.wait_for(spawning, 30)
            assert await children.count(pool, tenants.a, parent.id) == 0
        else:
            spawning = calls.add(spawn())
            await _reached(spawned, spawning)
            finishing = calls.add(finish())
            assert await _waits_for_a_lock(admin_conn, finisher, finishing, finished), (
                "the parent finished beside a child's uncommitted insert"
            )
            go.set()
            child = await asyncio.wait_for(spawning, 30)
            await asyncio.wait_for(finishing, 30)
            kids = await children.children(pool, tenants.a, parent.id)
            assert [c.task.id for c in kids] == [child.id]
    finally:
        go.set()  # both transactions end before their connections close
        await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        await finisher.close()
        await spawner.close()
    assert (await tasks.get(pool, tenants.a, parent.id)).state == "succeeded"


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


async def test_G23_a_child_that_only_starts_leaves_its_waiting_parent_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Only a child's finish counts for its parent: one claimed (or otherwise moved short of
    an end) writes nothing to it. Seen on a parent due by its own wait (its quorum had
    finished before it waited), which the fan-in would otherwise wake a second time. Kills
    the hand mutant children-fan-in-on-any-move (twin of
    gen-0006.control_flow-agent_tasks_fan_in-and-2, the fan-in's WHEN without its test of
    the new state, whose mapped tests claim no child of a waiting parent)."""
    parent, lease = await _held(pool, tenants.a, "c-start")
    await children.spawn(pool, parent, "c-start-done", "done")
    await children.spawn(pool, parent, "c-start-open", "open")
    [done] = await leases.claim(pool, "w", task_types=["c-start-done"])
    await _finish_claimed(pool, done, "succeeded")
    waiting = await children.wait_for(pool, parent, lease=lease, finished=1)
    assert waiting.wake_at is not None
    assert waiting.wake_at <= datetime.now(UTC)  # due at once, not woken
    [started] = await leases.claim(pool, "w", task_types=["c-start-open"])
    assert started.state == "running"
    still = await tasks.get(pool, tenants.a, parent.id)
    assert (still.state, still.state_version) == ("waiting", waiting.state_version)
    assert await _wakes(admin_conn, parent.id) == []


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled", "dead"])
async def test_G23_a_finished_child_written_again_leaves_its_waiting_parent_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, end: str
) -> None:
    """A child counts for its parent once, when it finishes: a later write that keeps it
    in its end state (progress recorded on the finished task, ``to_state`` its own state)
    is no finish. Seen on a parent due by its own wait (its quorum had finished before it
    waited), which the fan-in would otherwise wake with a children_done naming the child
    as the last to finish. Kills generated
    ``gen-0006.control_flow-agent_tasks_fan_in-list-5`` .. ``-list-8`` (the fan-in's WHEN
    not excluding an OLD state of 'succeeded', 'failed', 'cancelled' or 'dead')."""
    parent, lease = await _held(pool, tenants.a, "c-again")
    await children.spawn(pool, parent, "c-again-done", "done")
    await children.spawn(pool, parent, "c-again-open", "open")
    [done] = await leases.claim(pool, "w", task_types=["c-again-done"])
    await _finish_claimed(pool, done, end)
    waiting = await children.wait_for(pool, parent, lease=lease, finished=1)
    assert waiting.wake_at is not None
    assert waiting.wake_at <= datetime.now(UTC)  # due at once, not woken
    finished = await tasks.get(pool, tenants.a, done.id)
    again = await tasks.transition(
        pool, tenants.a, done.id, expected_version=finished.state_version,
        to_state=end, step="noted", actor="operator",
    )  # fmt: skip
    assert (again.state, again.current_step) == (end, "noted")
    still = await tasks.get(pool, tenants.a, parent.id)
    assert (still.state, still.state_version) == ("waiting", waiting.state_version)
    assert await _wakes(admin_conn, parent.id) == []


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


async def test_G23_a_parent_counts_its_own_tenants_children_not_a_twin_parents(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A task id is unique per tenant only (agent_tasks_pkey is (tenant_id, id)) and
    tasks.create takes the caller's: b's parent may share the id of a's. a's parent waits
    for both of its two children; b's twin has one child, finished. a's first child
    finishing leaves a's parent waiting - one of its two. Kills
    ``gen-0006.control_flow-agentdb_children_done-tenant-1`` (children counted by parent
    id alone: b's finished child made a's count two, and a's parent woke after one)."""
    twin = uuid.uuid4()
    a_parent = await tasks.create(pool, tenants.a, "c-twin-a", task_id=twin)
    b_parent = await tasks.create(pool, tenants.b, "c-twin-b", task_id=twin)
    [a_held] = await leases.claim(pool, "w", task_types=["c-twin-a"])
    [b_held] = await leases.claim(pool, "w", task_types=["c-twin-b"])
    assert (a_held.id, b_held.id) == (a_parent.id, b_parent.id) == (twin, twin)
    assert a_held.lease is not None
    await children.spawn(pool, b_held, "c-twin-b-line", "only")
    [b_child] = await leases.claim(pool, "w", task_types=["c-twin-b-line"])
    await _finish_claimed(pool, b_child, "succeeded")
    for i in range(2):
        await children.spawn(pool, a_held, "c-twin-a-line", f"l{i}", params={"line": i})
    await children.wait_for(pool, a_held, lease=a_held.lease, finished=2)
    assert (await tasks.get(pool, tenants.a, twin)).state == "waiting"
    lines = await leases.claim(pool, "w", batch=2, task_types=["c-twin-a-line"])
    await _finish_claimed(pool, lines[0], "succeeded")
    assert (await tasks.get(pool, tenants.a, twin)).state == "waiting"
    await _finish_claimed(pool, lines[1], "succeeded")
    assert (await tasks.get(pool, tenants.a, twin)).state == "pending"


@pytest.mark.parametrize("end", ["failed", "cancelled", "dead"])
async def test_G23_a_child_that_ends_other_than_by_success_wakes_its_waiting_parent(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, end: str
) -> None:
    """Closes issue 35's blind class "a child that finishes other than by success, and the
    parent waiting on it": the last child to end - failed by its holder, cancelled from
    outside, or swept dead past its own deadline - wakes the parent once, and the parent
    reads how it ended. Kills gen-0006.control_flow-agent_tasks_fan_in-list-2, -list-3,
    -list-4 (the fan-in's WHEN without 'failed', 'cancelled', 'dead'; their mapped tests
    miss -list-2 and -list-4, so the hand twins children-fan-in-skips-a-failed-child and
    children-fan-in-skips-a-dead-child run this test) and
    gen-0006.control_flow-agentdb_children_done-list-3, -list-4 (the count without
    'cancelled', 'dead'); and, through the finished task of the same tenant that is no
    child, gen-0006.control_flow-agentdb_children_done-and-1 (counting the tenant's
    finished tasks) and gen-0006.control_flow-agentdb_fan_in-and-1 (locking the tenant's
    first task as the parent)."""
    stranger = await tasks.create(pool, tenants.a, "c-end-stranger")
    await tasks.cancel(pool, tenants.a, stranger.id)
    parent, lease = await _held(pool, tenants.a, "c-end")
    ok = await children.spawn(pool, parent, "c-end-ok", "ok", params={"line": 0})
    other = await children.spawn(pool, parent, "c-end-other", "other", params={"line": 1},
                                 deadline=datetime.now(UTC) + timedelta(days=1))  # fmt: skip
    waiting = await children.wait_for(pool, parent, lease=lease)
    [held_ok] = await leases.claim(pool, "w", task_types=["c-end-ok"])
    assert held_ok.id == ok.id
    await _finish_claimed(pool, held_ok, "succeeded")
    assert (await tasks.get(pool, tenants.a, parent.id)).state == "waiting"  # one of two
    if end == "failed":
        [held] = await leases.claim(pool, "w", task_types=["c-end-other"])
        await _finish_claimed(pool, held, "failed")
    elif end == "cancelled":
        await tasks.cancel(pool, tenants.a, other.id, reason="customer withdrew")
    else:
        passed = await admin_conn.fetchval("SELECT now() - interval '1 second'")
        await F.update_task(admin_conn, tenants.a, other.id, deadline_at=passed,
                            state_version=other.state_version + 1)  # fmt: skip
        assert await leases.expire_deadlines(pool) == [(tenants.a, other.id)]
    woken = await tasks.get(pool, tenants.a, parent.id)
    assert (woken.state, woken.state_version) == ("pending", waiting.state_version + 1)
    [wake] = await _wakes(admin_conn, parent.id)
    assert json.loads(wake) == {"waited_for": 2, "last_child": str(other.id)}
    got = await children.children(pool, tenants.a, parent.id)
    assert [(c.key, c.task.state) for c in got] == [("ok", "succeeded"), ("other", end)]
    assert got[0].result == {"line": 0}
    assert got[1].result is not None  # its finishing event's payload: how it ended
    [again] = await leases.claim(pool, "w", task_types=["c-end"])
    assert again.id == parent.id


@pytest.mark.parametrize("deadline", ["passed", "at_the_finish"])
async def test_G23_a_child_finishing_after_its_waiting_parents_deadline_leaves_it_to_the_sweep(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, deadline: str
) -> None:
    """Closes issue 35's blind class "a parent whose own deadline passes while it waits for
    children": the last child still finishes - its finish is not refused for the parent's
    sake - and does not wake the late parent (G21 allows it only to end); the sweep ends
    it. ``at_the_finish``: the deadline is the finishing transaction's own instant, which
    has passed. Kills the hand mutant children-fan-in-wakes-a-late-parent (the fan-in
    without its deadline test: the wake is refused, and with it the child's finish) and
    gen-0006.control_flow-agentdb_fan_in-cmp-3 (`<` for `<=`: at the deadline's instant)."""
    parent = await tasks.create(
        pool, tenants.a, "c-late-parent", deadline=datetime.now(UTC) + timedelta(days=1)
    )
    [held] = await leases.claim(pool, "parent-worker", task_types=["c-late-parent"])
    assert held.lease is not None
    await children.spawn(pool, held, "c-late-kid", "only", params={"line": 7})
    waiting = await children.wait_for(pool, held, lease=held.lease)
    [kid] = await leases.claim(pool, "w", task_types=["c-late-kid"])
    if deadline == "passed":
        passed = await admin_conn.fetchval("SELECT now() - interval '1 second'")
        await F.update_task(admin_conn, tenants.a, parent.id, deadline_at=passed,
                            state_version=waiting.state_version + 1)  # fmt: skip
        await _finish_claimed(pool, kid, "succeeded")
    else:
        async with admin_conn.transaction():
            now = await admin_conn.fetchval("SELECT now()")
            await F.update_task(admin_conn, tenants.a, parent.id, deadline_at=now,
                                state_version=waiting.state_version + 1)  # fmt: skip
            await _finish_claimed(admin_conn, kid, "succeeded")
    [done] = await children.children(pool, tenants.a, parent.id)
    assert (done.task.state, done.result) == ("succeeded", {"line": 7})
    late = await tasks.get(pool, tenants.a, parent.id)
    assert (late.state, late.state_version) == ("waiting", waiting.state_version + 1)
    assert await _wakes(admin_conn, parent.id) == []
    assert await leases.claim(pool, "w", task_types=["c-late-parent"]) == []
    assert await leases.expire_deadlines(pool) == [(tenants.a, parent.id)]
    ended = await admin_conn.fetchrow(
        "SELECT event_type, from_state, to_state FROM agent_events WHERE task_id = $1"
        " AND task_state_version = $2",
        parent.id,
        late.state_version + 1,
    )
    assert ended is not None
    assert tuple(ended) == ("task.deadline_passed", "waiting", "dead")


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


async def test_G23_a_parent_reads_how_each_child_ended_not_only_the_successes(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "a child that finishes other than by success" on the
    parent's side: ``job.run_children`` hands back every child - one cancelled from
    outside, one swept dead past its deadline - with its state, ``succeeded`` false and
    its error (docs/guides/children.md, "Results"). Kills the hand mutants
    children-result-succeeded-unless-failed (``ChildResult.succeeded`` true for any end but
    'failed') and children-result-drops-the-error (the snapshot without the child's
    ``last_error``)."""
    seen: list[list[tuple[str, str, bool, str | None]]] = []

    async def order(job: Job) -> Succeed:
        kids = await job.run_children(
            "k", [("c-r-ok", {"n": 1}), ("c-r-gone", None), ("c-r-late", None)]
        )
        seen.append([(k.key, k.state, k.succeeded, k.error) for k in kids])
        return Succeed()

    async def ok(job: Job) -> Succeed:
        return Succeed(payload=job.task.params)

    handlers = {"c-r-order": order, "c-r-ok": ok}  # nothing runs the other two
    parent = await tasks.create(pool, tenants.a, "c-r-order")
    await drain(pool, handlers, within=30)
    assert seen == []
    assert (await tasks.get(pool, tenants.a, parent.id)).state == "waiting"  # for 3, 1 done
    kids = {c.key: c.task for c in await children.children(pool, tenants.a, parent.id)}
    await tasks.cancel(pool, tenants.a, kids["k/1"].id, reason="customer withdrew")
    late = kids["k/2"]
    passed = await admin_conn.fetchval("SELECT now() - interval '1 second'")
    await F.update_task(admin_conn, tenants.a, late.id, deadline_at=passed,
                        state_version=late.state_version + 1)  # fmt: skip
    assert await leases.expire_deadlines(pool) == [(tenants.a, late.id)]
    swept = (await tasks.get(pool, tenants.a, late.id)).last_error
    assert swept is not None
    assert swept.startswith("deadline passed at ")
    await drain(pool, handlers, within=30)
    assert seen == [
        [
            ("k/0", "succeeded", True, None),
            ("k/1", "cancelled", False, "cancelled: customer withdrew"),
            ("k/2", "dead", False, swept),
        ]
    ]
    assert (await tasks.get(pool, tenants.a, parent.id)).state == "succeeded"


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


async def test_G2_G23_a_parent_s_children_are_its_own_tenant_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenant b's parent of the id of a's (create takes the caller's ids) has a child of
    its own: a's parent lists only its own. Kills generated
    ``gen-children-child_list-tenant-2`` (the children looked up by parent id alone)."""
    parent = await tasks.create(pool, tenants.a, "parent")
    await tasks.create(pool, tenants.b, "parent", task_id=parent.id)
    mine = await tasks.create(pool, tenants.a, "child", parent=parent.id, child_key="c")
    await tasks.create(pool, tenants.b, "child", parent=parent.id, child_key="c")
    assert [c.task.id for c in await children.children(pool, tenants.a, parent.id)] == [mine.id]


async def test_G2_G23_a_wait_for_all_its_children_counts_its_own_not_a_twin_parent_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenant b's parent of the same id as a's has two children, a's has one: a's count is
    one, so a wait for all of them waits for that one (a wait for two is refused), and its
    finishing wakes a's parent. Kills generated ``gen-children-child_count-tenant-1``
    (children counted by parent id alone: three)."""
    twin = uuid.uuid4()
    await tasks.create(pool, tenants.a, "c-all-a", task_id=twin)
    await tasks.create(pool, tenants.b, "c-all-b", task_id=twin)
    [a_held] = await leases.claim(pool, "w", task_types=["c-all-a"])
    [b_held] = await leases.claim(pool, "w", task_types=["c-all-b"])
    for i in range(2):
        await children.spawn(pool, b_held, "c-all-b-line", f"l{i}")
    await children.spawn(pool, a_held, "c-all-a-line", "only")
    counts = [await children.count(pool, tenant, twin) for tenant in (tenants.a, tenants.b)]
    assert counts == [1, 2]
    with pytest.raises(ConfigurationError):
        await children.wait_for(pool, a_held, lease=a_held.lease, finished=2)
    await children.wait_for(pool, a_held, lease=a_held.lease)
    assert (await tasks.get(pool, tenants.a, twin)).state == "waiting"
    [line] = await leases.claim(pool, "w", task_types=["c-all-a-line"])
    await _finish_claimed(pool, line, "succeeded")
    assert (await tasks.get(pool, tenants.a, twin)).state == "pending"


async def test_G2_G20_a_new_child_is_judged_by_its_own_tenant_s_parent_not_a_twin(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A parent id is unique per tenant only: for each tenant in turn, its open parent
    takes a child though the other tenant's parent of that id (written first) is
    cancelled, and its cancelled parent takes none though the other's is open. Kills
    generated ``gen-0006.control_flow-agentdb_guard_child-tenant-1`` (the parent read by
    id alone: the twin's state judged)."""
    for mine, theirs in ((tenants.a, tenants.b), (tenants.b, tenants.a)):
        for open_mine in (True, False):
            shared = uuid.uuid4()
            kind = f"c-judged-{uuid.uuid4().hex[:8]}"
            for tenant, is_open in ((theirs, not open_mine), (mine, open_mine)):
                await tasks.create(
                    pool, tenant, kind if tenant == mine else "c-twin", task_id=shared
                )
                if not is_open:
                    await tasks.transition(pool, tenant, shared, expected_version=0,
                                           to_state="cancelled")  # fmt: skip
            if open_mine:
                [held] = await leases.claim(pool, "w", task_types=[kind])
                child = await children.spawn(pool, held, "c-line", "only")
                assert child.tenant_id == mine
                assert [c.task.id for c in await children.children(pool, mine, shared)] == [
                    child.id
                ]
            else:
                with pytest.raises(TaskFinished):
                    await tasks.create(pool, mine, "c-line", parent=shared, child_key="only")


async def test_G23_an_unfinished_child_has_no_result_yet(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A child still pending and a child running are listed without a result: a child's
    result is its finishing event's payload, not that of the event of the state it is in
    (its creation, its claim). Kills generated ``gen-children-child_list-and-3`` (the event
    of the child's current version read as its result, finished or not)."""
    parent, _ = await _held(pool, tenants.a, "p-unfinished")
    await children.spawn(pool, parent, "c-queued", "queued", params={"line": 1})
    await children.spawn(pool, parent, "c-running", "running", params={"line": 2})
    [running] = await leases.claim(pool, "w", task_types=["c-running"])
    assert running.state == "running"
    got = await children.children(pool, tenants.a, parent.id)
    assert [(c.key, c.task.state, c.result) for c in got] == [
        ("queued", "pending", None),
        ("running", "running", None),
    ]


async def test_G2_G23_a_child_s_result_is_its_own_tenant_s_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenants a and b each have a parent with a child of one id (task ids are the
    caller's), both cancelled at the same version, for different reasons. a's list of
    children holds its one child, with a's finishing event as its result. Kills generated
    ``gen-children-child_list-tenant-1`` (the finishing event looked for in every tenant:
    the child listed twice, once with b's result)."""
    shared = uuid.uuid4()
    parents: dict[uuid.UUID, uuid.UUID] = {}
    for tenant, reason in ((tenants.a, "a withdrew"), (tenants.b, "b withdrew")):
        parent, _ = await _held(pool, tenant, f"p-{tenant.hex[:8]}")
        await children.spawn(pool, parent, "c-twin", "only", task_id=shared)
        await tasks.cancel(pool, tenant, shared, reason=reason)
        parents[tenant] = parent.id
    got = await children.children(pool, tenants.a, parents[tenants.a])
    assert [(c.task.tenant_id, c.task.id, c.task.state) for c in got] == [
        (tenants.a, shared, "cancelled")
    ]
    assert got[0].result is not None
    assert "a withdrew" in json.dumps(got[0].result)
    assert "b withdrew" not in json.dumps(got[0].result)
