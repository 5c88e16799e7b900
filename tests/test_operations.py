"""Operations (G4, G13): reserve, call, complete; replay, conflict, in flight, unknown."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import asyncpg
import pytest

from agentdb import leases, operations, tasks
from agentdb.errors import (
    ConfigurationError,
    IdempotencyConflict,
    LeaseLost,
    NotFound,
    OperationInFlight,
    PayloadTooLarge,
    StaleVersion,
    TenantMismatch,
)
from tests import factories as F
from tests.conftest import Database, Tenants


async def _task(pool: asyncpg.Pool, tenant: uuid.UUID) -> uuid.UUID:
    return (await tasks.create(pool, tenant, "t")).id


async def test_G4_same_key_same_input_returns_the_stored_result(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    first = await operations.reserve(
        pool, tenants.a, task, "charge-1", "charge", {"amount": 5, "cur": "EUR"}
    )
    assert first.fresh
    await operations.complete(
        pool, first.operation, result={"charge": "ch_1"}, provider_reference="ch_1"
    )
    again = await operations.reserve(
        pool, tenants.a, task, "charge-1", "charge", {"cur": "EUR", "amount": 5.0}
    )
    assert not again.fresh
    assert again.operation.id == first.operation.id
    assert again.operation.result == {"charge": "ch_1"}


async def test_G3_a_new_operation_takes_the_callers_id_and_a_held_key_keeps_its_own(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """``operation_id`` names a new operation (as reserve_many's ReserveRequest does, and
    through reserve on Citus, where the batch runs element by element); the key's holder
    keeps the id it was given."""
    task = await _task(pool, tenants.a)
    mine, other = uuid.uuid4(), uuid.uuid4()
    first = await operations.reserve(pool, tenants.a, task, "k-id", "charge", {}, operation_id=mine)
    assert (first.fresh, first.operation.id) == (True, mine)
    await operations.complete(pool, first.operation, result={})
    again = await operations.reserve(
        pool, tenants.a, task, "k-id", "charge", {}, operation_id=other
    )
    assert (again.fresh, again.operation.id) == (False, mine)


async def test_G13_an_attempt_is_counted_when_made_not_when_settled(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The reservation and a re-armed retry each count an attempt; completing or failing
    one counts none. Kills generated ``gen-operations-operation_settle-cmp-2`` (every
    settle but a re-arm counted as an attempt)."""
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "k-done", "charge", {})
    done = await operations.complete(pool, res.operation, result={})
    assert done.attempts == res.operation.attempts
    first = await operations.reserve(pool, tenants.a, task, "k-retried", "charge", {})
    failed = await operations.fail(pool, first.operation, "503")
    assert failed.attempts == first.operation.attempts
    again = await operations.reserve(pool, tenants.a, task, "k-retried", "charge", {})
    assert (again.fresh, again.operation.attempts) == (True, failed.attempts + 1)


async def test_G19_a_failed_operation_releases_what_it_held(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A failure spends nothing: the estimate its reservation held goes back to the budget
    in the statement that records it. Kills generated
    ``gen-operations-operation_settle-list-2`` (only a success settling its holds: a
    failed call's estimate held for ever)."""
    from agentdb import budgets

    await budgets.set_budget(pool, tenants.a, "usd", 100)
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "k-fail", "charge", {}, cost={"usd": 40})
    [before] = await budgets.list_budgets(pool, tenants.a)
    assert (before.held, before.spent) == (40, 0)
    await operations.fail(pool, res.operation, "503")
    [after] = await budgets.list_budgets(pool, tenants.a)
    assert (after.held, after.spent) == (0, 0)


async def test_G2_G19_settling_an_operation_leaves_another_tenant_s_twin_s_holds_held(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An operation id is unique per tenant only (agent_operations_pkey is (tenant_id,
    id)) and reserve takes the caller's: tenant a's operation may share the id of b's.
    a's failure releases a's holds alone: b's hold stays held, and b's own success
    later spends it from b's budget. Kills generated
    ``gen-operations-operation_settle-tenant-3`` (the holds found by operation id alone:
    a's failure released b's hold, b's budget kept it held for ever and b's success
    spent nothing)."""
    from agentdb import budgets

    for tenant in (tenants.a, tenants.b):
        await budgets.set_budget(pool, tenant, "credits", 100)
    b_op = (
        await operations.reserve(
            pool, tenants.b, await _task(pool, tenants.b), "kb", "llm", {}, cost={"credits": 30}
        )
    ).operation
    a_op = (
        await operations.reserve(
            pool,
            tenants.a,
            await _task(pool, tenants.a),
            "ka",
            "llm",
            {},
            cost={"credits": 5},
            operation_id=b_op.id,
        )
    ).operation
    assert (a_op.tenant_id, a_op.id) == (tenants.a, b_op.id)
    await operations.fail(pool, a_op, "503")
    holds = await admin_conn.fetch(
        "SELECT tenant_id, state FROM agent_budget_holds WHERE operation_id = $1", b_op.id
    )
    assert {r["tenant_id"]: r["state"] for r in holds} == {
        tenants.a: "released",
        tenants.b: "held",
    }
    [payload] = await admin_conn.fetch(
        "SELECT payload FROM agent_events WHERE tenant_id = $1 AND operation_id = $2"
        " AND event_type = 'operation.failed'",
        tenants.a,
        a_op.id,
    )
    assert json.loads(payload["payload"])["released"] == {"credits": 5}
    await operations.complete(pool, b_op, result={})
    books = await admin_conn.fetch("SELECT tenant_id, spent, held FROM agent_budgets")
    assert {r["tenant_id"]: (r["spent"], r["held"]) for r in books} == {
        tenants.a: (0, 0),
        tenants.b: (30, 0),
    }


async def test_G2_G8_reserve_many_writes_one_event_though_another_tenant_has_the_task_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Task ids are the caller's: tenant b has a task of the id of a's. A batch
    reservation on a's task is read against a's task alone - one reservation, one event,
    a's. Kills generated ``gen-operations-operation_reserve_many-tenant-2`` (the task
    joined by id alone: an event for each tenant's task of that id)."""
    from agentdb.operations import ReserveRequest

    shared = uuid.uuid4()
    await tasks.create(pool, tenants.b, "t-twin", task_id=shared)
    await tasks.create(pool, tenants.a, "t-mine", task_id=shared)
    [held] = await leases.claim(pool, "w", task_types=["t-mine"])
    assert held.lease is not None
    [res] = await operations.reserve_many(pool, [ReserveRequest(held.lease, "k", "llm", {})])
    assert not isinstance(res, Exception), res
    events = await admin_conn.fetch(
        "SELECT tenant_id FROM agent_events WHERE operation_id = $1", res.operation.id
    )
    assert [r["tenant_id"] for r in events] == [tenants.a]


async def test_G4_same_key_different_input_is_a_conflict_never_a_replay(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    first = await operations.reserve(pool, tenants.a, task, "charge-2", "charge", {"amount": 5})
    await operations.complete(pool, first.operation, result={"charge": "ch_2"})
    with pytest.raises(IdempotencyConflict) as refused:
        await operations.reserve(pool, tenants.a, task, "charge-2", "charge", {"amount": 500})
    assert refused.value.stored_hash == first.operation.input_hash
    with pytest.raises(IdempotencyConflict):
        await operations.reserve(pool, tenants.a, task, "charge-2", "refund", {"amount": 5})


async def test_G4_a_different_number_beyond_28_digits_is_a_conflict_never_a_replay(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """An account number as a 29-digit int: the last digit alone makes it another request."""
    task = await _task(pool, tenants.a)
    first = await operations.reserve(
        pool, tenants.a, task, "pay-1", "pay", {"account": 12345678901234567890123456789}
    )
    await operations.complete(pool, first.operation, result={"paid": "p_1"})
    again = await operations.reserve(
        pool, tenants.a, task, "pay-1", "pay", {"account": 12345678901234567890123456789}
    )
    assert (again.fresh, again.operation.result) == (False, {"paid": "p_1"})  # control
    with pytest.raises(IdempotencyConflict):
        await operations.reserve(
            pool, tenants.a, task, "pay-1", "pay", {"account": 12345678901234567890123456788}
        )


async def test_G4_same_key_while_in_flight_is_operation_in_flight(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    first = await operations.reserve(pool, tenants.a, task, "mail-1", "send", {"to": "a"})
    with pytest.raises(OperationInFlight) as busy:
        await operations.reserve(pool, tenants.a, task, "mail-1", "send", {"to": "a"})
    assert (busy.value.operation_id, busy.value.state) == (first.operation.id, "reserved")
    started = await operations.start(pool, first.operation)
    with pytest.raises(OperationInFlight):
        await operations.reserve(pool, tenants.a, task, "mail-1", "send", {"to": "a"})
    assert started.state == "in_flight"


async def test_G13_unknown_outcome_blocks_reuse_until_reconciled(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "wire-1", "wire", {"eur": 10})
    unknown = await operations.mark_unknown(pool, res.operation, error="timeout after 30s")
    with pytest.raises(OperationInFlight) as busy:
        await operations.reserve(pool, tenants.a, task, "wire-1", "wire", {"eur": 10})
    assert busy.value.state == "unknown"
    assert [o.id for o in await operations.list_unsettled(pool)] == [res.operation.id]
    with pytest.raises(ConfigurationError):
        await operations.reconcile(pool, unknown, succeeded=True, provider_reference="")
    settled = await operations.reconcile(
        pool, unknown, succeeded=True, provider_reference="wire_77"
    )
    assert (settled.state, settled.provider_reference, settled.error) == (
        "succeeded",
        "wire_77",
        None,
    )
    replay = await operations.reserve(pool, tenants.a, task, "wire-1", "wire", {"eur": 10})
    assert not replay.fresh
    assert await operations.list_unsettled(pool) == []


async def test_G1_a_failed_operation_is_rearmed_for_another_attempt(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "sms-1", "sms", {"n": 1})
    await operations.fail(pool, res.operation, "provider said 503")
    kept = await operations.reserve(
        pool, tenants.a, task, "sms-1", "sms", {"n": 1}, retry_failed=False
    )
    assert (kept.fresh, kept.operation.state, kept.operation.error) == (
        False,
        "failed",
        "provider said 503",
    )
    again = await operations.reserve(pool, tenants.a, task, "sms-1", "sms", {"n": 1})
    assert (again.fresh, again.operation.state, again.operation.attempts) == (True, "reserved", 2)
    assert again.operation.id == res.operation.id


async def test_G7_settling_twice_is_stale(pool: asyncpg.Pool, tenants: Tenants) -> None:
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "k", "a", {})
    await operations.complete(pool, res.operation, result={"v": 1})
    with pytest.raises(StaleVersion) as stale:
        await operations.fail(pool, res.operation, "late")
    assert (stale.value.expected, stale.value.actual, stale.value.actual_state) == (
        0,
        1,
        "succeeded",
    )


async def test_G3_two_connections_reserving_one_key_get_one_reservation(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    task = await _task(pool, tenants.a)
    c1 = await db.connect("agentdb_test_runtime")
    c2 = await db.connect("agentdb_test_runtime")
    try:
        # c1 inserts the key inside an open transaction; c2's insert of the same
        # key must wait on c1's uncommitted index entry, then see it.
        tx = c1.transaction()
        await tx.start()
        mine = await operations.reserve(c1, tenants.a, task, "dup", "a", {"v": 1})
        theirs = asyncio.ensure_future(
            operations.reserve(c2, tenants.a, task, "dup", "a", {"v": 1})
        )
        await F.wait_until_blocked(admin_conn, c2.get_server_pid())
        assert not theirs.done()
        await tx.commit()
        with pytest.raises(OperationInFlight):
            await theirs
    finally:
        await c1.close()
        await c2.close()
    assert mine.fresh


async def test_G2_reserving_against_another_tenants_task_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task_b = await _task(pool, tenants.b)
    with pytest.raises(TenantMismatch) as refused:
        await operations.reserve(pool, tenants.a, task_b, "x", "a", {})
    assert refused.value.constraint == "agent_operations_task_fkey"


async def test_G9_oversized_results_are_refused_before_sending(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "big", "a", {})
    with pytest.raises(PayloadTooLarge):
        await operations.complete(pool, res.operation, result={"body": "x" * 70000})
    assert (await operations.get(pool, tenants.a, res.operation.id)).state == "reserved"


async def test_get_unknown_operation_is_not_found(pool: asyncpg.Pool, tenants: Tenants) -> None:
    with pytest.raises(NotFound):
        await operations.get(pool, tenants.a, uuid.uuid4())


async def test_G13_unsettled_list_skips_operations_whose_task_holds_a_live_lease(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w1", lease_ttl=timedelta(minutes=5))
    await operations.reserve(pool, tenants.a, claimed.id, "k", "a", {}, lease=claimed.lease)
    assert await operations.list_unsettled(pool) == []  # its worker is alive and on it


async def test_G13_unsettled_list_takes_an_operation_whose_task_s_lease_ran_out(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task still running but whose lease ran out (its worker died mid-call): its
    reserved operation is recovery's to reconcile. Kills generated
    ``gen-operations-operation_list_unsettled-and-6`` (every running task's operations
    skipped, live lease or not)."""
    await tasks.create(pool, tenants.a, "t")
    [claimed] = await leases.claim(pool, "w1", lease_ttl=timedelta(minutes=5))
    res = await operations.reserve(pool, tenants.a, claimed.id, "k", "a", {}, lease=claimed.lease)
    await F.expire_lease(admin_conn, claimed.id, tenants.a)
    assert (await tasks.get(pool, tenants.a, claimed.id)).state == "running"
    assert [op.id for op in await operations.list_unsettled(pool)] == [res.operation.id]


async def test_G2_a_reservation_on_a_task_id_another_tenant_also_uses_is_this_tenant_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Task ids are the caller's to choose, so two tenants can each have a task of one
    id: a reservation reads its own tenant's task only. Kills generated
    ``gen-operations-operation_reserve-tenant-3`` (the join to the task by id alone)."""
    shared = uuid.uuid4()
    await tasks.create(pool, tenants.b, "t", task_id=shared)
    await tasks.create(pool, tenants.a, "t", task_id=shared)
    res = await operations.reserve(pool, tenants.a, shared, "k", "pay", {"amount": 1})
    assert (res.operation.tenant_id, res.operation.task_id) == (tenants.a, shared)
    assert res.fresh


async def test_G12_a_reserve_is_fenced_by_its_task_s_lease_not_another_task_s_of_the_same_token(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A lease is its task's: worker w's token 1 on task x says nothing about its token 1
    on task y, which w2 took over (token 2). w's stale reserve on y is refused and writes
    nothing; y's current holder reserves. Kills generated
    ``gen-operations-operation_reserve-and-1`` (the fence asking whether any task of the
    tenant has that owner and token)."""
    y = await tasks.create(pool, tenants.a, "fence-y")
    [stale] = await leases.claim(pool, "w", task_types=["fence-y"])
    await F.expire_lease(admin_conn, y.id)
    [current] = await leases.claim(pool, "w2", task_types=["fence-y"])
    await tasks.create(pool, tenants.a, "fence-x")
    [live] = await leases.claim(pool, "w", task_types=["fence-x"])
    assert (stale.lease_owner, stale.lease_token) == (live.lease_owner, live.lease_token)
    with pytest.raises(LeaseLost):
        await operations.reserve(pool, tenants.a, y.id, "k", "send", {}, lease=stale.lease)
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_operations WHERE task_id = $1", y.id)
        == 0
    )
    mine = await operations.reserve(pool, tenants.a, y.id, "k", "send", {}, lease=current.lease)
    assert mine.fresh


async def test_G12_a_reserve_under_a_lease_its_own_worker_took_over_is_refused(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Worker w's lease on a task ran out and w took the task again (token 2): a reserve
    made under the first lease - the same owner, token 1 - is refused; under the second
    it is made. Kills generated ``gen-operations-operation_reserve-and-3`` (the fence
    matching the owner's name alone)."""
    task = await tasks.create(pool, tenants.a, "fence-again")
    [first] = await leases.claim(pool, "w", task_types=["fence-again"])
    await F.expire_lease(admin_conn, task.id)
    [second] = await leases.claim(pool, "w", task_types=["fence-again"])
    assert (first.lease_owner, first.lease_token + 1) == (second.lease_owner, second.lease_token)
    with pytest.raises(LeaseLost):
        await operations.reserve(pool, tenants.a, task.id, "k", "send", {}, lease=first.lease)
    mine = await operations.reserve(pool, tenants.a, task.id, "k", "send", {}, lease=second.lease)
    assert mine.fresh


async def test_G8_G19_a_reservation_holds_on_its_own_task_s_budget_and_writes_one_event(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A reservation's cost is held on the budgets covering the tenant or its own task -
    not on a sibling task's budget of the same unit - and it writes one event, however many
    tasks the tenant has. Kills generated ``gen-operations-operation_reserve-and-5`` (every
    budget of the unit in the tenant held) and ``-and-7`` (the event written once per task
    of the tenant)."""
    from agentdb import budgets

    mine = await tasks.create(pool, tenants.a, "t-mine")
    sibling = await tasks.create(pool, tenants.a, "t-sibling")
    for task in (mine, sibling):
        await budgets.set_budget(pool, tenants.a, "usd", 100, task_id=task.id)
    await budgets.set_budget(pool, tenants.a, "usd", 1000)
    res = await operations.reserve(pool, tenants.a, mine.id, "k", "llm", {}, cost={"usd": 5})
    books = await admin_conn.fetch(
        "SELECT task_id, held FROM agent_budgets WHERE tenant_id = $1", tenants.a
    )
    assert {r["task_id"]: r["held"] for r in books} == {None: 5, mine.id: 5, sibling.id: 0}
    events = await admin_conn.fetch(
        "SELECT task_id FROM agent_events WHERE operation_id = $1", res.operation.id
    )
    assert [r["task_id"] for r in events] == [mine.id]


async def test_G19_a_success_spends_each_unit_s_own_actual_cost(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An operation holding two units settles with an actual cost for each: each budget
    spends its own unit's actual amount, not the other's. Kills generated
    ``gen-operations-operation_settle-cmp-12`` (``a.unit <> h.unit``: the amounts swapped)."""
    from agentdb import budgets

    task = await _task(pool, tenants.a)
    for unit in ("tokens", "usd"):
        await budgets.set_budget(pool, tenants.a, unit, 10_000)
    res = await operations.reserve(
        pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 900, "usd": 9}
    )
    await operations.complete(pool, res.operation, result={}, cost={"tokens": 120, "usd": 3})
    books = await admin_conn.fetch(
        "SELECT unit, spent, held FROM agent_budgets WHERE tenant_id = $1", tenants.a
    )
    assert {r["unit"]: (r["spent"], r["held"]) for r in books} == {
        "tokens": (120, 0),
        "usd": (3, 0),
    }


async def test_G12_reserve_under_a_lease_names_its_owner_and_its_tenant_s_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A reservation under a lease is fenced by the lease's owner and token on the task of
    the lease's tenant. Refused: the current token under another owner's name, and the
    lease of tenant b's task whose id a's task shares (ids are the caller's). Kills
    generated ``gen-operations-operation_reserve-and-2`` (the owner not compared) and
    ``-tenant-1`` (the task looked up in every tenant)."""
    import dataclasses

    mine = await tasks.create(pool, tenants.a, "t-own")
    [held] = await leases.claim(pool, "w", task_types=["t-own"])
    assert held.lease is not None
    intruder = dataclasses.replace(held.lease, owner="intruder")
    with pytest.raises(LeaseLost):
        await operations.reserve(pool, tenants.a, mine.id, "k", "send", {}, lease=intruder)
    # b's task, running under a lease, with the id of a's task that nobody holds.
    twin = await tasks.create(pool, tenants.a, "t-twin")
    await tasks.create(pool, tenants.b, "t-twin-b", task_id=twin.id)
    [b_held] = await leases.claim(pool, "w", task_types=["t-twin-b"])
    assert b_held.lease is not None
    borrowed = dataclasses.replace(b_held.lease, tenant_id=tenants.a)
    with pytest.raises(LeaseLost):
        await operations.reserve(pool, tenants.a, twin.id, "k2", "send", {}, lease=borrowed)
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM agent_operations WHERE tenant_id = $1 AND task_id = $2",
            tenants.a,
            twin.id,
        )
        == 0
    )
    # The control: the holder's own lease reserves.
    res = await operations.reserve(pool, tenants.a, mine.id, "k", "send", {}, lease=held.lease)
    assert res.fresh


async def test_G13_an_operation_whose_task_s_lease_ends_this_instant_is_unsettled_work(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Recovery's work list reads a lease as live until its expiry, not at it (as the
    claim's recovery does: a lease that expires at now() is taken over). In one
    transaction, where now() stands still. Kills generated
    ``gen-operations-operation_list_unsettled-cmp-5`` (``>=``)."""
    await tasks.create(pool, tenants.a, "ending")
    [held] = await leases.claim(pool, "w1", task_types=["ending"])
    await operations.reserve(pool, tenants.a, held.id, "k-end", "psp.charge", {}, lease=held.lease)
    assert [o.idempotency_key for o in await operations.list_unsettled(admin_conn)] == []
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # the lease runs out, to this very instant
        await admin_conn.execute(
            "UPDATE agent_tasks SET lease_expires_at = now() WHERE id = $1", held.id
        )
        listed = await operations.list_unsettled(admin_conn)
    assert [o.idempotency_key for o in listed] == ["k-end"]


async def test_G8_a_settled_operation_writes_one_event_though_another_tenant_has_its_task_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Task ids are the caller's: tenants a and b each have a task of one id. Settling a's
    operation writes one event, with a's task's workflow version - not one more for b's
    namesake task. Kills generated ``gen-operations-operation_settle-tenant-5`` (the event's
    task looked up by id alone: an event per tenant that has the id)."""
    shared = uuid.uuid4()
    await tasks.create(pool, tenants.b, "t-b", task_id=shared, workflow_version="b-2")
    await tasks.create(pool, tenants.a, "t-a", task_id=shared, workflow_version="a-1")
    res = await operations.reserve(pool, tenants.a, shared, "k", "llm", {})
    await operations.complete(pool, res.operation, result={"ok": True})
    settled = await admin_conn.fetch(
        "SELECT tenant_id, policy_version FROM agent_events"
        " WHERE operation_id = $1 AND to_state = 'succeeded'",
        res.operation.id,
    )
    assert [(r["tenant_id"], r["policy_version"]) for r in settled] == [(tenants.a, "a-1")]


async def test_G12_a_batch_reserve_under_another_owner_s_lease_of_the_same_token_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """w2 holds task y at token 1; worker w holds task x at token 1. A batch reserve on y
    under a lease naming w with y's token - w's lease on x, pointed at y - is refused; under
    y's own lease it is made. Kills generated ``gen-operations-operation_reserve_many-and-2``
    (the fence matching the token alone)."""
    import dataclasses

    from agentdb.operations import ReserveRequest

    y = await tasks.create(pool, tenants.a, "t-y")
    [held_y] = await leases.claim(pool, "w2", task_types=["t-y"])
    await tasks.create(pool, tenants.a, "t-x")
    [held_x] = await leases.claim(pool, "w", task_types=["t-x"])
    assert held_y.lease is not None
    assert held_x.lease is not None
    assert held_x.lease.token == held_y.lease.token
    pointed = dataclasses.replace(held_x.lease, task_id=y.id)
    [refused] = await operations.reserve_many(pool, [ReserveRequest(pointed, "k", "send", {})])
    assert isinstance(refused, LeaseLost)
    [made] = await operations.reserve_many(pool, [ReserveRequest(held_y.lease, "k", "send", {})])
    assert not isinstance(made, Exception)
    assert made.fresh
