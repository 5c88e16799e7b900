"""G9 retention: `agentdb purge` removes what is past retention, in short statements, only that."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from agentdb import leases, operations, outbox, retention, tasks
from agentdb.errors import ConfigurationError
from agentdb.models import Task
from tests import factories as F
from tests.conftest import Database, Tenants

EXPIRED = 100_000


#: A purge of one tenant (agentdb_purge_tenant), and of every tenant in one call
#: (agentdb_purge): plain Postgres's only - Citus refuses its FOR UPDATE over every
#: shard, and retention.purge runs the one-tenant form tenant by tenant there.
SCOPES = [
    "one tenant",
    pytest.param(
        "every tenant",
        marks=pytest.mark.plain_postgres(
            "agentdb_purge reads every tenant's rows FOR UPDATE: refused on Citus, where "
            "retention.purge calls agentdb_purge_tenant tenant by tenant (the 'one tenant' case)"
        ),
    ),
]


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


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_an_events_purge_alone_spares_a_retained_event_whose_payload_expired(
    tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """The events class deletes what is past ``retain_until``, and only that. An event whose
    payload expired but whose skeleton is retained sits in the range of
    agent_events_expiry_idx the events step reads (its payload is not erased yet: the
    payloads class has not run), and is left there - deleting it would be refused by the
    append-only guard (G8), and the purge with it. The expired one beside it goes. Kills
    generated ``gen-0023.event_expiry-agentdb_purge-and-4`` and
    ``agentdb_purge_tenant-and-4`` (the events step without its ``retain_until``)."""
    task = F.task_row(tenants.a)
    day, year = timedelta(days=1), timedelta(days=365)
    async with admin_conn.transaction():
        await F.insert(admin_conn, "agent_tasks", task)
        await F.event(admin_conn, tenants.a, task["id"], task_state_version=0)
        for payload, until in (('{"keep": 1}', year), ('{"go": 1}', -day)):
            await admin_conn.execute(
                "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                " policy_version, payload, payload_expires_at, retain_until)"
                " VALUES ($1, $2, 'step', 'w', 'p', $3::jsonb, now() - $4::interval,"
                " now() + $5::interval)",
                tenants.a,
                task["id"],
                payload,
                day,
                until,
            )
    assert await _purge(admin_conn, tenants.a, "events", scope) == 1
    left = await admin_conn.fetch(
        "SELECT payload FROM agent_events WHERE task_id = $1 AND event_type = 'step'", task["id"]
    )
    assert [json.loads(r["payload"]) for r in left] == [{"keep": 1}]


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


async def _trail_gone(admin: asyncpg.Connection) -> None:
    """Every event's retention passes and the events purge takes them: what a task or an
    operation is judged by once its audit trail has gone."""
    await _time_passes(admin)
    await F.purge_every(admin, "events", 1000, timedelta(0))


async def test_G9_an_unsettled_operation_is_never_purged(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Kills the class "the operations purge forgets the operation's state" (generated
    ``gen-0023.event_expiry-agentdb_purge-and-12`` and ``agentdb_purge_tenant-and-13``:
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


async def _purge_tasks(admin: asyncpg.Connection, tenant: uuid.UUID, scope: str) -> int:
    """The tasks purge of ``tenant`` alone (agentdb_purge_tenant, as on Citus) or of every
    tenant (retention.purge); how many tasks it took."""
    if scope == "one tenant":
        one = "SELECT agentdb_purge_tenant($1, 'tasks', 100, interval '0')"
        return int(await admin.fetchval(one, tenant))
    return (await retention.purge(admin, ages={"tasks": timedelta(0)})).removed["tasks"]


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_a_finished_task_whose_audit_trail_is_retained_stays(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A cancelled task with nothing but its own events - no operation, message, artifact,
    signal, step, child or budget - is older than a purge age of 0, but its audit trail is
    still retained: the tasks purge leaves it; once the events purge has taken the trail,
    it goes. Kills generated ``gen-0020.books_first-agentdb_purge_tasks-and-10`` (every
    tenant's purge forgetting the events: the task taken from under its trail, which
    agent_events_task_fkey refuses)."""
    task = await tasks.create(pool, tenants.a, "t-trail")
    await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 0
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 1


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_a_task_id_another_tenant_also_uses_does_not_hold_back_the_purge(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Kills the class "a tenant equality of the tasks purge dropped" (generated
    ``gen-0020.books_first-agentdb_purge_tasks-tenant-*``, e.g. ``-tenant-18``: the
    one-tenant batch's ``e.tenant_id = p_tenant`` replaced by true): task ids are the
    caller's (``tasks.create(task_id=)``), so tenant b may hold a live task with the id of
    tenant a's finished one; b's events, operation, outbox row, artifact, signal, step,
    child and budget of that id must not keep a's task - or its steps, or its own budget -
    from being purged (b's budget: ``-tenant-11`` and ``-tenant-25``; b's operation keeping
    a's budget: ``gen-0011.retention-agentdb_purge_books-cmp-21``)."""
    from agentdb import budgets, leases, operations, steps

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
    await budgets.set_budget(pool, tenants.b, "usd", 10, task_id=shared)
    await budgets.set_budget(pool, tenants.a, "usd", 10, task_id=shared)  # a's own: it goes
    await _time_passes(admin_conn, tenants.a)  # a's trail has gone; b's is still retained
    gone = await admin_conn.fetchval(
        "SELECT agentdb_purge_tenant($1, 'events', 100, interval '0')", tenants.a
    )
    assert gone > 0
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 1
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


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_purging_a_task_leaves_another_tenants_task_of_the_same_id(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Kills the class "the tasks purge's own tenant equality dropped" (generated
    ``gen-0020.books_first-agentdb_purge_tasks-tenant-12``, ``-14``, ``-26``: the DELETE's
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
    ``gen-0023.event_expiry-agentdb_purge-cmp-3`` and ``-cmp-18``."""
    async with admin_conn.transaction():
        await admin_conn.execute(
            "INSERT INTO agent_inbox (tenant_id, consumer, message_id, processed_at)"
            " SELECT $1::uuid, 'c', gen_random_uuid(), now() - interval '30 days'"
            " FROM generate_series(1, 2)",
            tenants.a,
        )
        for expected in (1, 1, 0):
            assert await F.purge_every(admin_conn, "inbox", 1, timedelta(days=30)) == expected


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled", "dead"])
async def test_G9_G19_a_purged_task_takes_its_own_budget_with_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, end: str, scope: str
) -> None:
    """A task's own budget (nothing held on it) goes with the task, however the task
    ended, once its audit trail has; the tenant's budget stays, and so does another task
    of the tenant with an operation, a budget, a message and an artifact (which keep only
    it). Kills generated
    ``gen-0011.retention-agentdb_purge_books-cmp-14`` (the books joined to another
    tenant's tasks), ``-int-1`` (only a budget holding 1 is taken), ``-list-4`` and
    ``-list-6`` (a failed or dead task's budget kept, and with it the task) and
    ``-and-19`` (any operation of the tenant keeping every task's budget), ``-and-21``
    and ``-and-23`` (any message, any artifact), and
    ``gen-0020.books_first-agentdb_purge_tasks-and-25`` and ``-and-51`` (any task budget
    of the tenant keeping every task)."""
    from agentdb import budgets, operations

    task = await tasks.create(pool, tenants.a, "t-budgeted")
    await budgets.set_budget(pool, tenants.a, "usd", 100, task_id=task.id)
    await budgets.set_budget(pool, tenants.a, "usd", 1000)
    busy = await tasks.create(pool, tenants.a, "t-busy")
    await operations.reserve(pool, tenants.a, busy.id, "k", "send", {})
    await budgets.set_budget(pool, tenants.a, "usd", 50, task_id=busy.id)
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t.busy", {}, task_id=busy.id)
    busy_rows = {"tenant_id": tenants.a, "task_id": busy.id}
    await F.insert(admin_conn, "agent_artifacts", {**busy_rows, "kind": "k", "uri": "s3://busy"})
    if end in ("succeeded", "failed"):
        [held] = await leases.claim(pool, "w", task_types=["t-budgeted"])
        await tasks.transition(
            pool, tenants.a, task.id, expected_version=held.state_version, to_state=end,
            lease=held.lease,
        )  # fmt: skip
    else:
        await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state=end)
    await _audit_trail_passes(admin_conn)
    await F.purge_every(admin_conn, "events", 1000, timedelta(0))
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 1
    left = await admin_conn.fetch(
        "SELECT task_id FROM agent_budgets WHERE tenant_id = $1", tenants.a
    )
    # The tenant's own and the busy task's, not the purged task's.
    assert sorted(str(r["task_id"]) for r in left) == sorted(["None", str(busy.id)])
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE id = $1", busy.id)


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G19_a_task_s_budget_goes_with_it_though_another_task_keeps_its_trail(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A cancelled task's own budget goes with the task once the task's audit trail has,
    though another task of the tenant, made since, still has its trail: that task's
    events keep it, not the first one's budget. Kills generated
    ``gen-0011.retention-agentdb_purge_books-cmp-20`` (``e.task_id <> k.id``: any other
    task's event keeping the budget, and with it the task)."""
    from agentdb import budgets

    task = await tasks.create(pool, tenants.a, "t-budgeted")
    await budgets.set_budget(pool, tenants.a, "usd", 100, task_id=task.id)
    await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    await _trail_gone(admin_conn)
    kept = await tasks.create(pool, tenants.a, "t-kept")  # its trail is new: retained
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 1
    budgets_left = "SELECT count(*) FROM agent_budgets WHERE tenant_id = $1"
    assert await admin_conn.fetchval(budgets_left, tenants.a) == 0
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [kept.id]


async def test_G9_G19_the_books_of_what_stays_stay(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A budget hold goes with its operation and a task's budget with its task - and only
    then. Their audit trails all gone, the operations purge takes a failed operation with
    its hold, and keeps, with their holds, an operation re-armed after a failure (its first
    attempt's hold released), one settled within the purge's age, and one an artifact
    refers to; tenant a's tasks purge keeps the budget of a's task that still has an
    outbox message and of b's task (another tenant's purge). Kills generated
    ``gen-0023.event_expiry-agentdb_purge-list-2`` (a failed operation never purged) and
    ``agentdb_purge_books-and-4`` (the books of an unsettled operation taken), ``-and-5``
    (of one too young), ``-cmp-11`` (of one an artifact keeps), ``-cmp-24`` (of a task an
    outbox message keeps) and ``-and-12`` (another tenant's task budgets taken)."""
    from agentdb import budgets, operations

    await budgets.set_budget(pool, tenants.a, "credits", 1000)
    task = await tasks.create(pool, tenants.a, "t-books")

    async def settled(key: str, fail: bool = False) -> uuid.UUID:
        res = await operations.reserve(pool, tenants.a, task.id, key, "a", {}, cost={"credits": 5})
        if fail:
            await operations.fail(pool, res.operation, "no")
        else:
            await operations.complete(pool, res.operation, result={})
        return res.operation.id

    failed = await settled("k-failed", fail=True)
    rearmed = await settled("k-rearmed", fail=True)
    await operations.reserve(pool, tenants.a, task.id, "k-rearmed", "a", {}, cost={"credits": 5})
    young = await settled("k-young")
    kept = await settled("k-artifact")
    artifact = {"tenant_id": tenants.a, "kind": "report", "uri": "s3://r/1", "operation_id": kept}
    await F.insert(admin_conn, "agent_artifacts", artifact)
    await _time_passes(admin_conn)
    async with admin_conn.transaction():  # all but one settled a day ago
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_operations SET updated_at = now() - interval '1 day' WHERE id <> $1",
            young,
        )
    await F.purge_every(admin_conn, "events", 1000, timedelta(0))
    gone = await F.purge_every(admin_conn, "operations", 100, timedelta(hours=1))
    assert gone == 1
    ops = await admin_conn.fetch(
        "SELECT id, state FROM agent_operations WHERE task_id = $1", task.id
    )
    assert {r["id"]: r["state"] for r in ops} == {
        rearmed: "reserved",
        young: "succeeded",
        kept: "succeeded",
    }
    holds = await admin_conn.fetch("SELECT operation_id, state FROM agent_budget_holds")
    assert sorted((r["operation_id"] == rearmed, r["state"]) for r in holds) == sorted(
        [(True, "released"), (True, "held"), (False, "settled"), (False, "settled")]
    )
    assert failed not in {r["operation_id"] for r in holds}

    # Tasks: a's with an outbox message, b's purgeable - tenant a's purge runs.
    owned: dict[uuid.UUID, uuid.UUID] = {}
    for tenant in (tenants.a, tenants.b):
        t = await tasks.create(pool, tenant, "t-books-task")
        await budgets.set_budget(pool, tenant, "usd", 10, task_id=t.id)
        if tenant == tenants.a:
            async with pool.acquire() as conn:
                await outbox.enqueue(conn, tenant, "t.done", {"n": 1}, task_id=t.id)
        await tasks.transition(pool, tenant, t.id, expected_version=0, to_state="cancelled")
        owned[tenant] = t.id
    await _time_passes(admin_conn)
    await F.purge_every(admin_conn, "events", 1000, timedelta(0))  # both's
    tenant_tasks = "SELECT agentdb_purge_tenant($1, 'tasks', 100, interval '0')"
    assert await admin_conn.fetchval(tenant_tasks, tenants.a) == 0  # its message keeps it
    left = await admin_conn.fetch("SELECT task_id FROM agent_budgets WHERE task_id IS NOT NULL")
    assert sorted(r["task_id"] for r in left) == sorted(owned.values())


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G25_a_failed_task_goes_with_its_steps_and_only_its_own_rows_keep_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Three tasks of tenant a, their audit trails gone: one failed, with a step; one
    live, with an outbox message; one succeeded, with a step and a settled operation. The
    tasks purge takes the failed one and its step; the live one's message does not keep
    it, and the operation keeps the succeeded one - and its step. Kills generated
    ``gen-0020.books_first-agentdb_purge_tasks-list-10`` (the one-tenant purge's steps of
    a failed task kept, and so the task), ``-and-39`` (any message of the tenant keeping
    every task) and ``-cmp-9`` (the every-tenant purge's steps of a task with an
    operation taken when no other task of its tenant has one)."""
    from agentdb import operations, steps

    async def stepped(name: str) -> Task:
        created = await tasks.create(pool, tenants.a, name)
        [held] = await leases.claim(pool, "w", task_types=[name])
        assert held.lease is not None
        await steps.record(pool, tenants.a, held.id, "plan", kind="step", input_hash=F.HASH,
                           result='{"n": 1}', lease=held.lease)  # fmt: skip
        assert held.id == created.id
        return held

    failed = await stepped("t-failed")
    await tasks.transition(pool, tenants.a, failed.id, lease=failed.lease,
                           expected_version=failed.state_version, to_state="failed")  # fmt: skip
    live = await tasks.create(pool, tenants.a, "t-live")
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t.note", {"n": 1}, task_id=live.id)
    done = await stepped("t-done")
    res = await operations.reserve(pool, tenants.a, done.id, "k", "a", {}, lease=done.lease)
    await operations.complete(pool, res.operation, result={}, lease=done.lease)
    await tasks.transition(pool, tenants.a, done.id, lease=done.lease,
                           expected_version=done.state_version, to_state="succeeded")  # fmt: skip
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 1
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert {r["id"] for r in left} == {live.id, done.id}
    kept_steps = await admin_conn.fetch("SELECT task_id FROM agent_steps")
    assert [r["task_id"] for r in kept_steps] == [done.id]


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_a_finished_task_with_a_settled_operation_and_nothing_else_stays(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A succeeded task whose only other row is its settled operation (no step, message,
    signal or budget), its audit trail gone: the operation keeps it, whatever else is
    gone. Kills generated ``gen-0020.books_first-agentdb_purge_tasks-and-38`` and
    ``-and-12`` (the operation forgotten: the task's delete refused by the operation's
    foreign key, and the purge with it)."""
    created = await tasks.create(pool, tenants.a, "t-paid")
    [held] = await leases.claim(pool, "w", task_types=["t-paid"])
    assert held.lease is not None
    assert held.id == created.id
    res = await operations.reserve(pool, tenants.a, held.id, "k", "a", {}, lease=held.lease)
    await operations.complete(pool, res.operation, result={}, lease=held.lease)
    await tasks.transition(pool, tenants.a, held.id, lease=held.lease,
                           expected_version=held.state_version, to_state="succeeded")  # fmt: skip
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 0
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [held.id]


async def test_G9_the_signals_purge_leaves_a_live_twin_s_signals(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant a's cancelled task and tenant b's live one share an id, each with a signal;
    a's trail has gone. Every tenant's signals purge takes a's signal and leaves b's.
    Kills generated ``gen-0011.retention-agentdb_purge_task_signals-tenant-1`` (signals
    joined to finished tasks by task id alone)."""
    shared = uuid.uuid4()
    for tenant in (tenants.a, tenants.b):
        await tasks.create(pool, tenant, "t-signalled", task_id=shared)
        await F.signal(admin_conn, tenant, shared)
    await tasks.transition(pool, tenants.a, shared, expected_version=0, to_state="cancelled")
    await _time_passes(admin_conn, tenants.a)
    await F.purge_every(admin_conn, "events", 1000, timedelta(0))
    assert await F.purge_every(admin_conn, "signals", 100, timedelta(0)) == 1
    left = await admin_conn.fetch("SELECT tenant_id FROM agent_signals WHERE task_id = $1", shared)
    assert [r["tenant_id"] for r in left] == [tenants.b]


async def test_G9_a_tenant_s_events_purge_leaves_another_tenant_s_event_of_the_same_key(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Event ids are unique per tenant only: tenant b's retained event may carry the id and
    created_at of a's expired one. a's purge takes a's and leaves b's - it does not fail
    on b's append-only guard either. Kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-tenant-4`` (the delete matching id and
    created_at alone)."""
    past = datetime.now(UTC) - timedelta(days=1)
    a_task, b_task = (
        await F.create_task(admin_conn, tenants.a),
        await F.create_task(admin_conn, tenants.b),
    )
    eid = await F.event(admin_conn, tenants.a, a_task, payload_expires_at=past, retain_until=past)
    created = await admin_conn.fetchval("SELECT created_at FROM agent_events WHERE id = $1", eid)
    await F.event(admin_conn, tenants.b, b_task, id=eid, created_at=created)  # retained
    one = "SELECT agentdb_purge_tenant($1, 'events', 100, interval '0')"
    assert await admin_conn.fetchval(one, tenants.a) == 1
    left = await admin_conn.fetch("SELECT tenant_id FROM agent_events WHERE id = $1", eid)
    assert [r["tenant_id"] for r in left] == [tenants.b]


async def test_G9_a_tenant_s_purge_judges_each_operation_and_message_by_its_own_rows(
    pool: asyncpg.Pool, admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Tenant a's purge: of two failed operations whose trails have gone, the one an
    artifact refers to stays and the other goes - while another task of a's still has
    retained events; a's delivered message goes, and b's pending message of the same id
    (ids are unique per tenant only) stays. Kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-and-16`` (any event of the tenant keeping
    every operation), ``-cmp-31`` (another operation's artifact: the one with its own is
    deleted, and the foreign key fails the run) and ``-tenant-6`` (the delivered message
    deleted by id alone, b's with it)."""
    from agentdb import operations

    task = await tasks.create(pool, tenants.a, "t-ops")
    ops = []
    for key in ("k-gone", "k-kept"):
        res = await operations.reserve(pool, tenants.a, task.id, key, "a", {})
        await operations.fail(pool, res.operation, "no")
        ops.append(res.operation.id)
    artifact = {"tenant_id": tenants.a, "kind": "r", "uri": "s3://r/k", "operation_id": ops[1]}
    await F.insert(admin_conn, "agent_artifacts", artifact)
    twin = uuid.uuid4()
    async with pool.acquire() as conn:
        for tenant in (tenants.a, tenants.b):
            await outbox.enqueue(conn, tenant, "t", {"n": 1}, message_id=twin)
    await admin_conn.execute(
        "UPDATE agent_outbox SET state = 'delivered', delivered_at = now() - interval '8 days'"
        " WHERE tenant_id = $1",
        tenants.a,
    )
    await _time_passes(admin_conn, tenants.a)
    await tasks.create(pool, tenants.a, "t-live")  # its creation event is retained
    one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '0')"
    await admin_conn.fetchval(one, tenants.a, "events")
    assert await admin_conn.fetchval(one, tenants.a, "operations") == 1
    left = await admin_conn.fetch("SELECT id FROM agent_operations WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [ops[1]]
    assert await admin_conn.fetchval(one, tenants.a, "outbox_delivered") == 1
    kept = await admin_conn.fetch("SELECT tenant_id FROM agent_outbox WHERE id = $1", twin)
    assert [r["tenant_id"] for r in kept] == [tenants.b]


_LOCKABLE = {  # a class's table, and the column its rows are found by
    "event_payloads": "agent_events",
    "events": "agent_events",
    "outbox_delivered": "agent_outbox",
    "inbox": "agent_inbox",
    "operations": "agent_operations",
    "tasks": "agent_tasks",
}


async def _two_due(admin: asyncpg.Connection, tenant: uuid.UUID, kind: str) -> list[Any]:
    """Two rows of tenant ``tenant`` that the purge of ``kind`` takes; their keys."""
    past = datetime.now(UTC) - timedelta(days=8)
    task = await F.create_task(admin, tenant)
    if kind in ("event_payloads", "events"):
        until = past if kind == "events" else past + timedelta(days=400)
        row = {"payload": '{"n": 1}', "payload_expires_at": past, "retain_until": until}
        return [await F.event(admin, tenant, task, **row) for _ in range(2)]
    if kind == "outbox_delivered":
        message = {"tenant_id": tenant, "topic": "t", "payload": "{}"}
        ids = [await F.insert(admin, "agent_outbox", message) for _ in range(2)]
        await admin.execute(
            "UPDATE agent_outbox SET state = 'delivered', delivered_at = $2 WHERE tenant_id = $1",
            tenant,
            past,
        )
        return ids
    if kind == "inbox":
        ids = [uuid.uuid4(), uuid.uuid4()]
        for message_id in ids:
            seen = {"tenant_id": tenant, "consumer": "c", "message_id": message_id}
            await F.insert(admin, "agent_inbox", {**seen, "processed_at": past})
        return ids
    table = "agent_operations" if kind == "operations" else "agent_tasks"
    if kind == "operations":
        ids = [await F.create_operation(admin, tenant, task) for _ in range(2)]
        for op in ids:
            await F.update_operation(admin, tenant, op, state="failed", error="no",
                                     state_version=1)  # fmt: skip
    else:
        ids = [task, await F.create_task(admin, tenant)]
        for t in ids:
            await F.update_task(admin, tenant, t, state="cancelled", state_version=1)
    await _time_passes(admin, tenant)
    async with admin.transaction():  # settled or finished a week ago
        await F.replica_mode(admin)
        await admin.execute(
            f"UPDATE {table} SET updated_at = $2 WHERE tenant_id = $1",  # noqa: S608
            tenant,
            past,
        )
    await admin.execute("SELECT agentdb_purge_tenant($1, 'events', 1000, interval '0')", tenant)
    return ids


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("kind", list(_LOCKABLE))
async def test_G9_a_purge_skips_a_row_another_transaction_holds_and_takes_the_rest(
    admin_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
    tenants: Tenants,
    kind: str,
    scope: str,
) -> None:
    """Two purges at once (an overlapping cron, two operators) split the work: a row one
    transaction holds is skipped by the other, which takes the rest and never waits (a
    lock_timeout would say it did). Kills the generated mutants that drop a purge's
    ``FOR UPDATE SKIP LOCKED`` or its ``SKIP LOCKED`` (``gen-0023.event_expiry-agentdb_purge
    -lock-*``, ``agentdb_purge_tenant-lock-*``, ``gen-0020.books_first-agentdb_purge_tasks
    -lock-*``)."""
    due = await _two_due(admin_conn, tenants.a, kind)
    key = "message_id" if kind == "inbox" else "id"
    await admin_conn.execute("SET lock_timeout = '2s'")
    async with other_conn.transaction():
        await other_conn.execute(
            f"SELECT 1 FROM {_LOCKABLE[kind]} WHERE tenant_id = $1 AND {key} = $2"  # noqa: S608
            " FOR UPDATE",
            tenants.a,
            due[0],
        )
        if scope == "every tenant":
            took = await admin_conn.fetchval(
                "SELECT agentdb_purge($1, 100, interval '1 day')", kind
            )
        else:
            took = await admin_conn.fetchval(
                "SELECT agentdb_purge_tenant($1, $2, 100, interval '1 day')", tenants.a, kind
            )
    assert took == 1
    await admin_conn.execute("RESET lock_timeout")


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("kind", ["operations", "tasks"])
async def test_G9_G19_a_purge_leaves_what_a_locked_budget_refers_to_for_the_next_run(
    pool: asyncpg.Pool,
    admin_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
    tenants: Tenants,
    kind: str,
    scope: str,
) -> None:
    """A failed operation's budget hold, or a cancelled task's own budget, is being
    written by another transaction (an operator's set_budget; it holds the row FOR NO KEY
    UPDATE). The purge skips it without waiting, leaves its operation or task - the
    foreign key would refuse that delete, and the whole run with it - and takes both on
    the next run. Kills generated ``gen-0011.retention-agentdb_purge_books-lock-1`` to
    ``-lock-4`` (the books waiting for the lock: the lock_timeout says so); before
    0020.books_first the purge failed here with 23503."""
    from agentdb import budgets, operations

    if kind == "operations":
        await budgets.set_budget(pool, tenants.a, "credits", 100)
        task = await tasks.create(pool, tenants.a, "t-held")
        res = await operations.reserve(pool, tenants.a, task.id, "k", "a", {}, cost={"credits": 5})
        await operations.fail(pool, res.operation, "no")
        owner, books = res.operation.id, "agent_budget_holds WHERE operation_id = $2"
    else:
        task = await tasks.create(pool, tenants.a, "t-budget")
        await budgets.set_budget(pool, tenants.a, "usd", 10, task_id=task.id)
        await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
        owner, books = task.id, "agent_budgets WHERE task_id = $2"
    await _trail_gone(admin_conn)
    args: tuple[uuid.UUID, ...] = ()
    if scope == "every tenant":
        purge = f"SELECT agentdb_purge('{kind}', 100, interval '0')"
    else:
        purge, args = f"SELECT agentdb_purge_tenant($1, '{kind}', 100, interval '0')", (tenants.a,)
    table = "agent_operations" if kind == "operations" else "agent_tasks"
    left = f"SELECT count(*) FROM {table} WHERE id = $1"  # noqa: S608
    await admin_conn.execute("SET lock_timeout = '2s'")
    async with other_conn.transaction():
        await other_conn.execute(
            f"SELECT 1 FROM {books} AND tenant_id = $1 FOR NO KEY UPDATE",  # noqa: S608
            tenants.a,
            owner,
        )
        assert await admin_conn.fetchval(purge, *args) == 0
        assert await admin_conn.fetchval(left, owner) == 1
    assert await admin_conn.fetchval(purge, *args) == 1  # the lock gone, both go
    assert await admin_conn.fetchval(left, owner) == 0
    await admin_conn.execute("RESET lock_timeout")


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("kind", ["signals", "tasks", "events"])
async def test_G9_a_purge_takes_batches_up_to_100000_and_no_more(
    admin_conn: asyncpg.Connection, tenants: Tenants, kind: str, scope: str
) -> None:
    """Every class checks the batch, in the function that runs it: the classes the purge
    hands to a function of their own there, the rest in agentdb_purge and
    agentdb_purge_tenant; a batch of 0 is refused too. Kills generated
    ``gen-0011.retention-agentdb_purge_task_signals-int-4``,
    ``gen-0020.books_first-agentdb_purge_tasks-int-4`` and
    ``gen-0023.event_expiry-agentdb_purge_tenant-int-4`` (the ceiling moved to 99,999) and
    ``gen-0020.books_first-agentdb_purge_tasks-int-2`` (the floor to 0)."""
    args: tuple[uuid.UUID, ...] = ()
    if scope == "every tenant":
        purge = f"SELECT agentdb_purge('{kind}', $1, interval '1 day')"
    else:
        purge = f"SELECT agentdb_purge_tenant($2, '{kind}', $1, interval '1 day')"
        args = (tenants.a,)
    assert await admin_conn.fetchval(purge, 100_000, *args) == 0
    assert await admin_conn.fetchval(purge, 1, *args) == 0
    for batch in (100_001, 0):
        with pytest.raises(asyncpg.InvalidParameterValueError):
            await admin_conn.fetchval(purge, batch, *args)


async def test_G9_a_live_task_keeps_its_signals_and_a_finished_one_is_not_held_back_by_another(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Once the audit trail has gone, the purge takes a finished task (and its signals)
    only: a waiting task keeps its unread signal, and a finished task with no operation
    of its own goes though another task of the tenant still has one. Kills generated
    ``gen-0011.retention-agentdb_purge_task_signals-and-2`` (any task's signals) and
    ``gen-0020.books_first-agentdb_purge_tasks-and-13`` (any operation of the tenant
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
    ``gen-0023.event_expiry-agentdb_purge_tenant-and-1`` (stripped payloads counted again)
    and ``-and-15`` / ``-cmp-28`` (an operation taken whatever its audit trail)."""
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


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G25_a_live_task_and_its_steps_outlive_its_audit_trail(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A task that waits for weeks - its audit trail's retention passed, its row not
    written since - is not history: no purge takes it, nor its steps (its handler's
    ledger); nor a waiting task that recorded no step, which nothing else refers to. Kills
    generated ``gen-0020.books_first-agentdb_purge_tasks-and-8`` (every tenant's tasks
    purge: any task, finished or not)."""
    from agentdb import steps

    for task_type in ("t-live", "t-live-bare"):
        await tasks.create(pool, tenants.a, task_type)
        [held] = await leases.claim(pool, "w", task_types=[task_type])
        assert held.lease is not None
        if task_type == "t-live":
            await steps.record(pool, tenants.a, held.id, "plan", kind="step",
                               input_hash=F.HASH, result='{"n": 1}', lease=held.lease)  # fmt: skip
        await tasks.wait_for_signal(pool, held, "go", lease=held.lease)
    await _time_passes(admin_conn)
    assert await F.purge_every(admin_conn, "events", 1000, timedelta(0)) > 0
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 0
    left = await admin_conn.fetch(
        "SELECT k.task_type, count(s.name) AS steps FROM agent_tasks k"
        " LEFT JOIN agent_steps s ON s.tenant_id = k.tenant_id AND s.task_id = k.id"
        " WHERE k.tenant_id = $1 GROUP BY k.task_type",
        tenants.a,
    )
    assert sorted((r["task_type"], r["steps"]) for r in left) == [("t-live", 1), ("t-live-bare", 0)]


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G10_a_finished_task_an_outbox_message_names_stays(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A finished task whose message is still to be delivered (it names the task:
    agent_outbox_task_fkey) is kept by the tasks purge - with no budget of its own to keep
    it first - and the purge goes on. Kills generated
    ``gen-0020.books_first-agentdb_purge_tasks-and-14`` (every tenant's) and ``-and-40``
    (one tenant's): the message's row forgotten, the DELETE fails on its foreign key."""
    task = await tasks.create(pool, tenants.a, "t-mail")
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t.done", {"n": 1}, task_id=task.id)
    await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 0
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE id = $1", task.id)


async def test_G9_a_tenant_s_delivered_messages_purge_takes_its_own_in_a_batch_of_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant b's delivered messages, older and first in the table, are not tenant a's
    purge's to pick: each batch of one takes one of a's. Kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-tenant-5`` (every tenant's delivered
    messages picked: the batch spent on b's rows, which the DELETE then leaves)."""
    async with pool.acquire() as conn:
        for tenant in (tenants.b, tenants.b, tenants.a):
            await outbox.enqueue(conn, tenant, "t.done", {})
    await outbox.mark_delivered(pool, await outbox.claim(pool, "relay", batch=10))
    purge = "SELECT agentdb_purge_tenant($1, 'outbox_delivered', 1, interval '0')"
    assert await admin_conn.fetchval(purge, tenants.a) == 1
    assert await admin_conn.fetchval(purge, tenants.a) == 0
    left = "SELECT count(*) FROM agent_outbox WHERE tenant_id = $1"
    assert (
        await admin_conn.fetchval(left, tenants.a),
        await admin_conn.fetchval(left, tenants.b),
    ) == (0, 2)


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G19_an_operation_is_kept_by_its_own_budget_hold_only(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A settled operation goes once its trail has, whatever else holds budget: tenant a's
    other operation, still holding credits, keeps only itself; tenant b's operation of the
    same id (ids are the caller's: reserve_many's ``operation_id``), holding credits too,
    keeps only b's. Kills generated ``gen-0023.event_expiry-agentdb_purge_tenant-and-20``
    (any hold of the tenant keeping every operation), ``-tenant-12`` and
    ``agentdb_purge-tenant-7`` (b's hold of the same id keeping a's)."""
    from agentdb import budgets, operations
    from agentdb.operations import ReserveRequest

    for tenant in (tenants.a, tenants.b):
        await budgets.set_budget(pool, tenant, "credits", 100)
    b_task = await tasks.create(pool, tenants.b, "t-b")
    b_op = (
        await operations.reserve(pool, tenants.b, b_task.id, "k", "a", {}, cost={"credits": 5})
    ).operation
    a_task = await tasks.create(pool, tenants.a, "t-a")
    await operations.reserve(pool, tenants.a, a_task.id, "k-held", "a", {}, cost={"credits": 5})
    [held] = await leases.claim(pool, "w", task_types=["t-a"])
    assert held.lease is not None
    [res] = await operations.reserve_many(
        pool, [ReserveRequest(held.lease, "k-done", "a", {}, operation_id=b_op.id)]
    )
    assert not isinstance(res, Exception)
    await operations.complete(pool, res.operation, result={}, lease=held.lease)
    await _trail_gone(admin_conn)
    assert await _purge(admin_conn, tenants.a, "operations", scope) == 1
    left = await admin_conn.fetch("SELECT tenant_id, idempotency_key FROM agent_operations")
    assert sorted((str(r["tenant_id"]), r["idempotency_key"]) for r in left) == sorted(
        [(str(tenants.a), "k-held"), (str(tenants.b), "k")]
    )


@pytest.mark.parametrize("scope", SCOPES)
async def test_G2_G9_an_artifact_keeps_its_own_tenant_s_operation_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Tenant b's artifact refers to b's operation, whose id a's settled operation also has
    (ids are the caller's: reserve_many's ``operation_id``): a's operation and its budget
    hold go, once their trail has. Kills generated
    ``gen-0011.retention-agentdb_purge_books-tenant-4`` (the artifact looked for by
    operation id alone: a's hold kept, and with it a's operation)."""
    from agentdb import budgets, operations
    from agentdb.operations import ReserveRequest

    await budgets.set_budget(pool, tenants.a, "credits", 100)
    a_task = await tasks.create(pool, tenants.a, "t-a")
    res = await operations.reserve(pool, tenants.a, a_task.id, "k", "a", {}, cost={"credits": 5})
    await operations.complete(pool, res.operation, result={})
    await tasks.create(pool, tenants.b, "t-b")
    [held] = await leases.claim(pool, "w", task_types=["t-b"])
    assert held.lease is not None
    [b_res] = await operations.reserve_many(
        pool, [ReserveRequest(held.lease, "k", "a", {}, operation_id=res.operation.id)]
    )
    assert not isinstance(b_res, Exception)
    artifact = {"tenant_id": tenants.b, "kind": "report", "uri": "s3://b/1",
                "operation_id": res.operation.id}  # fmt: skip
    await F.insert(admin_conn, "agent_artifacts", artifact)
    await _time_passes(admin_conn, tenants.a)
    await F.purge_every(admin_conn, "events", 1000, timedelta(0))
    assert await _purge(admin_conn, tenants.a, "operations", scope) == 1
    left = await admin_conn.fetch(
        "SELECT tenant_id FROM agent_operations WHERE id = $1", res.operation.id
    )
    assert [r["tenant_id"] for r in left] == [tenants.b]


async def _purge(admin: asyncpg.Connection, tenant: uuid.UUID, kind: str, scope: str) -> int:
    """The ``kind`` purge (age 0, batches of 100) of ``tenant`` alone or of every tenant."""
    if scope == "one tenant":
        one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '0')"
        return int(await admin.fetchval(one, tenant, kind))
    return int(await admin.fetchval("SELECT agentdb_purge($1, 100, interval '0')", kind))


@pytest.mark.parametrize("scope", SCOPES)
async def test_G2_G9_a_purge_takes_its_tenant_s_rows_not_a_twin_s_of_the_same_key(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Keys are the caller's (enqueue's ``message_id``, an inbox's message id): tenant b
    may have a delivered message and an inbox row of the keys of a's. a's, past their age,
    go; b's, processed and delivered this instant, stay. Kills generated
    ``gen-0023.event_expiry-agentdb_purge-tenant-3`` (every tenant's outbox DELETE by id
    alone) and ``agentdb_purge_tenant-tenant-8`` (one tenant's inbox DELETE by key alone)."""
    shared = uuid.uuid4()
    async with pool.acquire() as conn:
        for tenant in (tenants.a, tenants.b):
            await outbox.enqueue(conn, tenant, "t.done", {}, message_id=shared)
    await outbox.mark_delivered(pool, await outbox.claim(pool, "relay", batch=10))
    for tenant, age in ((tenants.a, timedelta(days=1)), (tenants.b, timedelta(0))):
        await admin_conn.execute(
            "UPDATE agent_outbox SET delivered_at = now() - $2::interval WHERE tenant_id = $1",
            tenant, age,
        )  # fmt: skip
        await admin_conn.execute(
            "INSERT INTO agent_inbox (tenant_id, consumer, message_id, processed_at)"
            " VALUES ($1, 'c', $2, now() - $3::interval)",
            tenant, shared, age,
        )  # fmt: skip
    if scope == "one tenant":
        one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '1 hour')"
        gone = [await admin_conn.fetchval(one, tenants.a, k) for k in ("outbox_delivered", "inbox")]
    else:
        every = "SELECT agentdb_purge($1, 100, interval '1 hour')"
        gone = [await admin_conn.fetchval(every, k) for k in ("outbox_delivered", "inbox")]
    assert gone == [1, 1]
    for table in ("agent_outbox", "agent_inbox"):
        left = await admin_conn.fetch(f"SELECT tenant_id FROM {table}")  # noqa: S608
        assert [r["tenant_id"] for r in left] == [tenants.b], table


async def test_G9_a_tenant_s_payload_purge_takes_its_own_in_a_batch_of_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant b's expired payloads, first in the table, are not tenant a's purge's to
    pick: each batch of one strips one of a's. Kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-tenant-1`` (every tenant's payloads picked:
    the batch spent on b's rows, which the UPDATE then leaves)."""
    for tenant in (tenants.b, tenants.b, tenants.a):
        await tasks.create(pool, tenant, "t", params={"n": 1})
    await _time_passes(admin_conn)
    with_payload = "SELECT count(*) FROM agent_events WHERE tenant_id = $1 AND payload IS NOT NULL"
    mine = await admin_conn.fetchval(with_payload, tenants.a)
    assert mine >= 1
    one = "SELECT agentdb_purge_tenant($1, 'event_payloads', 1, interval '0')"
    assert [await admin_conn.fetchval(one, tenants.a) for _ in range(mine + 1)] == [1] * mine + [0]
    assert await admin_conn.fetchval(with_payload, tenants.b) > 0


async def test_G9_a_tenant_s_events_purge_takes_its_own_in_a_batch_of_one(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The same for the events themselves: tenant b's expired events, first in the table,
    are not tenant a's purge's to pick, and stay. Kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-tenant-3`` (every tenant's events picked:
    the batch spent on b's rows, which the DELETE then leaves)."""
    for tenant in (tenants.b, tenants.b, tenants.a):
        await tasks.create(pool, tenant, "t", params={"n": 1})
    await _time_passes(admin_conn)
    events = "SELECT count(*) FROM agent_events WHERE tenant_id = $1"
    mine, theirs = (
        await admin_conn.fetchval(events, tenants.a),
        await admin_conn.fetchval(events, tenants.b),
    )
    assert mine >= 1
    one = "SELECT agentdb_purge_tenant($1, 'events', 1, interval '0')"
    assert [await admin_conn.fetchval(one, tenants.a) for _ in range(mine + 1)] == [1] * mine + [0]
    assert await admin_conn.fetchval(events, tenants.a) == 0
    assert await admin_conn.fetchval(events, tenants.b) == theirs


async def test_G9_an_unknown_retention_class_is_refused(admin_conn: asyncpg.Connection) -> None:
    """Kills generated ``gen-0023.event_expiry-agentdb_purge-raise-2`` (an unknown class
    purging nothing, silently)."""
    with pytest.raises(asyncpg.PostgresError) as refused:
        await admin_conn.fetchval("SELECT agentdb_purge('bogus', 100, interval '0')")
    assert refused.value.sqlstate == "22023"


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G22_a_finished_task_s_signals_go_and_a_live_one_s_stay(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str, end: str
) -> None:
    """Once a finished task's audit trail has gone, its signals go - however it ended; a
    live task keeps its signals. Task and signal ids are the caller's, so tenant b has
    twins: a finished task of the live one's id, and a live task of the finished one's id
    with a retained trail and a signal of the same id as a's. Neither changes what a's
    purge takes. Kills generated ``gen-0011.retention-agentdb_purge_task_signals-list-1``
    and ``-list-7`` (a succeeded or cancelled task's signals kept), ``-tenant-5`` (one
    tenant's purge reading b's finished twin: a's live task's signals taken), ``-cmp-14``
    (b's retained trail holding a's purge back), ``-tenant-3`` (every tenant's DELETE
    by signal id alone: b's signal taken), ``-list-6`` (a failed task's kept) and
    ``-and-5`` (any event of the tenant - the live task's, after the trail went -
    keeping a finished task's signals)."""
    done = await tasks.create(pool, tenants.a, "t-done")
    live = await tasks.create(pool, tenants.a, "t-live")
    await tasks.create(pool, tenants.b, "t-twin", task_id=live.id)
    mine = await F.signal(admin_conn, tenants.a, done.id, name="note")
    await tasks.signal(pool, tenants.a, live.id, "note")
    if end in ("succeeded", "failed"):
        [held] = await leases.claim(pool, "w", task_types=["t-done"])
        await tasks.transition(pool, tenants.a, done.id, expected_version=held.state_version,
                               to_state=end, lease=held.lease)  # fmt: skip
    else:
        await tasks.transition(pool, tenants.a, done.id, expected_version=0, to_state=end)
    await tasks.transition(pool, tenants.b, live.id, expected_version=0, to_state="cancelled")
    await _trail_gone(admin_conn)
    # The live task goes on: an event of tenant a's again, not the finished task's.
    await tasks.signal(pool, tenants.a, live.id, "later")
    # b's live twin of the finished task: a retained trail, and a signal of a's signal's id.
    await tasks.create(pool, tenants.b, "t-twin-live", task_id=done.id)
    await F.signal(admin_conn, tenants.b, done.id, name="note", id=mine)
    assert await _purge(admin_conn, tenants.a, "signals", scope) == 1
    left = await admin_conn.fetch("SELECT tenant_id, task_id FROM agent_signals")
    assert sorted((r["tenant_id"] == tenants.a, r["task_id"] == live.id) for r in left) == [
        (False, False), (True, True), (True, True),
    ]  # fmt: skip


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G19_an_operation_goes_though_another_of_its_tenant_keeps_its_trail(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A settled operation whose trail has gone goes, with its budget hold, though another
    operation of the tenant still has a retained event and an artifact. Kills generated
    ``gen-0011.retention-agentdb_purge_books-cmp-8`` (another operation's event keeping the
    hold, and so the operation), ``gen-0023.event_expiry-agentdb_purge-and-15`` (any event
    of the tenant keeping every operation) and ``-cmp-25`` (another operation's artifact)."""
    from agentdb import budgets, operations

    await budgets.set_budget(pool, tenants.a, "credits", 100)
    task = await tasks.create(pool, tenants.a, "t")
    res = await operations.reserve(pool, tenants.a, task.id, "k-gone", "a", {}, cost={"credits": 5})
    await operations.complete(pool, res.operation, result={})
    await _trail_gone(admin_conn)
    kept = (await operations.reserve(pool, tenants.a, task.id, "k-kept", "a", {})).operation
    artifact = {
        "tenant_id": tenants.a,
        "kind": "report",
        "uri": "s3://a/1",
        "operation_id": kept.id,
    }
    await F.insert(admin_conn, "agent_artifacts", artifact)
    assert await _purge(admin_conn, tenants.a, "operations", scope) == 1
    left = await admin_conn.fetch("SELECT id FROM agent_operations WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [kept.id]
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_budget_holds") == 0


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G25_each_task_s_steps_are_judged_by_its_own_age_and_trail(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A task finished two hours ago, its trail gone, goes with its steps under a purge of
    what is over an hour old - though another task of the tenant has a retained trail; a
    task finished just now keeps its steps (and itself). Kills generated
    ``gen-0020.books_first-agentdb_purge_tasks-and-3`` (every tenant's steps purge ignoring
    the age) and ``-cmp-40`` (one tenant's steps purge held back by another task's events)."""
    from agentdb import steps

    done = {}
    for name in ("old", "young"):
        task = await tasks.create(pool, tenants.a, f"t-{name}")
        [held] = await leases.claim(pool, "w", task_types=[f"t-{name}"])
        assert held.lease is not None
        await steps.record(pool, tenants.a, task.id, "plan", kind="step", input_hash=F.HASH,
                           result="{}", lease=held.lease)  # fmt: skip
        await tasks.transition(pool, tenants.a, task.id, expected_version=held.state_version,
                               to_state="succeeded", lease=held.lease)  # fmt: skip
        done[name] = task.id
    await _trail_gone(admin_conn)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '2 hours' WHERE id = $1",
            done["old"],
        )
    await tasks.create(pool, tenants.a, "t-retained")  # its trail is new
    if scope == "one tenant":
        one = "SELECT agentdb_purge_tenant($1, 'tasks', 100, interval '1 hour')"
        gone = await admin_conn.fetchval(one, tenants.a)
    else:
        gone = await F.purge_every(admin_conn, "tasks", 100, timedelta(hours=1))
    assert gone == 1
    left = await admin_conn.fetch("SELECT task_id FROM agent_steps WHERE tenant_id = $1", tenants.a)
    assert [r["task_id"] for r in left] == [done["young"]]


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_a_finished_task_with_nothing_left_goes_at_its_age_not_before(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """Two cancelled tasks of a, their trails gone and nothing else referring to them (no
    step, which the steps purge would judge by its own age first): the one finished two
    hours ago goes under a purge of what is over an hour old, the one finished just now
    stays. Kills generated ``gen-0020.books_first-agentdb_purge_tasks-and-35`` (one
    tenant's tasks purge ignoring the age) and ``-and-9`` (every tenant's)."""
    done = {}
    for name in ("old", "young"):
        task = await tasks.create(pool, tenants.a, f"t-{name}")
        await tasks.transition(pool, tenants.a, task.id, expected_version=0,
                               to_state="cancelled")  # fmt: skip
        done[name] = task.id
    await _trail_gone(admin_conn)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '2 hours' WHERE id = $1",
            done["old"],
        )
    if scope == "one tenant":
        one = "SELECT agentdb_purge_tenant($1, 'tasks', 100, interval '1 hour')"
        gone = await admin_conn.fetchval(one, tenants.a)
    else:
        gone = await F.purge_every(admin_conn, "tasks", 100, timedelta(hours=1))
    assert gone == 1
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [done["young"]]


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_every_class_takes_what_reached_its_age_this_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A payload or event whose time ends now, and a message delivered or an inbox row
    processed exactly the purge's age ago, have reached it (``<=``). In one transaction,
    where now() stands still. Kills generated ``gen-0023.event_expiry-agentdb_purge_tenant-
    cmp-6``, ``-cmp-12`` and ``-cmp-18`` (one tenant's ``<``)."""
    task = await tasks.create(pool, tenants.a, "t", params={"n": 1})
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenants.a, "t.done", {})
    await outbox.mark_delivered(pool, await outbox.claim(pool, "relay", batch=10))
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the append-only guard is off
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = now(), retain_until = now()"
            " WHERE task_id = $1",
            task.id,
        )
        await admin_conn.execute(
            "UPDATE agent_outbox SET delivered_at = now() - interval '1 hour' WHERE tenant_id = $1",
            tenants.a,
        )
        await admin_conn.execute(
            "INSERT INTO agent_inbox (tenant_id, consumer, message_id, processed_at)"
            " VALUES ($1, 'c', gen_random_uuid(), now() - interval '1 hour')",
            tenants.a,
        )
        kinds = ("event_payloads", "events", "outbox_delivered", "inbox")
        if scope == "one tenant":
            one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '1 hour')"
            gone = [await admin_conn.fetchval(one, tenants.a, k) for k in kinds]
        else:
            every = "SELECT agentdb_purge($1, 100, interval '1 hour')"
            gone = [await admin_conn.fetchval(every, k) for k in kinds]
    assert all(n >= 1 for n in gone), dict(zip(kinds, gone, strict=True))


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G19_G22_signals_and_a_hold_go_when_their_owner_reached_its_age_this_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A finished task's signals, and a settled operation's budget hold, go with a task or
    an operation last updated exactly the purge's age ago (``<=``), in a purge of the
    tenant and in one of every tenant. In one transaction, where now() stands still. Kills
    generated ``gen-0011.retention-agentdb_purge_task_signals-cmp-13`` (one tenant's) and
    ``-cmp-5`` (every tenant's), and ``gen-0011.retention-agentdb_purge_books-cmp-6``
    (``<``: kept, and the operation with its hold)."""
    from agentdb import budgets

    done = await tasks.create(pool, tenants.a, "t-done")
    await tasks.signal(pool, tenants.a, done.id, "note")
    version = (await tasks.get(pool, tenants.a, done.id)).state_version
    await tasks.transition(pool, tenants.a, done.id, expected_version=version, to_state="cancelled")
    await budgets.set_budget(pool, tenants.a, "usd", 100)
    paid = await tasks.create(pool, tenants.a, "t-paid")
    res = await operations.reserve(pool, tenants.a, paid.id, "k", "llm", {}, cost={"usd": 5})
    await operations.complete(pool, res.operation, result={})
    await _trail_gone(admin_conn)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the version guards are off
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '1 hour' WHERE id = $1", done.id
        )
        await admin_conn.execute(
            "UPDATE agent_operations SET updated_at = now() - interval '1 hour' WHERE id = $1",
            res.operation.id,
        )
        if scope == "one tenant":
            one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '1 hour')"
            gone = [await admin_conn.fetchval(one, tenants.a, k) for k in ("signals", "operations")]
        else:
            every = "SELECT agentdb_purge($1, 100, interval '1 hour')"
            gone = [await admin_conn.fetchval(every, k) for k in ("signals", "operations")]
    assert gone == [1, 1]
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_budget_holds") == 0


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_a_settled_operation_younger_than_the_age_stays(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """An operation settled just now, its audit trail gone, is younger than a purge age of
    a day: it stays; at age 0 it goes. Kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-and-14`` (the one-tenant purge forgetting
    the age: every settled operation taken)."""
    task = await tasks.create(pool, tenants.a, "t-young")
    res = await operations.reserve(pool, tenants.a, task.id, "k", "llm", {})
    await operations.complete(pool, res.operation, result={})
    await _trail_gone(admin_conn)
    if scope == "one tenant":
        one = "SELECT agentdb_purge_tenant($1, 'operations', 100, $2)"
        gone = [
            await admin_conn.fetchval(one, tenants.a, age)
            for age in (timedelta(days=1), timedelta(0))
        ]
    else:
        every = "SELECT agentdb_purge('operations', 100, $1)"
        gone = [await admin_conn.fetchval(every, age) for age in (timedelta(days=1), timedelta(0))]
    assert gone == [0, 1]


async def test_G9_G19_a_task_an_artifact_keeps_keeps_its_budget(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A finished task an artifact refers to stays, and so does its budget - the books go
    only with what they belong to. Kills generated
    ``gen-0011.retention-agentdb_purge_books-and-22`` (the artifact forgotten: the budget
    taken from a task that stays)."""
    from agentdb import budgets

    task = await tasks.create(pool, tenants.a, "t-report")
    await budgets.set_budget(pool, tenants.a, "usd", 10, task_id=task.id)
    artifact = {"tenant_id": tenants.a, "task_id": task.id, "kind": "report", "uri": "s3://r"}
    await F.insert(admin_conn, "agent_artifacts", artifact)
    await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, "every tenant") == 0
    kept = "SELECT count(*) FROM agent_budgets WHERE task_id = $1"
    assert await admin_conn.fetchval(kept, task.id) == 1


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G22_a_live_task_s_signals_do_not_hold_back_a_finished_task_s_purge(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A live task's signals stay with it; they say nothing about another, finished task of
    the tenant whose audit trail has gone: the tasks purge takes that one. Kills generated
    ``gen-0020.books_first-agentdb_purge_tasks-and-45`` (one tenant's purge holding back
    every task while any signal of the tenant is left)."""
    live = await tasks.create(pool, tenants.a, "t-live")
    await tasks.signal(pool, tenants.a, live.id, "note")
    done = await tasks.create(pool, tenants.a, "t-done")
    await tasks.transition(pool, tenants.a, done.id, expected_version=0, to_state="cancelled")
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 1
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [live.id]
    kept = "SELECT count(*) FROM agent_signals WHERE tenant_id = $1 AND task_id = $2"
    assert await admin_conn.fetchval(kept, tenants.a, live.id) == 1


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_an_operation_an_artifact_refers_to_stays(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A settled operation whose audit trail has gone stays while its tenant's artifact
    refers to it: the operations purge passes over it (and deletes it once the artifact is
    gone, the control). Kills generated ``gen-0023.event_expiry-agentdb_purge-and-16``
    (every tenant's purge forgetting the artifact: the delete refused by its foreign key)."""
    task = await tasks.create(pool, tenants.a, "t-report")
    res = await operations.reserve(pool, tenants.a, task.id, "k", "render", {})
    await operations.complete(pool, res.operation, result={})
    artifact = {"tenant_id": tenants.a, "kind": "report", "uri": "s3://a/1",
                "operation_id": res.operation.id}  # fmt: skip
    await F.insert(admin_conn, "agent_artifacts", artifact)
    await _trail_gone(admin_conn)
    assert await _purge(admin_conn, tenants.a, "operations", scope) == 0
    await admin_conn.execute("DELETE FROM agent_artifacts WHERE tenant_id = $1", tenants.a)
    assert await _purge(admin_conn, tenants.a, "operations", scope) == 1


async def test_G2_G9_a_tenant_s_operations_purge_is_not_filled_by_another_tenant_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant b's settled operations, written first, and then a's one are all ready to go.
    One tenant's purge of a, in batches of one, takes a's operation: b's never take its
    batch's place. Kills generated ``gen-0023.event_expiry-agentdb_purge_tenant-tenant-9``
    (the batch picked from every tenant's operations, then deleted in a's alone)."""
    for tenant, n in ((tenants.b, 3), (tenants.a, 1)):
        task = await tasks.create(pool, tenant, "t-ops")
        for i in range(n):
            res = await operations.reserve(pool, tenant, task.id, f"k{i}", "send", {})
            await operations.complete(pool, res.operation, result={})
    await _trail_gone(admin_conn)
    one = "SELECT agentdb_purge_tenant($1, 'operations', 1, interval '0')"
    assert await admin_conn.fetchval(one, tenants.a) == 1
    count = "SELECT count(*) FROM agent_operations WHERE tenant_id = $1"
    assert (
        await admin_conn.fetchval(count, tenants.a),
        await admin_conn.fetchval(count, tenants.b),
    ) == (0, 3)


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G25_a_finished_task_s_steps_go_with_it_at_its_age_this_instant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A finished task with a recorded step, last updated exactly the purge's age ago, goes
    with its step (``<=``), in one tenant's purge and in every tenant's. In one transaction,
    where now() stands still. Kills generated ``gen-0020.books_first-agentdb_purge_tasks-cmp-5``
    (every tenant's steps delete at ``<``: the step kept, and with it the task)."""
    from agentdb import steps

    task = await tasks.create(pool, tenants.a, "t-stepped")
    [held] = await leases.claim(pool, "w", task_types=["t-stepped"])
    assert held.lease is not None
    await steps.record(pool, tenants.a, task.id, "plan", kind="step", input_hash=F.HASH,
                       result='{"n": 1}', lease=held.lease)  # fmt: skip
    await tasks.transition(pool, tenants.a, task.id, lease=held.lease,
                           expected_version=held.state_version, to_state="succeeded")  # fmt: skip
    await _trail_gone(admin_conn)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes: the version guard is off
        await admin_conn.execute(
            "UPDATE agent_tasks SET updated_at = now() - interval '1 hour' WHERE id = $1", task.id
        )
        await admin_conn.execute("SET LOCAL session_replication_role = origin")
        if scope == "one tenant":
            one = "SELECT agentdb_purge_tenant($1, 'tasks', 100, interval '1 hour')"
            gone = await admin_conn.fetchval(one, tenants.a)
        else:
            gone = await admin_conn.fetchval(
                "SELECT agentdb_purge('tasks', 100, interval '1 hour')"
            )
    assert gone == 1
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_steps") == 0


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G22_a_finished_task_whose_trail_is_kept_keeps_its_signals(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A task finished long ago whose audit trail is still retained keeps its signals (they
    go with the task, once its trail has); the purge takes them once the trail is gone (the
    control). Kills generated ``gen-0011.retention-agentdb_purge_task_signals-and-10`` (one
    tenant's signals purge forgetting the trail)."""
    task = await tasks.create(pool, tenants.a, "t-kept")
    await tasks.signal(pool, tenants.a, task.id, "note")
    version = (await tasks.get(pool, tenants.a, task.id)).state_version
    await tasks.transition(pool, tenants.a, task.id, expected_version=version,
                           to_state="cancelled")  # fmt: skip
    assert await _purge(admin_conn, tenants.a, "signals", scope) == 0
    await _trail_gone(admin_conn)
    assert await _purge(admin_conn, tenants.a, "signals", scope) == 1


async def test_G9_G19_a_task_an_operation_keeps_keeps_its_budget(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A finished task whose operation is still kept (operations have their own age)
    stays, and so does its budget - the books go only with what they belong to. Kills
    generated ``gen-0011.retention-agentdb_purge_books-and-18`` (the operation forgotten:
    the budget taken from a task that stays)."""
    from agentdb import budgets

    task = await tasks.create(pool, tenants.a, "t-paid")
    await budgets.set_budget(pool, tenants.a, "usd", 10, task_id=task.id)
    res = await operations.reserve(pool, tenants.a, task.id, "k", "llm", {})
    await operations.complete(pool, res.operation, result={})
    version = (await tasks.get(pool, tenants.a, task.id)).state_version
    await tasks.transition(pool, tenants.a, task.id, expected_version=version,
                           to_state="cancelled")  # fmt: skip
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, "every tenant") == 0
    kept = "SELECT count(*) FROM agent_budgets WHERE task_id = $1"
    assert await admin_conn.fetchval(kept, task.id) == 1


@pytest.mark.parametrize("scope", SCOPES)
async def test_G2_G9_a_payload_purge_strips_its_tenant_s_event_not_a_twin_key_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """An event's key is its tenant's (agent_events_pkey leads with tenant_id): tenant b may
    hold an event of the id and instant of one of a's - restored from a backup, say - whose
    payload is still to be kept. a's expired payload is stripped; b's stays. Kills
    generated ``gen-0023.event_expiry-agentdb_purge-tenant-1`` (every tenant's UPDATE by id
    and instant alone) and ``agentdb_purge_tenant-tenant-2`` (one tenant's)."""
    task_a = await tasks.create(pool, tenants.a, "t", params={"n": 1})
    task_b = await tasks.create(pool, tenants.b, "t")
    await _time_passes(admin_conn, tenants.a)
    first = await admin_conn.fetchrow(
        "SELECT id, created_at FROM agent_events WHERE task_id = $1 AND payload IS NOT NULL"
        " ORDER BY id LIMIT 1",
        task_a.id,
    )
    assert first is not None
    await F.event(admin_conn, tenants.b, task_b.id, id=first["id"],
                  created_at=first["created_at"], payload='{"kept": true}')  # fmt: skip
    assert await _purge(admin_conn, tenants.a, "event_payloads", scope) >= 1
    twin = await admin_conn.fetchval(
        "SELECT payload FROM agent_events WHERE tenant_id = $1 AND id = $2",
        tenants.b, first["id"],
    )  # fmt: skip
    assert json.loads(twin) == {"kept": True}


@pytest.mark.parametrize("scope", SCOPES)
async def test_G9_G23_a_finished_parent_stays_while_its_child_is_there(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, scope: str
) -> None:
    """A parent that finished before its child - its trail gone, the child's too, the child
    still pending - is kept by the tasks purge: the child names it. Kills generated
    ``gen-0020.books_first-agentdb_purge_tasks-and-22`` (the children forgotten: the DELETE
    of the parent fails on agent_tasks_parent_fkey)."""
    parent = await tasks.create(pool, tenants.a, "t-parent")
    await tasks.create(pool, tenants.a, "t-child", parent=parent.id, child_key="c")
    await tasks.transition(pool, tenants.a, parent.id, expected_version=0, to_state="cancelled")
    await _trail_gone(admin_conn)
    assert await _purge_tasks(admin_conn, tenants.a, scope) == 0
    left = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_tasks WHERE tenant_id = $1", tenants.a
    )
    assert left == 2
