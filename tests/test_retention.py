"""G9 retention: `agentdb purge` removes what is past retention, in short statements, only that."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import timedelta

import asyncpg
import pytest

from agentdb import leases, retention, tasks
from agentdb.errors import ConfigurationError
from tests import factories as F
from tests.conftest import Database, Tenants

EXPIRED = 100_000


async def _seed(admin: asyncpg.Connection, tenants: Tenants) -> None:
    task = F.task_row(tenants.a)
    async with admin.transaction():
        await F.insert(admin, "agent_tasks", task)
        await F.event(admin, tenants.a, task["id"], task_state_version=0)  # kept: retained
    # 100k audit events past their retention, their payloads past theirs too.
    await admin.execute(
        "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,"
        " payload, payload_expires_at, retain_until)"
        " SELECT $1, $2, 'step', 'w', 'p', jsonb_build_object('i', i), now() - interval '2 days',"
        " now() - interval '1 day' FROM generate_series(1, $3) AS i",
        tenants.a,
        task["id"],
        EXPIRED,
    )
    # Kept: payload expired but the skeleton is still retained.
    await admin.execute(
        "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,"
        " payload, payload_expires_at, retain_until)"
        " SELECT $1, $2, 'step', 'w', 'p', '{\"keep\": true}', now() - interval '1 day',"
        " now() + interval '1 year' FROM generate_series(1, 50)",
        tenants.a,
        task["id"],
    )
    # Untouched: payload still within its retention.
    await admin.execute(
        "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id, policy_version,"
        " payload)"
        " SELECT $1, $2, 'fresh', 'w', 'p', '{\"fresh\": true}' FROM generate_series(1, 25)",
        tenants.a,
        task["id"],
    )
    # Delivered outbox rows: 30 old, 5 recent; inbox rows: 40 old, 3 recent.
    await admin.execute(
        "INSERT INTO agent_outbox (tenant_id, topic, payload)"
        " SELECT $1, 't', jsonb_build_object('i', i)"
        " FROM generate_series(1, 35) AS i",
        tenants.a,
    )
    # Two statements, not one CASE: Citus refuses now() inside CASE.
    await admin.execute(
        "UPDATE agent_outbox SET state = 'delivered', delivered_at = now() - interval '8 days'"
        " WHERE tenant_id = $1 AND (payload->>'i')::int <= 30",
        tenants.a,
    )
    await admin.execute(
        "UPDATE agent_outbox SET state = 'delivered', delivered_at = now()"
        " WHERE tenant_id = $1 AND (payload->>'i')::int > 30",
        tenants.a,
    )
    await admin.execute(
        "INSERT INTO agent_inbox (tenant_id, consumer, message_id, processed_at)"
        " SELECT $1::uuid, 'c', gen_random_uuid(), now() - interval '31 days'"
        " FROM generate_series(1, 40)"
        " UNION ALL SELECT $1::uuid, 'c', gen_random_uuid(), now() FROM generate_series(1, 3)",
        tenants.a,
    )


async def test_G9_purge_of_100k_expired_events_is_batched_and_spares_the_rest(
    db: Database, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    await _seed(admin_conn, tenants)
    out = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "agentdb",
            "purge",
            "--dsn",
            db.admin_dsn,
            "--batch",
            "2000",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["removed"]["event_payloads"] == EXPIRED + 50
    assert report["removed"]["events"] == EXPIRED
    assert report["removed"]["outbox_delivered"] == 30
    assert report["removed"]["inbox"] == 40
    # Each statement touched at most one batch: about 50 per class of 100k rows.
    assert report["statements"] >= 2 * EXPIRED // 2000
    print(f"\npurge: {report}")  # the longest single statement, for the record
    remaining = await admin_conn.fetchrow(
        "SELECT count(*) FILTER (WHERE payload IS NOT NULL) AS payloads,"
        " count(*) FILTER (WHERE event_type = 'fresh' AND payload IS NOT NULL) AS fresh,"
        " count(*) FILTER (WHERE payload IS NULL) AS erased, count(*) AS total FROM agent_events"
    )
    assert remaining is not None
    assert dict(remaining) == {"payloads": 26, "fresh": 25, "erased": 50, "total": 76}
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_outbox") == 5
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_inbox") == 3
    again = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agentdb", "purge", "--dsn", db.admin_dsn, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert set(json.loads(again.stdout)["removed"].values()) == {
        0
    }  # nothing left: resumable, idempotent


async def _audit_trail_passes(admin_conn: asyncpg.Connection) -> None:
    """Every event's payload and retention ran out a day ago: time passes, which only a
    superuser can fake (the append-only guard refuses any other change to them)."""
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = now() - interval '1 day',"
            " retain_until = now() - interval '1 day'"
        )


async def test_G9_purge_removes_operations_and_tasks_only_after_their_audit_trail(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    from agentdb import operations

    task = await tasks.create(pool, tenants.a, "t")
    res = await operations.reserve(pool, tenants.a, task.id, "k", "a", {})
    await operations.complete(pool, res.operation, result={})
    await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    long_ago = {"operations": timedelta(0), "tasks": timedelta(0)}
    first = await retention.purge(admin_conn, ages=long_ago)
    assert (first.removed["operations"], first.removed["tasks"]) == (0, 0)  # events still retained
    await _audit_trail_passes(admin_conn)
    second = await retention.purge(admin_conn, ages=long_ago)
    assert (second.removed["events"], second.removed["operations"], second.removed["tasks"]) == (
        4,
        1,
        1,
    )


async def test_G9_G25_a_purged_task_takes_its_steps_with_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A finished task's recorded steps refer to it: the tasks purge deletes them first, by
    its own rules, so the task goes - and a live task's steps stay. Both ways the purge
    runs: one tenant's (agentdb_purge_tenant, as on Citus), and every tenant's."""
    from agentdb import leases, steps

    done: dict[uuid.UUID, uuid.UUID] = {}
    live: list[uuid.UUID] = []
    for tenant in (tenants.a, tenants.b):
        done[tenant] = (await tasks.create(pool, tenant, "t-steps")).id
        live.append((await tasks.create(pool, tenant, "t-steps")).id)
        for _ in range(2):
            [held] = await leases.claim(pool, "w", task_types=["t-steps"])
            assert held.lease is not None
            await steps.record(pool, held.tenant_id, held.id, "plan", kind="step",
                               input_hash=F.HASH, result='{"n": 1}', lease=held.lease)  # fmt: skip
            if held.id == done[tenant]:
                await tasks.transition(pool, tenant, held.id, lease=held.lease,
                                       expected_version=held.state_version,
                                       to_state="succeeded")  # fmt: skip
    async with admin_conn.transaction():  # the audit trail's retention passes
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = now() - interval '1 day',"
            " retain_until = now() - interval '1 day'"
        )
    for kind in ("events", "tasks"):  # a task goes once its audit trail has gone
        gone = await admin_conn.fetchval(
            "SELECT agentdb_purge_tenant($1, $2, 100, interval '0')", tenants.a, kind
        )
    assert gone == 1
    purged = await retention.purge(admin_conn, ages={"tasks": timedelta(0)})
    assert purged.removed["tasks"] == 1  # tenant b's
    left = await admin_conn.fetch("SELECT task_id FROM agent_steps")
    assert sorted(r["task_id"] for r in left) == sorted(live)
    finished = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_tasks WHERE id = ANY ($1)", list(done.values())
    )
    assert finished == 0


async def _time_passes(admin: asyncpg.Connection, tenant: uuid.UUID | None = None) -> None:
    """Every event's (or one tenant's) retention passes: only a superuser can fake that."""
    async with admin.transaction():
        await F.replica_mode(admin)
        await admin.execute(
            "UPDATE agent_events SET payload_expires_at = now() - interval '1 day',"
            " retain_until = now() - interval '1 day' WHERE $1::uuid IS NULL OR tenant_id = $1",
            tenant,
        )


async def test_G9_an_unsettled_operation_is_never_purged(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Kills the class "the operations purge forgets the operation's state" (generated
    ``gen-0011.retention-agentdb_purge-and-12`` and ``agentdb_purge_tenant-and-14``:
    ``op.state IN ('succeeded', 'failed')`` replaced by true): an old operation still
    reserved, in flight or unknown is not history - it is what stops a retry from running
    the side effect again - so no purge takes it, even once its audit trail has gone."""
    from agentdb import operations

    task = await tasks.create(pool, tenants.a, "t")
    reserved = await operations.reserve(pool, tenants.a, task.id, "k-reserved", "a", {})
    started = await operations.reserve(pool, tenants.a, task.id, "k-started", "a", {})
    await operations.start(pool, started.operation)
    unknown = await operations.reserve(pool, tenants.a, task.id, "k-unknown", "a", {})
    await operations.mark_unknown(pool, unknown.operation, error="timeout")
    settled = await operations.reserve(pool, tenants.a, task.id, "k-settled", "a", {})
    await operations.complete(pool, settled.operation, result={})
    await _time_passes(admin_conn)
    one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '0')"
    assert await admin_conn.fetchval(one, tenants.a, "events") > 0
    assert await admin_conn.fetchval(one, tenants.a, "operations") == 1  # the settled one
    await operations.complete(pool, reserved.operation, result={})  # a new event, retained
    await _time_passes(admin_conn)
    purged = await retention.purge(admin_conn, ages={"operations": timedelta(0)})
    assert purged.removed["operations"] == 1  # the one settled since, once its trail went
    left = await admin_conn.fetch(
        "SELECT idempotency_key, state FROM agent_operations WHERE tenant_id = $1", tenants.a
    )
    assert {(r["idempotency_key"], r["state"]) for r in left} == {
        ("k-started", "in_flight"),
        ("k-unknown", "unknown"),
    }


@pytest.mark.parametrize("scope", ["one tenant", "every tenant"])
async def test_G9_a_task_id_another_tenant_also_uses_does_not_hold_back_the_purge(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Kills the class "a tenant equality of the tasks purge dropped" (generated
    ``gen-0011.retention-agentdb_purge_tasks-tenant-*``, e.g. ``-tenant-17``: the
    one-tenant batch's ``e.tenant_id = p_tenant`` replaced by true): task ids are the
    caller's (``tasks.create(task_id=)``), so tenant b may hold a live task with the id of
    tenant a's finished one; b's events, operation, outbox row, artifact, signal, step and
    child of that id must not keep a's task - or its steps - from being purged."""
    from agentdb import leases, operations, steps

    shared = uuid.uuid4()
    a_type, b_type = f"t-{tenants.a.hex[:8]}", f"t-{tenants.b.hex[:8]}"
    await tasks.create(pool, tenants.a, a_type, task_id=shared)
    await tasks.create(pool, tenants.b, b_type, task_id=shared)
    [a_held] = await leases.claim(pool, "wa", task_types=[a_type])
    [b_held] = await leases.claim(pool, "wb", task_types=[b_type])
    for held in (a_held, b_held):
        assert held.lease is not None
        await steps.record(pool, held.tenant_id, shared, "plan", kind="step",
                           input_hash=F.HASH, result='{"n": 1}', lease=held.lease)  # fmt: skip
    await tasks.transition(pool, tenants.a, shared, lease=a_held.lease,
                           expected_version=a_held.state_version, to_state="succeeded")  # fmt: skip
    # Tenant b's live task of the same id: everything that refers to a task.
    await operations.reserve(pool, tenants.b, shared, "k", "a", {}, lease=b_held.lease)
    b_rows = {"tenant_id": tenants.b, "task_id": shared}
    await F.insert(admin_conn, "agent_outbox", {**b_rows, "topic": "t", "payload": "{}"})
    await F.insert(admin_conn, "agent_artifacts", {**b_rows, "kind": "k", "uri": "s3://b"})
    await F.signal(admin_conn, tenants.b, shared)
    await tasks.create(pool, tenants.b, b_type, parent=shared, child_key="c")
    await _time_passes(admin_conn, tenants.a)  # a's trail has gone; b's is still retained
    gone = await admin_conn.fetchval(
        "SELECT agentdb_purge_tenant($1, 'events', 100, interval '0')", tenants.a
    )
    assert gone > 0
    if scope == "one tenant":
        purged = await admin_conn.fetchval(
            "SELECT agentdb_purge_tenant($1, 'tasks', 100, interval '0')", tenants.a
        )
    else:
        purged = (await retention.purge(admin_conn, ages={"tasks": timedelta(0)})).removed["tasks"]
    assert purged == 1
    left = await admin_conn.fetch("SELECT tenant_id FROM agent_tasks WHERE id = $1", shared)
    assert [r["tenant_id"] for r in left] == [tenants.b]
    on_a = "SELECT count(*) FROM agent_steps WHERE tenant_id = $1 AND task_id = $2"
    assert await admin_conn.fetchval(on_a, tenants.a, shared) == 0
    assert await admin_conn.fetchval(on_a, tenants.b, shared) == 1


async def _with_a_step(
    pool: asyncpg.Pool, tenant: uuid.UUID, task_id: uuid.UUID, *, finish: bool
) -> None:
    """Task ``task_id`` of ``tenant``, claimed, with one recorded step; then succeeded, or
    left running."""
    from agentdb import leases, steps

    kind = f"t-{tenant.hex[:8]}-{task_id.hex[:8]}"  # the claim takes this task only
    await tasks.create(pool, tenant, kind, task_id=task_id)
    [held] = await leases.claim(pool, "w", task_types=[kind])
    assert held.lease is not None
    await steps.record(pool, tenant, task_id, "plan", kind="step", input_hash=F.HASH,
                       result='{"n": 1}', lease=held.lease)  # fmt: skip
    if finish:
        await tasks.transition(
            pool,
            tenant,
            task_id,
            lease=held.lease,
            expected_version=held.state_version,
            to_state="succeeded",
        )


@pytest.mark.parametrize("scope", ["one tenant", "every tenant"])
async def test_G9_purging_a_task_leaves_another_tenants_task_of_the_same_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Kills the class "the tasks purge's own tenant equality dropped" (generated
    ``gen-0011.retention-agentdb_purge_tasks-tenant-11``, ``-13``, ``-24``: the DELETE's
    ``t.tenant_id = v.tenant_id`` or ``= p_tenant``, the steps DELETE's
    ``k.tenant_id = p_tenant``, replaced by true): task ids are the caller's, so a finished
    task's id may be a live task's in another tenant - purging the one (and its steps) must
    leave the other, and the other's steps, alone."""
    x, y = uuid.uuid4(), uuid.uuid4()
    await _with_a_step(pool, tenants.a, x, finish=True)  # purged
    await _with_a_step(pool, tenants.b, x, finish=False)  # same id, live: stays
    await _with_a_step(pool, tenants.a, y, finish=False)  # live: stays
    await _with_a_step(pool, tenants.b, y, finish=True)  # same id, finished
    await _time_passes(admin_conn)
    if scope == "one tenant":
        for kind in ("events", "tasks"):
            purged = await admin_conn.fetchval(
                "SELECT agentdb_purge_tenant($1, $2, 100, interval '0')", tenants.a, kind
            )
        assert purged == 1
        kept = {(tenants.b, x), (tenants.a, y), (tenants.b, y)}
    else:
        report = await retention.purge(admin_conn, ages={"tasks": timedelta(0)})
        assert report.removed["tasks"] == 2
        kept = {(tenants.b, x), (tenants.a, y)}
    left = await admin_conn.fetch("SELECT tenant_id, id FROM agent_tasks")
    assert {(r["tenant_id"], r["id"]) for r in left} == kept
    stepped = await admin_conn.fetch("SELECT tenant_id, task_id FROM agent_steps")
    assert {(r["tenant_id"], r["task_id"]) for r in stepped} == kept


async def test_G9_only_the_owner_purges(runtime_conn: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await retention.purge(runtime_conn)


async def test_G9_bad_purge_options(admin_conn: asyncpg.Connection) -> None:
    with pytest.raises(ConfigurationError):
        await retention.purge(admin_conn, classes=("everything",))
    with pytest.raises(ConfigurationError):
        await retention.purge(admin_conn, batch=0)


async def test_G9_a_purge_takes_batches_of_one_and_what_reached_its_age_this_instant(
    tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The bounds of the purge: a batch of 1 is a batch (the floor is 1, not 2), and an
    inbox row processed exactly ``older_than`` ago has reached its age (``<=``, as the
    other classes). In one transaction, where now() stands still. Kills generated
    ``gen-0011.retention-agentdb_purge-cmp-3`` and ``-cmp-17``."""
    async with admin_conn.transaction():
        await admin_conn.execute(
            "INSERT INTO agent_inbox (tenant_id, consumer, message_id, processed_at)"
            " SELECT $1::uuid, 'c', gen_random_uuid(), now() - interval '30 days'"
            " FROM generate_series(1, 2)",
            tenants.a,
        )
        purge = "SELECT agentdb_purge('inbox', $1, interval '30 days')"
        assert await admin_conn.fetchval(purge, 1) == 1
        assert await admin_conn.fetchval(purge, 1) == 1
        assert await admin_conn.fetchval(purge, 1) == 0


async def test_G9_G19_a_purged_task_takes_its_own_budget_with_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A task's own budget (nothing held on it) goes with the task, once its audit trail
    has; the tenant's budget stays. Kills generated
    ``gen-0011.retention-agentdb_purge_books-cmp-14`` (the books joined to another
    tenant's tasks) and ``-int-1`` (only a budget holding 1 is taken)."""
    from agentdb import budgets

    task = await tasks.create(pool, tenants.a, "t-budgeted")
    await budgets.set_budget(pool, tenants.a, "usd", 100, task_id=task.id)
    await budgets.set_budget(pool, tenants.a, "usd", 1000)
    await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    await _audit_trail_passes(admin_conn)
    purged = await retention.purge(admin_conn, ages={"tasks": timedelta(0)})
    assert purged.removed["tasks"] == 1
    left = await admin_conn.fetch(
        "SELECT task_id FROM agent_budgets WHERE tenant_id = $1", tenants.a
    )
    assert [r["task_id"] for r in left] == [None]  # the tenant's own, not the task's


@pytest.mark.parametrize("kind", ["signals", "tasks"])
async def test_G9_a_purge_takes_batches_up_to_100000_and_no_more(
    admin_conn: asyncpg.Connection, kind: str
) -> None:
    """The classes agentdb_purge hands to a function of their own check the batch there.
    Kills generated ``gen-0011.retention-agentdb_purge_task_signals-int-4`` and
    ``gen-0011.retention-agentdb_purge_tasks-int-4`` (the ceiling moved to 99,999)."""
    purge = f"SELECT agentdb_purge('{kind}', $1, interval '1 day')"
    assert await admin_conn.fetchval(purge, 100_000) == 0
    with pytest.raises(asyncpg.InvalidParameterValueError):
        await admin_conn.fetchval(purge, 100_001)


async def test_G9_a_live_task_keeps_its_signals_and_a_finished_one_is_not_held_back_by_another(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Once the audit trail has gone, the purge takes a finished task (and its signals)
    only: a waiting task keeps its unread signal, and a finished task with no operation
    of its own goes though another task of the tenant still has one. Kills generated
    ``gen-0011.retention-agentdb_purge_task_signals-and-2`` (any task's signals) and
    ``gen-0011.retention-agentdb_purge_tasks-and-13`` (any operation of the tenant
    holds every task back)."""
    from agentdb import operations

    live = await tasks.create(pool, tenants.a, "t-live")
    [held] = await leases.claim(pool, "w", task_types=["t-live"])
    assert held.lease is not None
    await operations.reserve(pool, tenants.a, live.id, "k", "a", {}, lease=held.lease)
    await tasks.wait_for_signal(pool, held, "go", lease=held.lease)
    await tasks.signal(pool, tenants.a, live.id, "note")
    done = await tasks.create(pool, tenants.a, "t-done")
    await tasks.signal(pool, tenants.a, done.id, "note")
    await tasks.transition(pool, tenants.a, done.id, expected_version=0, to_state="cancelled")
    await _audit_trail_passes(admin_conn)
    async with admin_conn.transaction():  # and the tasks were last written long ago
        await F.replica_mode(admin_conn)
        await admin_conn.execute("UPDATE agent_tasks SET updated_at = now() - interval '400 days'")
    ages = {"tasks": timedelta(0), "signals": timedelta(0), "operations": timedelta(0)}
    purged = await retention.purge(admin_conn, ages=ages)
    assert purged.removed["tasks"] == 1
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [live.id]
    signals_left = await admin_conn.fetch(
        "SELECT task_id FROM agent_signals WHERE tenant_id = $1", tenants.a
    )
    assert [r["task_id"] for r in signals_left] == [live.id]


async def test_G9_a_tenant_s_purge_strips_each_payload_once_and_keeps_audited_operations(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The per-tenant purge (Citus runs it for each tenant; plain Postgres has it too):
    a payload past its expiry is stripped once - a second run finds nothing - and an
    operation whose events are still retained stays. Kills generated
    ``gen-0011.retention-agentdb_purge_tenant-and-1`` (stripped payloads counted again)
    and ``-and-16`` / ``-cmp-27`` (an operation taken whatever its audit trail)."""
    from agentdb import operations

    task = await tasks.create(pool, tenants.a, "t-tenant-purge")
    res = await operations.reserve(pool, tenants.a, task.id, "k", "a", {})
    await operations.complete(pool, res.operation, result={})
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = now() - interval '1 day'"
            " WHERE tenant_id = $1",
            tenants.a,
        )
    step = "SELECT agentdb_purge_tenant($1, $2, 1000, interval '0')"
    assert await admin_conn.fetchval(step, tenants.a, "event_payloads") > 0
    assert await admin_conn.fetchval(step, tenants.a, "event_payloads") == 0
    assert await admin_conn.fetchval(step, tenants.a, "operations") == 0
    kept = "SELECT count(*) FROM agent_operations WHERE tenant_id = $1"
    assert await admin_conn.fetchval(kept, tenants.a) == 1
