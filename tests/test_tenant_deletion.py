"""G17: deleting a tenant follows its policy; dry run and real run agree; a rerun is a no-op.

The article's scenario: "delete a tenant in a test environment and verify its
tasks, operations, artifacts and credentials follow the intended policy".
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import leases, operations, outbox, schedules, steps, tasks
from agentdb.errors import NotFound
from agentdb.models import Message
from agentdb.tenancy import TenantDeletion, delete_tenant
from tests import factories as F
from tests.conftest import AGENT_A, Database, Tenants

PAST = datetime.now(UTC) - timedelta(days=1)

_COUNTS = """
SELECT (SELECT count(*) FROM agent_tasks WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_operations WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_events WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_events WHERE tenant_id = $1 AND payload IS NOT NULL),
       (SELECT count(*) FROM agent_outbox WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_inbox WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_artifacts WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_credential_refs WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_principals WHERE tenant_id = $1),
       (SELECT count(*) FROM agent_tenants WHERE id = $1)
"""


async def _counts(admin: asyncpg.Connection, tenant: uuid.UUID) -> tuple[int, ...]:
    row = await admin.fetchrow(_COUNTS, tenant)
    assert row is not None
    return tuple(row)


async def _populate(pool: asyncpg.Pool, admin: asyncpg.Connection, tenant: uuid.UUID) -> uuid.UUID:
    """Every kind of row a tenant can own; returns the id of a task whose audit trail expired."""
    kind = f"report-{tenant.hex[:8]}"  # claims stay within this tenant's tasks
    done = await tasks.create(pool, tenant, kind, params={"customer": "Ada Lovelace"})
    [claimed] = await leases.claim(pool, f"w-{tenant.hex[:4]}", task_types=[kind])
    res = await operations.reserve(
        pool, tenant, done.id, "mail-1", "send", {"to": "ada@example.com"}, lease=claimed.lease
    )
    await operations.complete(
        pool, res.operation, result={"msg": "m_1"}, provider_reference="m_1", lease=claimed.lease
    )
    assert claimed.lease is not None
    await steps.record(pool, tenant, done.id, "plan", kind="step", input_hash=F.HASH,
                       result='{"pages": 3}', lease=claimed.lease)  # fmt: skip
    failed = await operations.reserve(
        pool, tenant, done.id, "sms-1", "sms", {"to": "+100"}, lease=claimed.lease
    )
    await operations.fail(pool, failed.operation, "number unknown: +100", lease=claimed.lease)
    await tasks.transition(
        pool,
        tenant,
        done.id,
        expected_version=claimed.state_version,
        to_state="succeeded",
        lease=claimed.lease,
        payload={"pages": 3},
        outbox=[F_message()],
    )
    await tasks.create(pool, tenant, kind, params={"customer": "Grace Hopper"})  # still pending
    # A task whose whole audit trail is already past its retention.
    old = F.task_row(tenant, params='{"customer": "Alan Turing"}')
    async with admin.transaction():
        await F.insert(admin, "agent_tasks", old)
        await F.event(
            admin,
            tenant,
            old["id"],
            task_state_version=0,
            payload_expires_at=PAST,
            retain_until=PAST,
        )
    async with pool.acquire() as conn:
        await outbox.enqueue(conn, tenant, "report.ready", {"task": str(done.id)})
    await F.insert(
        admin, "agent_inbox", {"tenant_id": tenant, "consumer": "c", "message_id": uuid.uuid4()}
    )
    for uri in ("s3://reports/ada.pdf", "s3://reports/ada.png"):
        await F.insert(
            admin,
            "agent_artifacts",
            {"tenant_id": tenant, "kind": "report", "uri": uri, "task_id": done.id},
        )
    for name, ref in (("mail", "vault://kv/mail"), ("sms", "aws-sm://prod/sms")):
        await F.insert(
            admin,
            "agent_credential_refs",
            {"tenant_id": tenant, "name": name, "provider": name, "secret_ref": ref},
        )
    return uuid.UUID(str(old["id"]))


def F_message() -> Message:
    return Message("report.done", {"pages": 3})


def _affected(report: TenantDeletion) -> list[tuple[int, str, str, int, tuple[str, ...]]]:
    return [(s.step, s.object, s.action, s.affected, s.refs) for s in report.steps]


async def test_G17_tenant_deletion_follows_the_policy(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    expired_task = await _populate(pool, admin_conn, tenants.a)
    await _populate(pool, admin_conn, tenants.b)
    b_before = await _counts(admin_conn, tenants.b)
    a_before = await _counts(admin_conn, tenants.a)

    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    assert await _counts(admin_conn, tenants.a) == a_before  # a dry run changes nothing
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(real)  # they agree, step by step
    assert dry.retained_until == real.retained_until

    by_action = {(s.object, s.action): s for s in real.steps}
    assert real.artifact_uris == ("s3://reports/ada.pdf", "s3://reports/ada.png")
    assert real.credential_refs == ("aws-sm://prod/sms", "vault://kv/mail")
    assert by_action["agent_tasks", "cancel and anonymise"].affected == 2  # the expired one goes
    assert by_action["agent_operations", "anonymise"].affected == 2
    assert by_action["agent_tasks", "delete (no retained events)"].affected == 1  # the expired one
    assert by_action["agent_steps", "delete"].affected == 1  # a handler's memory, not history
    steps_left = "SELECT count(*) FROM agent_steps WHERE tenant_id = $1"
    assert await admin_conn.fetchval(steps_left, tenants.a) == 0
    assert await admin_conn.fetchval(steps_left, tenants.b) == 1
    assert not real.complete
    assert real.retained_until is not None
    assert real.retained_until > datetime.now(UTC) + timedelta(days=300)

    tasks_left, ops, events, payloads, out, inb, arts, creds, pins, tenant_rows = await _counts(
        admin_conn, tenants.a
    )
    assert (out, inb, arts, creds, pins, payloads) == (0, 0, 0, 0, 0, 0)
    assert (tasks_left, ops, tenant_rows) == (2, 2, 1)  # kept only for their audit trail
    assert events > 0
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_tasks WHERE id = $1", expired_task)
        == 0
    )
    leftovers = await admin_conn.fetch(
        "SELECT state, params, last_error FROM agent_tasks WHERE tenant_id = $1", tenants.a
    )
    assert {(r["state"], r["params"], r["last_error"]) for r in leftovers} == {
        ("succeeded", "{}", None),
        ("cancelled", "{}", None),
    }
    assert await admin_conn.fetchval(
        "SELECT count(*) FROM agent_operations WHERE tenant_id = $1 AND (result IS NOT NULL"
        " OR error IS NOT NULL)", tenants.a,
    ) == 0  # fmt: skip
    assert await admin_conn.fetchval(
        "SELECT state FROM agent_tenants WHERE id = $1", tenants.a
    ) == "deleting"  # fmt: skip
    # The tenant's pinned agent login now sees nothing at all.
    agent = await db.connect(AGENT_A)
    try:
        assert await agent.fetchval("SELECT count(*) FROM agent_tasks") == 0
    finally:
        await agent.close()
    assert await _counts(admin_conn, tenants.b) == b_before  # the other tenant is untouched

    again = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    changed = [s for s in again.steps if s.affected and s.action != "retain for audit"]
    assert changed == []  # a second run is a no-op
    assert await _counts(admin_conn, tenants.a) == (tasks_left, ops, events, 0, 0, 0, 0, 0, 0, 1)


async def test_G17_after_the_retention_passes_the_tenant_is_gone(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    await _populate(pool, admin_conn, tenants.a)
    await delete_tenant(admin_conn, tenants.a, dry_run=False)
    await _retention_passes(admin_conn, tenants.a)
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    final = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(final)
    assert final.complete
    assert await _counts(admin_conn, tenants.a) == (0,) * 10
    with pytest.raises(NotFound):
        await delete_tenant(admin_conn, tenants.a, dry_run=True)


async def _retention_passes(admin_conn: asyncpg.Connection, tenant: uuid.UUID) -> None:
    """Time passes for ``tenant``'s events: only a superuser with triggers off can fake
    that (the append-only guard refuses any other change to retain_until)."""
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = $2, retain_until = $2"
            " WHERE tenant_id = $1",
            tenant,
            PAST,
        )


async def test_G17_another_tenants_retained_events_do_not_hold_this_tenant_back(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """Kills the class "a tenant-scoped subquery of the deletion plan compares the tenant
    the wrong way" (generated ``gen-0011.retention-agentdb_delete_tenant-cmp-75``: step 15's
    dry run with ``e.tenant_id <> t.id``): once this tenant's retention has passed, the dry
    run says the tenant goes, as the real run does - while tenant b, untouched, still keeps
    its own audit trail."""
    await _populate(pool, admin_conn, tenants.a)
    await _populate(pool, admin_conn, tenants.b)
    await delete_tenant(admin_conn, tenants.a, dry_run=False)
    await _retention_passes(admin_conn, tenants.a)  # a's retention passes, b's does not
    b_before = await _counts(admin_conn, tenants.b)
    assert b_before[2] > 0  # b's events, all still retained
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    assert dry.complete  # the plan says the tenant goes ...
    final = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(final)  # ... and the real run agrees, step by step
    assert final.complete
    assert await _counts(admin_conn, tenants.a) == (0,) * 10
    assert await _counts(admin_conn, tenants.b) == b_before


async def test_G17_an_event_whose_retention_ends_now_keeps_nothing(
    tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Kills the class "a retention test of the deletion plan moved across its boundary"
    (generated ``gen-0011.retention-agentdb_delete_tenant-cmp-68``: step 7's dry run with
    ``e.retain_until >= now()``): an event retained until this very instant is past its
    retention (the purge's ``retain_until <= now()``), so its task is not anonymised but
    deleted - in the dry run as in the real run. All in one transaction, where now() stands
    still."""
    await F.create_task(admin_conn, tenants.a, params='{"customer": "Ada Lovelace"}')
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes, to this very instant
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = now(), retain_until = now()"
            " WHERE tenant_id = $1",
            tenants.a,
        )
        await admin_conn.execute("SET LOCAL session_replication_role = origin")
        dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
        real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(real)
    by_action = {(s.object, s.action): s.affected for s in real.steps}
    assert by_action["agent_tasks", "cancel and anonymise"] == 0
    assert by_action["agent_events", "delete (retention passed)"] == 1
    assert by_action["agent_tasks", "delete (no retained events)"] == 1
    assert real.complete


async def test_G17_only_the_owner_may_delete_a_tenant(
    tenants: Tenants, runtime_conn: asyncpg.Connection
) -> None:
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await delete_tenant(runtime_conn, tenants.a, dry_run=True)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentdb", "tenant", "delete", *args],
        capture_output=True,
        text=True,
        check=False,
    )


async def test_G17_cli_dry_run_then_yes(
    db: Database, tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    await _populate(pool, admin_conn, tenants.a)
    dry = _cli(str(tenants.a), "--dsn", db.admin_dsn, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] is True
    assert [s["object"] for s in plan["steps"]][:4] == [
        "agent_tenants",
        "agent_principals",
        "agent_credential_refs",
        "agent_artifacts",
    ]
    done = _cli(str(tenants.a), "--dsn", db.admin_dsn, "--yes")
    assert done.returncode == 0, done.stderr
    assert "s3://reports/ada.pdf" in done.stdout
    assert "audit events are retained until" in done.stdout
    assert "run again then to finish" in done.stdout


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["not-a-uuid", "--dry-run"], 2, "is not a tenant id"),
        ([str(uuid.uuid4())], 2, "say --dry-run"),
        ([str(uuid.uuid4()), "--yes"], 1, "not found"),
    ],
)
def test_G17_cli_bad_input_is_one_line(
    db: Database, args: list[str], code: int, fragment: str
) -> None:
    result = _cli(*args, "--dsn", db.admin_dsn)
    assert result.returncode == code, result.stderr
    assert result.stderr.count("\n") == 1
    assert fragment in result.stderr


async def test_G17_an_operation_whose_events_retention_ends_now_is_not_anonymised(
    tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """As the test above, for step 8 (operations): an operation whose every event is
    retained until this very instant keeps nothing, so it is not anonymised - the dry
    run agrees. Kills generated ``gen-0011.retention-agentdb_delete_tenant-cmp-43``
    (the dry run's ``e.retain_until >= now()``)."""
    task = await F.create_task(admin_conn, tenants.a)
    op = await F.create_operation(admin_conn, tenants.a, task)
    await F.update_operation(
        admin_conn, tenants.a, op, state="succeeded", result='{"n": 1}', state_version=1
    )
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # time passes, to this very instant
        await admin_conn.execute(
            "UPDATE agent_events SET payload_expires_at = now(), retain_until = now()"
            " WHERE tenant_id = $1",
            tenants.a,
        )
        await admin_conn.execute("SET LOCAL session_replication_role = origin")
        dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
        real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(real)
    assert {(s.object, s.action): s.affected for s in real.steps}[
        "agent_operations", "anonymise"
    ] == 0


async def test_G17_each_operation_is_judged_by_its_own_events(
    tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Three settled operations of one task: two retained for different spans, and one
    whose events are all past their retention - and whose id tenant b's operation shares
    (an operation id is unique per tenant only). Each anonymised operation's event is kept
    as long as that operation's own events; the third goes, not anonymised, and the dry
    run says so. Kills generated ``gen-0011.retention-agentdb_delete_tenant-cmp-49`` (the
    anonymisation event kept as long as *another* operation's events), ``-cmp-60`` (the
    dry run's count of operations with no retained event looking at other operations'
    events), ``-tenant-39`` (that count looking at another tenant's events) and ``-and-19``
    (the anonymisation taking an operation for any operation's retained events)."""
    task = await F.create_task(admin_conn, tenants.a)
    settled = [await F.create_operation(admin_conn, tenants.a, task) for _ in range(2)]
    for op in settled:
        await F.update_operation(
            admin_conn, tenants.a, op, state="succeeded", result='{"n": 1}', state_version=1
        )
    gone = await F.create_operation(admin_conn, tenants.a, task)
    await F.update_operation(
        admin_conn, tenants.a, gone, state="succeeded", result='{"n": 2}', state_version=1
    )
    await F.create_operation(admin_conn, tenants.b, await F.create_task(admin_conn, tenants.b),
                             id=gone)  # fmt: skip
    now = await admin_conn.fetchval("SELECT now()")
    keep = {settled[0]: now + timedelta(days=10), settled[1]: now + timedelta(days=20)}
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # each operation's retention, as a policy would set it
        for op, until in [*keep.items(), (gone, PAST)]:
            await admin_conn.execute(
                "UPDATE agent_events SET payload_expires_at = $3, retain_until = $3"
                " WHERE tenant_id = $1 AND operation_id = $2",
                tenants.a, op, until,
            )  # fmt: skip
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(real)
    affected = {(s.object, s.action): s.affected for s in real.steps}
    assert affected["agent_operations", "anonymise"] == 2
    assert affected["agent_operations", "delete (no retained events)"] == 1
    rows = await admin_conn.fetch(
        "SELECT operation_id, retain_until FROM agent_events"
        " WHERE tenant_id = $1 AND event_type = 'operation.anonymised'",
        tenants.a,
    )
    assert {r["operation_id"]: r["retain_until"] for r in rows} == keep
    left = "SELECT count(*) FROM agent_operations WHERE tenant_id = $1 AND id = $2"
    assert await admin_conn.fetchval(left, tenants.a, gone) == 0
    assert await admin_conn.fetchval(left, tenants.b, gone) == 1


@pytest.mark.parametrize("state", ["pending", "running", "waiting"])
async def test_G17_an_open_task_is_cancelled_and_the_dry_run_says_so(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection, state: str
) -> None:
    """A task pending, running or waiting (for a signal) - with no params, no error, no
    step: nothing to anonymise, so only its state picks it - is cancelled by the deletion,
    and the dry run counts it. Kills generated
    ``gen-0011.retention-agentdb_delete_tenant-list-2`` (the dry run's list of open states
    without 'waiting') and ``-list-9`` (the deletion's without 'running': the task kept
    running, its lease held)."""
    task = await tasks.create(pool, tenants.a, "t-open")
    if state != "pending":
        [held] = await leases.claim(pool, "w", task_types=["t-open"])
        assert held.lease is not None
        if state == "waiting":
            await tasks.wait_for_signal(pool, held, "go", lease=held.lease)
    before = await admin_conn.fetchrow(
        "SELECT state, params, last_error, current_step FROM agent_tasks WHERE id = $1", task.id
    )
    assert before is not None
    assert tuple(before) == (state, "{}", None, None)
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(real)
    assert {(s.object, s.action): s.affected for s in real.steps}[
        "agent_tasks", "cancel and anonymise"
    ] == 1
    after = await admin_conn.fetchrow(
        "SELECT state, lease_owner FROM agent_tasks WHERE id = $1", task.id
    )
    assert after is not None
    assert tuple(after) == ("cancelled", None)


async def test_G17_the_dry_run_counts_the_tenant_s_own_schedules(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant b's schedules and budgets are not a's to delete: the dry run counts a's one
    of each, as the real run deletes them, and b's stay. Kills generated
    ``gen-0011.retention-agentdb_delete_tenant-tenant-2`` and ``-tenant-5`` (the dry run
    counting every tenant's schedules, budgets)."""
    from agentdb import budgets

    await schedules.create(pool, tenants.a, "nightly", "report", every=timedelta(days=1))
    await budgets.set_budget(pool, tenants.a, "usd", 10)
    for name in ("nightly", "hourly"):
        await schedules.create(pool, tenants.b, name, "report", every=timedelta(hours=1))
        await budgets.set_budget(pool, tenants.b, name, 10)
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    for plan in (dry, real):
        affected = {s.object: s.affected for s in plan.steps}
        assert (affected["agent_schedules"], affected["agent_budgets"]) == (1, 1)
    assert len(await schedules.of_tenant(pool, tenants.b)) == 2


async def test_G2_G17_a_twin_task_s_retained_events_keep_nothing_of_this_tenant(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Task ids are unique per tenant only (create takes the caller's): tenant b's task of
    the id of a's, its audit trail still retained, says nothing about a's task, whose trail
    has passed - a's is neither anonymised nor kept, nor is b's trail counted as a's. Kills
    generated ``gen-0011.retention-agentdb_delete_tenant-tenant-24`` and ``-tenant-26``
    (step 7, dry and real: b's events anonymise a's task), ``-tenant-37`` (step 11: b's
    events counted as retained for a) and ``-tenant-43`` (step 13's dry run: b's events
    keep a's task)."""
    shared = uuid.uuid4()
    for tenant in (tenants.a, tenants.b):
        await tasks.create(pool, tenant, "t-twin", params={"customer": "Ada"}, task_id=shared)
        await tasks.transition(pool, tenant, shared, expected_version=0, to_state="cancelled")
    await _retention_passes(admin_conn, tenants.a)
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    for plan in (dry, real):
        by_step = {s.step: s for s in plan.steps}
        assert (by_step[7].affected, by_step[11].affected, by_step[13].affected) == (0, 0, 1)
        assert by_step[11].retained_until is None
    left = await admin_conn.fetch("SELECT tenant_id, params FROM agent_tasks WHERE id = $1", shared)
    assert [(r["tenant_id"], json.loads(r["params"])) for r in left] == [
        (tenants.b, {"customer": "Ada"})
    ]


async def test_G17_G23_a_parent_goes_with_its_child_though_another_task_s_trail_is_kept(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A parent is kept while a child of its own still has an audit trail (the child's
    row must stay, and it names the parent); once neither has one, both go - though
    another task of the tenant keeps its trail, and so stays. Kills generated
    ``gen-0006.control_flow-agentdb_keep_parent-and-3`` (any event of the tenant keeping
    every parent)."""
    parent = await tasks.create(pool, tenants.a, "t-parent")
    child = await tasks.create(pool, tenants.a, "t-child", parent=parent.id, child_key="c")
    for task in (child, parent):
        await tasks.transition(pool, tenants.a, task.id, expected_version=0, to_state="cancelled")
    await _retention_passes(admin_conn, tenants.a)
    kept = await tasks.create(pool, tenants.a, "t-kept")  # its trail is new: retained
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert {s.step: s.affected for s in real.steps}[13] == 2
    left = await admin_conn.fetch("SELECT id FROM agent_tasks WHERE tenant_id = $1", tenants.a)
    assert [r["id"] for r in left] == [kept.id]


async def test_G17_a_deletion_takes_the_tenant_s_own_signals_and_counts_its_own_operations(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Each tenant has a task with a signal, and b an operation whose audit trail has run
    out: deleting a takes a's signal and leaves b's, and its dry run counts only a's
    operations that no retained event refers to (none), as the real run deletes them.
    Kills generated ``gen-0011.retention-agentdb_delete_tenant-cmp-10`` (every other
    tenant's signals deleted, a's kept) and ``-tenant-38`` (the dry run counting every
    tenant's operations whose trail has gone)."""
    for tenant in (tenants.a, tenants.b):
        task = await tasks.create(pool, tenant, "t-signalled")
        await tasks.signal(pool, tenant, task.id, "note")
    b_task = await tasks.create(pool, tenants.b, "t-op")
    await operations.reserve(pool, tenants.b, b_task.id, "k", "llm", {})
    await _retention_passes(admin_conn, tenants.b)
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(real)
    assert {s.object: s.affected for s in real.steps}["agent_signals"] == 1
    left = await admin_conn.fetch("SELECT tenant_id FROM agent_signals")
    assert [r["tenant_id"] for r in left] == [tenants.b]


async def test_G2_G17_another_tenant_s_task_whose_trail_was_purged_stays(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant b's cancelled task whose whole audit trail the events purge took has no event
    at all - what the deletion of a tenant judges its own tasks by - yet deleting tenant a
    leaves it: only a's tasks are a's to delete. Kills generated
    ``gen-0011.retention-agentdb_delete_tenant-tenant-44`` (step 13 deleting every tenant's
    tasks that no event refers to)."""
    gone = await tasks.create(pool, tenants.a, "t-gone")
    kept = await tasks.create(pool, tenants.b, "t-kept")
    for tenant, task in ((tenants.a, gone), (tenants.b, kept)):
        await tasks.transition(pool, tenant, task.id, expected_version=0, to_state="cancelled")
    await _retention_passes(admin_conn, tenants.b)
    purge = "SELECT agentdb_purge_tenant($1, 'events', 100, interval '0')"
    assert await admin_conn.fetchval(purge, tenants.b) == 2
    real = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert {s.step: s.affected for s in real.steps}[13] == 0  # a's task keeps its trail
    left = await admin_conn.fetch("SELECT tenant_id, id FROM agent_tasks")
    assert sorted((r["tenant_id"] == tenants.a, r["id"]) for r in left) == sorted(
        [(False, kept.id), (True, gone.id)]
    )


async def test_G17_a_dry_run_after_the_deletion_plans_no_task_the_rerun_leaves_alone(
    tenants: Tenants, pool: asyncpg.Pool, admin_conn: asyncpg.Connection
) -> None:
    """Once the deletion has cancelled and anonymised the tenant's tasks - their audit
    trails still retained - a second dry run plans what a second real run does: nothing
    for the tasks. Kills generated ``gen-0011.retention-agentdb_delete_tenant-and-5`` (the
    dry run counting every task with a retained trail, anonymised already or not)."""
    await _populate(pool, admin_conn, tenants.a)
    await delete_tenant(admin_conn, tenants.a, dry_run=False)
    dry = await delete_tenant(admin_conn, tenants.a, dry_run=True)
    again = await delete_tenant(admin_conn, tenants.a, dry_run=False)
    assert _affected(dry) == _affected(again)
    planned = {(s.object, s.action): s.affected for s in dry.steps}
    assert planned["agent_tasks", "cancel and anonymise"] == 0
    retained = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_tasks t WHERE t.tenant_id = $1 AND EXISTS ("
        " SELECT 1 FROM agent_events e WHERE e.tenant_id = t.tenant_id AND e.task_id = t.id"
        " AND e.retain_until > now())",
        tenants.a,
    )
    assert retained > 0  # tasks the mutant's count would take: their trails are kept


async def test_G2_G17_a_task_s_anonymisation_is_kept_as_long_as_its_own_trail_not_a_twin_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenants a and b each have a task of one id (task ids are the caller's), a's audit
    trail kept 10 days, b's 20. Deleting tenant a anonymises its task with an event kept
    as long as a's own trail - 10 days, not b's 20. Kills generated
    ``gen-0011.retention-agentdb_delete_tenant-tenant-27`` (the trail's end read over every
    tenant's events of that task id)."""
    shared = uuid.uuid4()
    now = await admin_conn.fetchval("SELECT now()")
    keep = {tenants.a: now + timedelta(days=10), tenants.b: now + timedelta(days=20)}
    for tenant in keep:
        await tasks.create(pool, tenant, "t-twin", params={"customer": "Ada"}, task_id=shared)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)  # each tenant's retention, as a policy would set it
        for tenant, until in keep.items():
            await admin_conn.execute(
                "UPDATE agent_events SET payload_expires_at = $2, retain_until = $2"
                " WHERE tenant_id = $1",
                tenant, until,
            )  # fmt: skip
    await delete_tenant(admin_conn, tenants.a, dry_run=False)
    kept = await admin_conn.fetch(
        "SELECT retain_until FROM agent_events"
        " WHERE tenant_id = $1 AND task_id = $2 AND event_type = 'task.anonymised'",
        tenants.a, shared,
    )  # fmt: skip
    assert [r["retain_until"] for r in kept] == [keep[tenants.a]]
