"""A task's recorded steps read back (agentdb.steps, G25): the statements a durable
handler's writes fall back on. The handler's rules are tests/test_durable.py's."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import asyncpg
import pytest

from agentdb import leases, steps, tasks
from agentdb.errors import LeaseLost
from agentdb.models import Lease
from tests import factories as F
from tests.conftest import Tenants


async def _wait_that_took(
    pool: asyncpg.Pool, tenant: uuid.UUID, task_id: uuid.UUID, payload: dict[str, str]
) -> None:
    """Task ``task_id`` of ``tenant`` (new) takes signal "approval" in its wait step
    "review", under its lease."""
    await tasks.create(pool, tenant, "review", task_id=task_id)
    await tasks.signal(pool, tenant, task_id, "approval", payload)
    [held] = await leases.claim(pool, "w-steps", task_types=["review"])
    assert (held.tenant_id, held.id) == (tenant, task_id)
    assert held.lease is not None
    taken = await steps.take_signal(
        pool, tenant, task_id, "review", "approval", input_hash=F.HASH, lease=held.lease
    )
    assert taken.step is not None


async def test_G25_a_step_read_by_name_carries_the_signal_its_wait_took(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """steps.get reads the tenant's own step and the signal it took - also when another
    tenant uses the same task id and step name (task ids are the caller's). Kills generated
    ``gen-steps-step_get-cmp-5`` (the signal looked for in other tenants: none) and
    ``gen-steps-step_get-cmp-6`` (the step looked for in other tenants)."""
    shared = uuid.uuid4()
    await _wait_that_took(pool, tenants.a, shared, {"by": "alice"})
    await _wait_that_took(pool, tenants.b, shared, {"by": "bob"})

    got = await steps.get(pool, tenants.a, shared, "review")
    assert got is not None
    assert (got.name, got.kind, got.state, got.input_hash) == ("review", "signal", "done", F.HASH)
    assert got.signal is not None
    assert (got.signal.tenant_id, got.signal.task_id, got.signal.seq) == (tenants.a, shared, 1)
    assert (got.signal.name, got.signal.payload) == ("approval", {"by": "alice"})
    assert await steps.get(pool, tenants.a, shared, "no-such-step") is None


async def test_G22_G25_a_wait_takes_only_its_own_task_s_signal_of_that_name(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Another task of the tenant was sent an "approval"; this task was sent only a "note".
    Its wait for "approval" takes nothing - not the other task's approval, and not its own
    note at that approval's place in the order. Kills generated
    ``gen-steps-step_take_signal-and-4`` (the signal looked for in any task of the tenant)."""
    other = await tasks.create(pool, tenants.a, "t-other")
    await tasks.signal(pool, tenants.a, other.id, "approval", {"by": "alice"})
    mine = await tasks.create(pool, tenants.a, "t-mine")
    await tasks.signal(pool, tenants.a, mine.id, "note", {"text": "fyi"})
    [held] = await leases.claim(pool, "w-steps", task_types=["t-mine"])
    assert held.lease is not None
    taken = await steps.take_signal(
        pool, tenants.a, mine.id, "review", "approval", input_hash=F.HASH, lease=held.lease
    )
    assert taken.step is None
    assert await steps.get(pool, tenants.a, mine.id, "review") is None


async def test_G12_G25_a_wait_under_another_owner_s_lease_takes_nothing(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """w2 holds task y at token 1; worker w holds task x at token 1. A wait on y under a
    lease naming w with y's token - w's lease on x, pointed at y - takes nothing: y's
    fence is y's holder, not the tenant's. (The steps guard checks the token alone, which
    matches.) y's signal stays for its holder. Kills generated
    ``gen-steps-step_take_signal-and-1`` (the fence asking whether any task of the tenant
    is leased with that owner and token)."""
    y = await tasks.create(pool, tenants.a, "t-y")
    await tasks.signal(pool, tenants.a, y.id, "approval")
    [held_y] = await leases.claim(pool, "w2", task_types=["t-y"])
    await tasks.create(pool, tenants.a, "t-x")
    [held_x] = await leases.claim(pool, "w", task_types=["t-x"])
    assert held_y.lease is not None
    assert held_x.lease is not None
    assert held_x.lease.token == held_y.lease.token
    pointed = dataclasses.replace(held_x.lease, task_id=y.id)
    with pytest.raises(LeaseLost):
        await steps.take_signal(
            pool, tenants.a, y.id, "review", "approval", input_hash=F.HASH, lease=pointed
        )
    taken = await steps.take_signal(
        pool, tenants.a, y.id, "review", "approval", input_hash=F.HASH, lease=held_y.lease
    )
    assert taken.step is not None


async def _twin_approvals(
    pool: asyncpg.Pool, tenants: Tenants, *, note_first: bool
) -> tuple[uuid.UUID, Lease]:
    """Tenants a and b each have a task of one id (task ids are the caller's), each sent an
    "approval" - b's first; a's after a "note" when ``note_first``. a's task is claimed:
    the id and its lease."""
    shared = uuid.uuid4()
    await tasks.create(pool, tenants.b, "review-b", task_id=shared)
    await tasks.signal(pool, tenants.b, shared, "approval", {"by": "bob"})
    await tasks.create(pool, tenants.a, "review", task_id=shared)
    if note_first:
        await tasks.signal(pool, tenants.a, shared, "note", {"text": "fyi"})
    await tasks.signal(pool, tenants.a, shared, "approval", {"by": "alice"})
    [held] = await leases.claim(pool, "w-steps", task_types=["review"])
    assert held.lease is not None
    return shared, held.lease


@pytest.mark.parametrize("note_first", [False, True], ids=["same-seq", "later-seq"])
async def test_G22_G25_a_wait_hands_back_its_own_task_s_signal_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, note_first: bool
) -> None:
    """a's wait takes and hands back a's approval, as it recorded it - whether b's twin
    approval has the same place in its order (seq 1) or an earlier one (a's is seq 2, after
    a note). Kills generated ``gen-steps-step_take_signal-cmp-15`` (same-seq: the signal
    taken read back from another tenant, b's payload handed to a's handler) and
    ``-tenant-2`` (later-seq: the first unread signal of the name looked for in every
    tenant's task of that id, b's seq 1 taken)."""
    shared, lease = await _twin_approvals(pool, tenants, note_first=note_first)
    taken = await steps.take_signal(
        pool, tenants.a, shared, "review", "approval", input_hash=F.HASH, lease=lease
    )
    assert taken.step is not None
    assert taken.step.signal is not None
    seq = 2 if note_first else 1
    assert (taken.step.signal.seq, taken.step.signal.payload) == (seq, {"by": "alice"})


async def test_G25_a_step_is_read_from_its_own_task(pool: asyncpg.Pool, tenants: Tenants) -> None:
    """Two tasks of a tenant record a step of one name: each reads back its own. Kills
    generated ``gen-steps-step_get-and-3`` (the step looked up by name in any task)."""
    recorded = {}
    for n in range(2):
        task = await tasks.create(pool, tenants.a, f"read-own-{n}")
        [held] = await leases.claim(pool, "w", task_types=[f"read-own-{n}"])
        assert held.lease is not None
        await steps.record(pool, tenants.a, task.id, "plan", kind="step", input_hash=F.HASH,
                           result=f'{{"n": {n}}}', lease=held.lease)  # fmt: skip
        recorded[task.id] = n
    for task_id, n in recorded.items():
        step = await steps.get(pool, tenants.a, task_id, "plan")
        assert step is not None
        assert step.result == {"n": n}


async def test_G25_a_sleep_is_over_at_its_end_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A sleep of nothing ends the instant it is recorded: read in that transaction, whose
    now() is its end, it is due - by the step read and by the ledger. Kills generated
    ``gen-steps-step_get-cmp-1`` and ``gen-steps-step_ledger-cmp-1`` (``<``: not over until
    after its end)."""
    task = await tasks.create(pool, tenants.a, "nap")
    [held] = await leases.claim(pool, "w", task_types=["nap"])
    assert held.lease is not None
    async with admin_conn.transaction():
        await steps.record(
            admin_conn, tenants.a, task.id, "nap", kind="sleep", input_hash=F.HASH,
            result=None, lease=held.lease, waiting=True, wait=timedelta(0),
        )  # fmt: skip
        step = await steps.get(admin_conn, tenants.a, task.id, "nap")
        assert step is not None
        assert step.due
        assert (await steps.ledger(admin_conn, tenants.a, task.id)).steps["nap"].due


async def test_G2_G12_G25_a_step_under_a_twin_task_s_lease_of_another_tenant_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Task ids are the caller's: tenants a and b each have a task of one id, held by w-a
    and w-b at the same token. A step recorded on a's task under w-b's lease - b's, pointed
    at a's task - is refused: a's fence is a's holder. (The steps guard checks the token
    alone, which matches.) a's holder then records it. Kills generated
    ``gen-steps-step_insert-tenant-1`` (the fence looking for a task of that id, owner and
    token in any tenant: b's lease let a step onto a's task)."""
    shared = uuid.uuid4()
    held = {}
    for tenant, owner in ((tenants.a, "w-a"), (tenants.b, "w-b")):
        await tasks.create(pool, tenant, f"twin-{owner}", task_id=shared)
        [task] = await leases.claim(pool, owner, task_types=[f"twin-{owner}"])
        assert (task.tenant_id, task.id) == (tenant, shared)
        assert task.lease is not None
        held[owner] = task.lease
    assert held["w-a"].token == held["w-b"].token
    pointed = dataclasses.replace(held["w-b"], tenant_id=tenants.a)
    with pytest.raises(LeaseLost):
        await steps.record(pool, tenants.a, shared, "plan", kind="step", input_hash=F.HASH,
                           result='{"by": "w-b"}', lease=pointed)  # fmt: skip
    assert await steps.get(pool, tenants.a, shared, "plan") is None
    mine = await steps.record(pool, tenants.a, shared, "plan", kind="step", input_hash=F.HASH,
                              result='{"by": "w-a"}', lease=held["w-a"])  # fmt: skip
    assert mine.result == {"by": "w-a"}


async def test_G12_G25_a_step_finished_under_its_owner_s_lost_lease_leaves_the_transaction_usable(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Worker w recorded a sleep under token 1; its lease ran out and w claimed the task
    again (token 2). Finishing the sleep under the first lease - the same owner, the old
    token - inside the caller's transaction writes nothing and raises LeaseLost, and the
    transaction goes on: the fence found no row, the guard was never reached (its refusal
    would have aborted the transaction). The second lease finishes it. Kills generated
    ``gen-steps-step_finish-and-6`` (the fence asking for the owner alone)."""
    task = await tasks.create(pool, tenants.a, "t-nap")
    [first] = await leases.claim(pool, "w", task_types=["t-nap"])
    assert first.lease is not None
    await steps.record(pool, tenants.a, task.id, "nap", kind="sleep", input_hash=F.HASH,
                       result=None, lease=first.lease, waiting=True,
                       wait=timedelta(hours=1))  # fmt: skip
    await F.expire_lease(admin_conn, task.id)
    [second] = await leases.claim(pool, "w", task_types=["t-nap"])
    assert second.lease is not None
    assert (first.lease.owner, first.lease.token + 1) == (second.lease.owner, second.lease.token)
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(LeaseLost):
            await steps.finish(conn, tenants.a, task.id, "nap", result="null", lease=first.lease)
        assert await conn.fetchval("SELECT state FROM agent_steps WHERE task_id = $1", task.id) == (
            "waiting"
        )
    done = await steps.finish(pool, tenants.a, task.id, "nap", result="null", lease=second.lease)
    assert done.state == "done"


async def test_G2_G25_a_step_finished_in_one_tenant_leaves_its_twin_s_step_waiting(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenants a and b each have a task of one id (task ids are the caller's), each running
    under token 1 and asleep in a step "nap". Finishing a's nap leaves b's waiting. Kills
    generated ``gen-steps-step_finish-tenant-1`` (the step looked for by task id and name
    in every tenant: b's finished under a's lease, whose token the guard finds b's too)."""
    shared = uuid.uuid4()
    held: dict[uuid.UUID, Lease] = {}
    for tenant, kind in ((tenants.a, "nap-a"), (tenants.b, "nap-b")):
        await tasks.create(pool, tenant, kind, task_id=shared)
        [claimed] = await leases.claim(pool, f"w-{kind}", task_types=[kind])
        assert claimed.lease is not None
        held[tenant] = claimed.lease
        await steps.record(pool, tenant, shared, "nap", kind="sleep", input_hash=F.HASH,
                           result=None, lease=claimed.lease, waiting=True,
                           wait=timedelta(hours=1))  # fmt: skip
    assert held[tenants.a].token == held[tenants.b].token
    done = await steps.finish(pool, tenants.a, shared, "nap", result='{"woke": true}',
                              lease=held[tenants.a])  # fmt: skip
    assert done.state == "done"
    twin = await steps.get(pool, tenants.b, shared, "nap")
    assert twin is not None
    assert (twin.state, twin.result) == ("waiting", None)


async def test_G12_G25_a_step_under_another_task_s_lease_of_its_owner_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """w2 holds task y at token 1; worker w holds task x at token 1. Recording a step of y
    under a lease naming w with y's token - w's lease on x, pointed at y - is refused: y's
    fence is y's holder. (The steps guard checks the token alone, which matches.) Under
    y's own lease the step is recorded. Kills generated ``gen-steps-step_insert-and-1``
    (the fence asking whether any task of the tenant is leased with that owner and token)."""
    y = await tasks.create(pool, tenants.a, "t-y")
    [held_y] = await leases.claim(pool, "w2", task_types=["t-y"])
    await tasks.create(pool, tenants.a, "t-x")
    [held_x] = await leases.claim(pool, "w", task_types=["t-x"])
    assert held_y.lease is not None
    assert held_x.lease is not None
    assert held_x.lease.token == held_y.lease.token
    pointed = dataclasses.replace(held_x.lease, task_id=y.id)
    with pytest.raises(LeaseLost):
        await steps.record(pool, tenants.a, y.id, "plan", kind="step", input_hash=F.HASH,
                           result='{"n": 1}', lease=pointed)  # fmt: skip
    assert await steps.get(pool, tenants.a, y.id, "plan") is None
    done = await steps.record(pool, tenants.a, y.id, "plan", kind="step", input_hash=F.HASH,
                              result='{"n": 1}', lease=held_y.lease)  # fmt: skip
    assert done.state == "done"


async def test_G12_G25_a_wait_under_its_owner_s_lost_lease_leaves_the_transaction_usable(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Worker w's lease on a task ran out and w claimed it again (token 2). A wait under the
    first lease - the same owner, the old token - inside the caller's transaction takes
    nothing and raises LeaseLost, and the transaction goes on: the fence found no task, the
    guard was never reached (its refusal would have aborted it). Kills generated
    ``gen-steps-step_take_signal-and-3`` (the fence asking for the owner alone)."""
    task = await tasks.create(pool, tenants.a, "t-wait")
    await tasks.signal(pool, tenants.a, task.id, "approval", {"by": "alice"})
    [first] = await leases.claim(pool, "w", task_types=["t-wait"])
    await F.expire_lease(admin_conn, task.id)
    [second] = await leases.claim(pool, "w", task_types=["t-wait"])
    assert first.lease is not None
    assert second.lease is not None
    assert (first.lease.owner, first.lease.token + 1) == (second.lease.owner, second.lease.token)
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(LeaseLost):
            await steps.take_signal(conn, tenants.a, task.id, "review", "approval",
                                    input_hash=F.HASH, lease=first.lease)  # fmt: skip
        assert (
            await conn.fetchval("SELECT count(*) FROM agent_steps WHERE task_id = $1", task.id) == 0
        )
    taken = await steps.take_signal(pool, tenants.a, task.id, "review", "approval",
                                    input_hash=F.HASH, lease=second.lease)  # fmt: skip
    assert taken.step is not None
