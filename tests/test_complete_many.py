"""Batched completion (G7, G8, G10, G12): many tasks / operations in one statement.

Every input element maps to a result: a finished row, or the typed error the
single-row helper would have raised - returned, never dropped. A refused
element writes nothing: no state change, no event, no outbox message.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import timedelta

import asyncpg
import pytest

from agentdb import Message, budgets, leases, operations, tasks
from agentdb.errors import (
    ConfigurationError,
    IdempotencyConflict,
    LeaseLost,
    NotFound,
    OperationInFlight,
    PayloadTooLarge,
    RateLimited,
    StaleVersion,
)
from agentdb.models import Task
from agentdb.operations import Completion, ReserveRequest
from agentdb.testing._postgres import ON_CITUS
from tests import factories as F
from tests.conftest import RUNTIME, Database, Tenants

HOUR = timedelta(hours=1)


async def _claimed(
    pool: asyncpg.Pool | asyncpg.Connection, tenant: uuid.UUID, n: int, owner: str = "w1"
) -> list[Task]:
    for i in range(n):
        await tasks.create(pool, tenant, "t", params={"i": i})
    got = await leases.claim(pool, owner, batch=n, lease_ttl=HOUR)
    assert len(got) == n
    return got


async def _events(conn: asyncpg.Connection, task_id: uuid.UUID, event_type: str) -> int:
    n: int = await conn.fetchval(
        "SELECT count(*) FROM agent_events WHERE task_id = $1 AND event_type = $2",
        task_id,
        event_type,
    )
    return n


async def _outbox(conn: asyncpg.Connection, task_id: uuid.UUID) -> list[str]:
    rows = await conn.fetch("SELECT topic FROM agent_outbox WHERE task_id = $1", task_id)
    return [r["topic"] for r in rows]


async def test_G8_complete_many_finishes_a_batch_with_events_and_outbox_in_one_statement(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    batch = await _claimed(pool, tenants.a, 3)
    msg = Message("invoice.sent", {"n": 1})
    results = await tasks.finish_many(
        pool, batch, payload={"result": "ok"}, outbox={batch[0].id: [msg], batch[2].id: ()}
    )
    assert [r.id for r in results if isinstance(r, Task)] == [t.id for t in batch]
    for before, after in zip(batch, results, strict=True):
        assert isinstance(after, Task)
        assert (after.state, after.state_version) == ("succeeded", before.state_version + 1)
        assert (after.lease_owner, after.lease) == (None, None)
        ev = await admin_conn.fetchrow(
            "SELECT event_type, actor_id, from_state, to_state, payload::text AS payload"
            " FROM agent_events WHERE task_id = $1 AND task_state_version = $2",
            after.id,
            after.state_version,
        )
        assert ev is not None
        assert (ev["event_type"], ev["actor_id"], ev["from_state"], ev["to_state"]) == (
            "task.succeeded",
            "w1",
            "running",
            "succeeded",
        )
        assert ev["payload"] == '{"result": "ok"}'
    assert await _outbox(admin_conn, batch[0].id) == ["invoice.sent"]
    assert (
        await admin_conn.fetchval("SELECT id FROM agent_outbox WHERE task_id = $1", batch[0].id)
        == msg.id
    )
    assert await _outbox(admin_conn, batch[1].id) == []
    assert await tasks.finish_many(pool, []) == []


async def test_G12_complete_many_refuses_a_fenced_out_lease_and_finishes_the_rest(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Worker 1 stalls past its lease on one task; worker 2 (another connection) takes it over."""
    w1 = await db.connect(RUNTIME)
    w2 = await db.connect(RUNTIME)
    try:
        await tasks.create(w1, tenants.a, "t")
        [stalled] = await leases.claim(w1, "w1", lease_ttl=HOUR)
        await tasks.create(w1, tenants.a, "t")
        [healthy] = await leases.claim(w1, "w1", lease_ttl=HOUR)
        await F.expire_lease(admin_conn, stalled.id)
        [taken] = await leases.claim(w2, "w2", lease_ttl=HOUR)
        assert (taken.id, taken.lease_token) == (stalled.id, stalled.lease_token + 1)

        results = await tasks.finish_many(
            w1,
            [stalled, healthy],
            outbox={stalled.id: [Message("late")], healthy.id: [Message("on.time")]},
        )
        refused, done = results
        assert isinstance(refused, LeaseLost)
        assert (refused.id, refused.owner, refused.token) == (stalled.id, "w1", stalled.lease_token)
        assert (refused.current_owner, refused.current_token) == ("w2", taken.lease_token)
        assert isinstance(done, Task)
        assert done.state == "succeeded"

        # Nothing of the refused element landed; the new holder still owns the task.
        now = await tasks.get(w2, tenants.a, stalled.id)
        assert (now.state, now.lease_owner, now.state_version) == (
            "running",
            "w2",
            taken.state_version,
        )
        assert await _events(admin_conn, stalled.id, "task.succeeded") == 0
        assert await _outbox(admin_conn, stalled.id) == []
        assert await _outbox(admin_conn, healthy.id) == ["on.time"]
        # The holder finishes it normally.
        [mine] = await tasks.finish_many(w2, [taken])
        assert isinstance(mine, Task)
        assert mine.state == "succeeded"
    finally:
        await w1.close()
        await w2.close()


async def test_G7_complete_many_refuses_a_stale_version_written_by_another_connection(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    w1 = await db.connect(RUNTIME)
    other = await db.connect(RUNTIME)
    try:
        batch = await _claimed(w1, tenants.a, 2)
        first, second = batch
        # Another writer under the same lease records a step: state_version moves on.
        moved = await tasks.transition(
            other, tenants.a, first.id, expected_version=first.state_version,
            to_state="running", step="half-way", lease=first.lease,
        )  # fmt: skip
        results = await tasks.finish_many(w1, batch, to_state="failed", error="boom")
        stale, done = results
        assert isinstance(stale, StaleVersion)
        assert (stale.id, stale.expected, stale.actual) == (
            first.id,
            first.state_version,
            moved.state_version,
        )
        assert isinstance(done, Task)
        assert (done.state, done.last_error) == ("failed", "boom")
        assert await _events(admin_conn, first.id, "task.failed") == 0
        assert (await tasks.get(other, tenants.a, first.id)).state == "running"
        assert second.id == done.id
    finally:
        await w1.close()
        await other.close()


async def test_complete_many_reports_a_missing_task_and_refuses_bad_input(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    [claimed] = await _claimed(pool, tenants.a, 1)
    ghost = dataclasses.replace(claimed, id=uuid.uuid4())
    gone, done = await tasks.finish_many(pool, [ghost, claimed])
    assert isinstance(gone, NotFound)
    assert gone.id == ghost.id
    assert isinstance(done, Task)

    [held] = await _claimed(pool, tenants.a, 1)
    pending = await tasks.create(pool, tenants.a, "t")
    with pytest.raises(ConfigurationError, match="no lease"):
        await tasks.finish_many(pool, [pending])
    with pytest.raises(ConfigurationError, match="twice"):
        await tasks.finish_many(pool, [held, held])
    with pytest.raises(ConfigurationError, match="to_state"):
        await tasks.finish_many(pool, [held], to_state="pending")
    with pytest.raises(ConfigurationError, match="not in the batch"):
        await tasks.finish_many(pool, [held], outbox={uuid.uuid4(): [Message("x")]})
    with pytest.raises(ConfigurationError, match=r"payloads names task .* not in the batch"):
        await tasks.finish_many(pool, [held], payloads={uuid.uuid4(): {"n": 1}})
    with pytest.raises(PayloadTooLarge):
        await tasks.finish_many(
            pool, [held], outbox={held.id: [Message("big", {"blob": "x" * 70_000})]}
        )
    assert (await tasks.get(pool, tenants.a, held.id)).state == "running"
    assert await _events(admin_conn, held.id, "task.succeeded") == 0


async def test_G4_reserve_many_answers_each_key_like_reserve(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    [task] = await _claimed(pool, tenants.a, 1)
    lease = task.lease
    assert lease is not None
    done = await operations.reserve(pool, tenants.a, task.id, "k-done", "send", {"n": 1})
    await operations.complete(pool, done.operation, result={"ref": "r1"})
    await operations.reserve(pool, tenants.a, task.id, "k-busy", "send", {"n": 2})

    def req(key: str, payload: dict[str, int], action: str = "send") -> ReserveRequest:
        return ReserveRequest(lease, key, action, payload)

    results = await operations.reserve_many(
        pool,
        [
            req("k-new-1", {"n": 3}),
            req("k-done", {"n": 1}),
            req("k-done-other", {"n": 4}),
            req("k-busy", {"n": 2}),
            req("k-new-2", {"n": 5}),
        ],
    )
    new1, replay, new3, busy, new2 = results
    assert not isinstance(new1, Exception)
    assert new1.fresh
    assert new1.operation.state == "reserved"
    assert not isinstance(replay, Exception)
    assert (replay.fresh, replay.operation.result) == (False, {"ref": "r1"})
    assert not isinstance(new3, Exception)
    assert not isinstance(new2, Exception)
    assert new3.fresh
    assert new2.fresh
    assert isinstance(busy, OperationInFlight)
    ev = await admin_conn.fetchval(
        "SELECT actor_id FROM agent_events WHERE operation_id = $1 AND event_type = $2",
        new1.operation.id,
        "operation.reserved",
    )
    assert ev == "w1"

    [conflict] = await operations.reserve_many(pool, [req("k-done", {"n": 1}, action="refund")])
    assert isinstance(conflict, IdempotencyConflict)
    with pytest.raises(ConfigurationError, match="twice"):
        await operations.reserve_many(pool, [req("dup", {}), req("dup", {})])
    assert await operations.reserve_many(pool, []) == []


async def test_G16_reserve_many_gives_each_operation_its_own_trace_ids(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Elements carrying their own ids keep them (operation and event); an element
    without takes the batch's."""
    first, second, third = await _claimed(pool, tenants.a, 3)
    own = [("a" * 32, "1" * 16), ("b" * 32, "2" * 16)]
    results = await operations.reserve_many(
        pool,
        [
            ReserveRequest(first.lease, "k1", "send", {}, *own[0]),  # type: ignore[arg-type]
            ReserveRequest(second.lease, "k2", "send", {}, *own[1]),  # type: ignore[arg-type]
            ReserveRequest(third.lease, "k3", "send", {}),  # type: ignore[arg-type]
        ],
        trace_id="c" * 32,
        span_id="3" * 16,
    )
    wanted = [*own, ("c" * 32, "3" * 16)]
    for res, ids in zip(results, wanted, strict=True):
        assert not isinstance(res, Exception)
        assert (res.operation.trace_id, res.operation.span_id) == ids
        event = await admin_conn.fetchrow(
            "SELECT trace_id, span_id FROM agent_events WHERE operation_id = $1",
            res.operation.id,
        )
        assert event is not None
        assert (event["trace_id"], event["span_id"]) == ids


async def test_G19_a_refusal_after_the_statement_committed_is_that_elements_alone(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """3 calls of 'send' per hour. One task re-arms its failed key while two others reserve
    fresh keys in the same batch: the fourth call is refused in its own slot, with its
    event, and the other two reservations stand and are answered. On plain Postgres the
    statement reserves the fresh keys first (calls 2 and 3), so the re-arm is the fourth;
    on Citus the elements go one by one in order, so the last fresh key is."""
    x, b, c = await _claimed(pool, tenants.a, 3)
    await budgets.set_rate_limit(pool, tenants.a, "send", 3, timedelta(hours=1))
    assert x.lease is not None
    assert b.lease is not None
    assert c.lease is not None
    first = await operations.reserve(pool, tenants.a, x.id, "kx", "send", {}, lease=x.lease)
    await operations.fail(pool, first.operation, "502", lease=x.lease)
    # The refusal's event used to be an INSERT ... SELECT, which Citus pushes through
    # the coordinator as a COPY (refused under row-level security) once a connection
    # plans it generically, from its sixth run: refuse more than that on one connection.
    await budgets.set_rate_limit(pool, tenants.a, "flood", 1, timedelta(hours=1))
    await operations.reserve(pool, tenants.a, x.id, "flood", "flood", {}, lease=x.lease)
    async with pool.acquire() as conn:
        for i in range(7):
            with pytest.raises(RateLimited):
                await operations.reserve(
                    conn, tenants.a, x.id, f"over-{i}", "flood", {}, lease=x.lease
                )
        answers = await operations.reserve_many(
            conn,
            [
                ReserveRequest(x.lease, "kx", "send", {}),
                ReserveRequest(b.lease, "kb", "send", {}),
                ReserveRequest(c.lease, "kc", "send", {}),
            ],
        )
    refused_key = "kc" if ON_CITUS else "kx"
    keys = ["kx", "kb", "kc"]
    for key, answer in zip(keys, answers, strict=True):
        if key == refused_key:
            assert isinstance(answer, RateLimited)
        else:
            assert not isinstance(answer, Exception)
            assert answer.fresh
    states = await admin_conn.fetch(
        "SELECT idempotency_key, state FROM agent_operations WHERE tenant_id = $1"
        " ORDER BY idempotency_key",
        tenants.a,
    )
    expected = {"flood": "reserved", "kb": "reserved", "kc": "reserved", "kx": "reserved"}
    expected[refused_key] = "failed" if refused_key == "kx" else "absent"
    assert [(r["idempotency_key"], r["state"]) for r in states] == sorted(
        (k, v) for k, v in expected.items() if v != "absent"
    )
    refusals = await admin_conn.fetch(
        "SELECT payload->>'idempotency_key' AS key FROM agent_events WHERE tenant_id = $1"
        " AND event_type = 'operation.refused' AND payload->>'reason' = 'rate_limit'",
        tenants.a,
    )
    assert sorted(r["key"] for r in refusals) == sorted(
        [f"over-{i}" for i in range(7)] + [refused_key]
    )


async def test_G12_reserve_many_and_complete_many_refuse_a_fenced_out_lease(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    w1 = await db.connect(RUNTIME)
    w2 = await db.connect(RUNTIME)
    try:
        await tasks.create(w1, tenants.a, "t")
        [old] = await leases.claim(w1, "w1", lease_ttl=HOUR)
        await tasks.create(w1, tenants.a, "t")
        [fine] = await leases.claim(w1, "w1", lease_ttl=HOUR)
        old_lease, fine_lease = old.lease, fine.lease
        assert old_lease is not None
        assert fine_lease is not None
        first = await operations.reserve_many(
            w1,
            [
                ReserveRequest(old_lease, "old-1", "send", {}),
                ReserveRequest(fine_lease, "fine-1", "send", {}),
            ],
        )
        assert all(not isinstance(r, Exception) and r.fresh for r in first)
        await F.expire_lease(admin_conn, old.id)
        [taken] = await leases.claim(w2, "w2", lease_ttl=HOUR)
        assert taken.id == old.id

        again = await operations.reserve_many(
            w1,
            [
                ReserveRequest(old_lease, "old-2", "send", {}),
                ReserveRequest(fine_lease, "fine-2", "send", {}),
            ],
        )
        assert isinstance(again[0], LeaseLost)
        assert not isinstance(again[1], Exception)
        assert (
            await w1.fetchval(
                "SELECT count(*) FROM agent_operations WHERE idempotency_key = $1", "old-2"
            )
            == 0
        )

        ops = [r.operation for r in first if not isinstance(r, Exception)]
        settled = await operations.complete_many(
            w1,
            [
                Completion(ops[0], result={"ok": True}, provider_reference="p0", lease=old.lease),
                Completion(ops[1], result={"ok": True}, provider_reference="p1", lease=fine.lease),
            ],
        )
        lost, ok = settled
        assert isinstance(lost, LeaseLost)
        assert not isinstance(ok, Exception)
        assert (ok.state, ok.provider_reference, ok.result) == ("succeeded", "p1", {"ok": True})
        assert (await operations.get(w2, tenants.a, ops[0].id)).state == "reserved"
        assert (
            await admin_conn.fetchval(
                "SELECT count(*) FROM agent_events WHERE operation_id = $1 AND event_type = $2",
                ops[0].id,
                "operation.succeeded",
            )
            == 0
        )
    finally:
        await w1.close()
        await w2.close()


async def test_G7_operation_complete_many_refuses_an_operation_settled_elsewhere(
    db: Database, tenants: Tenants
) -> None:
    w1 = await db.connect(RUNTIME)
    other = await db.connect(RUNTIME)
    try:
        task = await tasks.create(w1, tenants.a, "t")
        a = (await operations.reserve(w1, tenants.a, task.id, "a", "send", {})).operation
        b = (await operations.reserve(w1, tenants.a, task.id, "b", "send", {})).operation
        await operations.fail(other, a, "provider said no")
        stale, ok = await operations.complete_many(w1, [Completion(a), Completion(b)])
        assert isinstance(stale, StaleVersion)
        assert (stale.expected, stale.actual, stale.actual_state) == (0, 1, "failed")
        assert not isinstance(ok, Exception)
        assert ok.state == "succeeded"
        ghost = dataclasses.replace(b, id=uuid.uuid4())
        [gone] = await operations.complete_many(w1, [Completion(ghost)])
        assert isinstance(gone, NotFound)
        with pytest.raises(ConfigurationError, match="twice"):
            await operations.complete_many(w1, [Completion(b), Completion(b)])
        assert await operations.complete_many(w1, []) == []
    finally:
        await w1.close()
        await other.close()


async def test_G19_complete_many_records_what_complete_records_of_the_books(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An operation settled in a batch tells the books in its event as one settled alone
    does: what it spent and what it released (nothing, with no actual cost given)."""
    await budgets.set_budget(pool, tenants.a, "tokens", 10_000)
    alone, batched = await _claimed(pool, tenants.a, 2)
    ops = []
    for t, key in ((alone, "ka"), (batched, "kb")):
        assert t.lease is not None
        res = await operations.reserve(
            pool, tenants.a, t.id, key, "llm", {}, lease=t.lease, cost={"tokens": 300}
        )
        ops.append(res.operation)
    await operations.complete(pool, ops[0], lease=alone.lease)
    [done] = await operations.complete_many(pool, [Completion(ops[1], lease=batched.lease)])
    assert not isinstance(done, Exception)
    payloads = [
        json.loads(
            await admin_conn.fetchval(
                "SELECT payload FROM agent_events WHERE operation_id = $1"
                " AND event_type = 'operation.succeeded'",
                op.id,
            )
        )
        for op in ops
    ]
    for payload in payloads:
        assert (payload["spent"], payload["released"]) == ({"tokens": 300}, {"tokens": 0})
    assert payloads[0].keys() == payloads[1].keys()


async def test_G19_complete_many_tells_each_operation_of_a_batch_its_own_release(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Two operations of one tenant settled in one batch, each holding its own unit: each
    event tells of its own unit spent and released, not the other's. Kills generated
    ``gen-operations-operation_complete_many-and-12`` (the released units of every
    operation of the tenant the batch settled)."""
    await budgets.set_budget(pool, tenants.a, "tokens", 10_000)
    await budgets.set_budget(pool, tenants.a, "usd", 100)
    first, second = await _claimed(pool, tenants.a, 2)
    ops = []
    for t, key, cost in ((first, "ka", {"tokens": 300}), (second, "kb", {"usd": 5})):
        assert t.lease is not None
        res = await operations.reserve(
            pool, tenants.a, t.id, key, "llm", {}, lease=t.lease, cost=cost
        )
        ops.append(res.operation)
    settled = await operations.complete_many(
        pool, [Completion(ops[0], lease=first.lease), Completion(ops[1], lease=second.lease)]
    )
    assert [s.state for s in settled if not isinstance(s, Exception)] == ["succeeded"] * 2
    told = []
    for op in ops:
        payload = json.loads(
            await admin_conn.fetchval(
                "SELECT payload FROM agent_events WHERE operation_id = $1"
                " AND event_type = 'operation.succeeded'",
                op.id,
            )
        )
        told.append((payload["spent"], payload["released"]))
    assert told == [({"tokens": 300}, {"tokens": 0}), ({"usd": 5}, {"usd": 0})]


async def test_G2_G19_complete_many_tells_each_operation_its_own_holds_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An operation id is unique per tenant only (agent_operations_pkey is (tenant_id,
    id)) and reserve_many takes the caller's: tenant a's operation may share the id of
    b's, and one batch settles both. b's budget hold is told in b's event alone; a's
    operation, which held nothing, tells of no spend and no release. Kills
    ``gen-operations-operation_complete_many-tenant-6`` (the released units looked up by
    operation id alone: a's event would tell of b's credits)."""
    await budgets.set_budget(pool, tenants.b, "credits", 100)
    [held] = await _claimed(pool, tenants.a, 1)
    assert held.lease is not None
    task_b = await tasks.create(pool, tenants.b, "t")
    b_op = (
        await operations.reserve(pool, tenants.b, task_b.id, "kb", "llm", {}, cost={"credits": 30})
    ).operation
    [reserved] = await operations.reserve_many(
        pool, [ReserveRequest(held.lease, "ka", "llm", {}, operation_id=b_op.id)]
    )
    assert not isinstance(reserved, Exception)
    a_op = reserved.operation
    assert (a_op.tenant_id, a_op.id) == (tenants.a, b_op.id)
    settled = await operations.complete_many(
        pool, [Completion(a_op, lease=held.lease), Completion(b_op)]
    )
    assert [(s.tenant_id, s.state) for s in settled if not isinstance(s, Exception)] == [
        (tenants.a, "succeeded"),
        (tenants.b, "succeeded"),
    ]
    rows = await admin_conn.fetch(
        "SELECT tenant_id, payload FROM agent_events WHERE operation_id = $1"
        " AND event_type = 'operation.succeeded'",
        b_op.id,
    )
    payloads = {r["tenant_id"]: json.loads(r["payload"]) for r in rows}
    assert (payloads[tenants.b]["spent"], payloads[tenants.b]["released"]) == (
        {"credits": 30},
        {"credits": 0},
    )
    assert {"spent", "released"}.isdisjoint(payloads[tenants.a]), payloads[tenants.a]


async def test_G12_finish_many_finishes_the_tenant_s_task_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task id is unique per tenant only (tasks.create takes the caller's): a's and b's
    tasks share an id, one worker holds both, at the same version and lease token.
    Finishing a's leaves b's running, under its lease. Kills generated
    ``gen-tasks-task_finish_many-tenant-1`` (the finish matching id, version and lease
    alone: b's task finished with a's, its work never done)."""
    twin = uuid.uuid4()
    for tenant in (tenants.a, tenants.b):
        await tasks.create(pool, tenant, "t-twin", task_id=twin)
    held = await leases.claim(pool, "w", batch=2, task_types=["t-twin"])
    assert len({(t.state_version, t.lease.token if t.lease else None) for t in held}) == 1
    [a_task] = [t for t in held if t.tenant_id == tenants.a]
    [done] = await tasks.finish_many(pool, [a_task])
    assert isinstance(done, Task)
    rows = await admin_conn.fetch("SELECT tenant_id, state FROM agent_tasks WHERE id = $1", twin)
    assert {r["tenant_id"]: r["state"] for r in rows} == {
        tenants.a: "succeeded",
        tenants.b: "running",
    }


async def test_G12_complete_many_refuses_an_older_lease_of_the_same_owner(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A worker that lost its lease and claimed the task again under the same name holds a
    new token: a completion still carrying the old one was written for the lost attempt and
    is refused, as a stranger's would be. Kills generated
    ``gen-operations-operation_complete_many-and-7`` (the lease matched by its owner
    alone)."""
    [first] = await _claimed(pool, tenants.a, 1, owner="w")
    assert first.lease is not None
    op = (
        await operations.reserve(pool, tenants.a, first.id, "k", "send", {}, lease=first.lease)
    ).operation
    await F.expire_lease(admin_conn, first.id)
    [again] = await leases.claim(pool, "w", lease_ttl=HOUR)
    assert again.lease is not None
    assert (again.id, again.lease.owner, again.lease.token) == (first.id, "w", 2)
    [stale] = await operations.complete_many(pool, [Completion(op, lease=first.lease)])
    assert isinstance(stale, LeaseLost)
    assert (await operations.get(pool, tenants.a, op.id)).state == "reserved"
    [done] = await operations.complete_many(pool, [Completion(op, lease=again.lease)])
    assert not isinstance(done, Exception)  # the control: the current token settles it
    assert done.state == "succeeded"


async def test_G19_complete_many_spends_a_re_armed_operation_s_own_attempt_once(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A failed operation released its first attempt's hold; re-armed, it holds again under
    a new attempt. Settled in a batch, it spends the new hold and leaves the released one
    as it was: the budget is charged once. Kills generated
    ``gen-operations-operation_complete_many-and-9`` (every hold of the operation settled,
    the released one too)."""
    await budgets.set_budget(pool, tenants.a, "usd", 100)
    [held] = await _claimed(pool, tenants.a, 1)
    assert held.lease is not None
    first = await operations.reserve(
        pool, tenants.a, held.id, "k", "llm", {}, cost={"usd": 5}, lease=held.lease
    )
    await operations.fail(pool, first.operation, "503", lease=held.lease)
    again = await operations.reserve(
        pool, tenants.a, held.id, "k", "llm", {}, cost={"usd": 5}, lease=held.lease
    )
    assert (again.fresh, again.operation.id) == (True, first.operation.id)
    [done] = await operations.complete_many(pool, [Completion(again.operation, lease=held.lease)])
    assert not isinstance(done, Exception)
    holds = await admin_conn.fetch(
        "SELECT attempt, state, settled FROM agent_budget_holds WHERE operation_id = $1"
        " ORDER BY attempt",
        done.id,
    )
    assert [(h["state"], h["settled"]) for h in holds] == [("released", None), ("settled", 5)]
    book = await admin_conn.fetchrow(
        "SELECT spent, held FROM agent_budgets WHERE tenant_id = $1", tenants.a
    )
    assert book is not None
    assert (book["spent"], book["held"]) == (5, 0)


async def test_G2_G8_complete_many_writes_one_event_though_another_tenant_has_the_task_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Task ids are the caller's: tenant b has a task of the id of a's. Completing a's
    operation in a batch writes one success event, a's, with a's workflow version. Kills
    generated ``gen-operations-operation_complete_many-tenant-7`` (the event's task joined
    by id alone: an event for each tenant's task of that id, the second refused as a
    second record of the operation's version)."""
    shared = uuid.uuid4()
    await tasks.create(pool, tenants.b, "t-twin", task_id=shared, workflow_version="b-v9")
    await tasks.create(pool, tenants.a, "t-mine", task_id=shared, workflow_version="a-v1")
    op = (await operations.reserve(pool, tenants.a, shared, "k", "llm", {})).operation
    [done] = await operations.complete_many(pool, [Completion(op, provider_reference="p")])
    assert not isinstance(done, Exception), done
    events = await admin_conn.fetch(
        "SELECT tenant_id, policy_version FROM agent_events WHERE operation_id = $1"
        " AND event_type = 'operation.succeeded'",
        op.id,
    )
    assert [(r["tenant_id"], r["policy_version"]) for r in events] == [(tenants.a, "a-v1")]


async def test_G7_complete_many_does_not_settle_a_succeeded_operation_again(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An operation completed alone, then named in a batch at the version it reached -
    the version matches, the state is settled: the batch refuses it and writes nothing,
    its provider reference and its one success event stay. Kills generated
    ``gen-operations-operation_complete_many-and-3`` (the unsettled test dropped: a
    succeeded operation succeeded again, with a second event)."""
    task = await tasks.create(pool, tenants.a, "t")
    reserved = (await operations.reserve(pool, tenants.a, task.id, "k", "llm", {})).operation
    done = await operations.complete(pool, reserved, provider_reference="p-1")
    [again] = await operations.complete_many(pool, [Completion(done, provider_reference="p-2")])
    assert isinstance(again, StaleVersion), again
    row = await admin_conn.fetchrow(
        "SELECT state, state_version, provider_reference FROM agent_operations WHERE id = $1",
        done.id,
    )
    assert row is not None
    assert tuple(row) == ("succeeded", done.state_version, "p-1")
    assert await _events(admin_conn, task.id, "operation.succeeded") == 1


async def test_G12_reserve_many_fences_a_same_owner_stale_holder_by_its_token(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A worker restarted under the same id took its own expired lease over (token 1, then
    2): a batch reservation under the stale lease is refused - the owner's name alone
    fences nothing - and reserves nothing; under the current one it is taken. Kills
    generated ``gen-operations-operation_reserve_many-and-3`` (the lease checked by its
    owner alone)."""
    await tasks.create(pool, tenants.a, "t")
    [stale] = await leases.claim(pool, "w-host-1", lease_ttl=HOUR)
    await F.expire_lease(admin_conn, stale.id)
    [current] = await leases.claim(pool, "w-host-1", lease_ttl=HOUR)
    assert stale.lease is not None
    assert current.lease is not None
    assert (stale.id, stale.lease.token, current.lease.token) == (current.id, 1, 2)
    [lost] = await operations.reserve_many(pool, [ReserveRequest(stale.lease, "k", "llm", {})])
    assert isinstance(lost, LeaseLost), lost
    count = "SELECT count(*) FROM agent_operations WHERE task_id = $1"
    assert await admin_conn.fetchval(count, current.id) == 0
    [mine] = await operations.reserve_many(pool, [ReserveRequest(current.lease, "k", "llm", {})])
    assert not isinstance(mine, Exception), mine
    assert mine.fresh
