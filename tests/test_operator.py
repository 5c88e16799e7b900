"""The operator's actions (0013.operator): unique tenant names, retrying a task or a dead
message, settling an effect - in the library, by raw SQL, and from the command line.

Every CLI command with bad input ends in one line and exit 2 (a row that is
not there or a refusal: exit 1), and each action's audit event names the
actor given with ``--as`` - run as an ``agentdb_operator`` login, scoped to
the tenant named, where the action is an operator's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentdb import _db, leases, operations, outbox, overview, tasks, tenancy
from agentdb.errors import (
    DeadlineExceeded,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
)
from tests import factories as F
from tests.conftest import OPERATOR, Database, Tenants
from tests.test_cli import _cli, _one_line

# ---- tenants --------------------------------------------------------------------------


async def test_G2_a_tenant_name_finds_one_tenant_and_a_second_create_answers_it(
    admin_conn: asyncpg.Connection,
) -> None:
    first = await tenancy.create_tenant(admin_conn, "acme")
    assert await tenancy.create_tenant(admin_conn, "acme") == first
    found = await tenancy.tenant_by_name(admin_conn, "acme")
    assert found is not None
    assert (found.id, found.name) == (first, "acme")
    assert await tenancy.tenant_by_name(admin_conn, "globex") is None
    assert first in {t.id for t in await tenancy.list_tenants(admin_conn)}
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_tenants WHERE name = 'acme'") == 1
    # The name is acme's: another id under it is a conflict, not a second acme.
    with pytest.raises(IdempotencyConflict):
        await tenancy.create_tenant(admin_conn, "acme", tenant_id=uuid.uuid4())
    assert await tenancy.create_tenant(admin_conn, "acme", tenant_id=first) == first


async def test_G2_two_racing_creates_of_one_name_make_one_tenant(db: Database) -> None:
    """The first create holds the name uncommitted; the second waits for it and then
    answers with the first's tenant (on Citus: the claim in agent_tenant_names)."""
    first, second = await db.connect(), await db.connect()
    try:
        txn = first.transaction()
        await txn.start()
        held = await tenancy.create_tenant(first, "racing")
        waiting = asyncio.ensure_future(tenancy.create_tenant(second, "racing"))
        watcher = await db.connect()
        try:
            await F.wait_until_blocked(watcher, second.get_server_pid())
        finally:
            await watcher.close()
        assert not waiting.done()  # it waits on the uncommitted name
        await txn.commit()
        assert await waiting == held
        count = await first.fetchval("SELECT count(*) FROM agent_tenants WHERE name = 'racing'")
        assert count == 1
    finally:
        await first.close()
        await second.close()


async def test_G2_a_name_whose_tenant_was_deleted_goes_to_the_next_create(
    admin_conn: asyncpg.Connection,
) -> None:
    gone = await tenancy.create_tenant(admin_conn, "gone")
    # A tenant with no rows: nothing to keep for an audit retention, gone in one run.
    assert (await tenancy.delete_tenant(admin_conn, gone, dry_run=False)).complete
    assert await tenancy.tenant_by_name(admin_conn, "gone") is None
    again = await tenancy.create_tenant(admin_conn, "gone")
    assert again != gone
    found = await tenancy.tenant_by_name(admin_conn, "gone")
    assert found is not None
    assert found.id == again
    assert await tenancy.create_tenant(admin_conn, "gone") == again


# ---- retrying a task ------------------------------------------------------------------


async def _finished(pool: _db.Pool, tenant: uuid.UUID, to_state: str, **kw: object) -> uuid.UUID:
    """A task claimed once and finished in ``to_state`` by its worker."""
    task = await tasks.create(pool, tenant, "job", **kw)  # type: ignore[arg-type]
    [claimed] = await leases.claim(pool, "w1", task_types=["job"])
    await tasks.transition(
        pool, tenant, task.id, expected_version=claimed.state_version, to_state=to_state,
        error=f"it {to_state}", lease=claimed.lease,
    )  # fmt: skip
    return task.id


async def test_G6_retry_puts_a_failed_or_dead_task_back_to_pending_with_its_event(
    agentdb_pool: _db.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    for state in ("failed", "dead"):
        task_id = await _finished(agentdb_pool, tenants.a, state, max_attempts=1)
        again = await tasks.retry(agentdb_pool, tenants.a, task_id, actor="carol", reason="fixed")
        assert (again.state, again.attempts) == ("pending", 0)
        event = await admin_conn.fetchrow(
            "SELECT actor_id, from_state, to_state, payload FROM agent_events"
            " WHERE task_id = $1 AND event_type = 'task.retried'",
            task_id,
        )
        assert event is not None
        assert (event["actor_id"], event["from_state"], event["to_state"]) == (
            "carol", state, "pending"
        )  # fmt: skip
        assert json.loads(event["payload"]) == {"reason": "fixed", "attempts": 1}
        # Claimable again: its attempts were given back.
        [claimed] = await leases.claim(agentdb_pool, "w2", task_types=["job"])
        assert claimed.id == task_id


async def test_G6_retry_refuses_what_is_not_failed_or_dead(
    agentdb_pool: _db.Pool, tenants: Tenants
) -> None:
    done = await _finished(agentdb_pool, tenants.a, "succeeded")
    with pytest.raises(InvalidTransition):
        await tasks.retry(agentdb_pool, tenants.a, done, actor="carol")
    pending = await tasks.create(agentdb_pool, tenants.a, "other")
    cancelled = await tasks.cancel(agentdb_pool, tenants.a, pending.id, actor="carol")
    with pytest.raises(InvalidTransition):
        await tasks.retry(agentdb_pool, tenants.a, cancelled.id, actor="carol")
    with pytest.raises(NotFound):  # another tenant's task is not there
        await tasks.retry(agentdb_pool, tenants.b, done, actor="carol")
    late = await _finished(
        agentdb_pool, tenants.a, "failed", deadline=datetime.now(UTC) + timedelta(seconds=1)
    )
    await agentdb_pool.execute("SELECT pg_sleep(1.1)")
    with pytest.raises(DeadlineExceeded):
        await tasks.retry(agentdb_pool, tenants.a, late, actor="carol")


_BACK_TO_PENDING = (
    "UPDATE agent_tasks SET state = 'pending', state_version = state_version + 1,"
    " wake_at = now() WHERE id = $1"
)


class _Rollback(Exception):
    """Ends the transaction of a move that was let through (its event is not the point)."""


async def _back_to_pending(conn: asyncpg.Connection, task_id: uuid.UUID) -> None:
    async with conn.transaction():
        await conn.execute(_BACK_TO_PENDING, task_id)
        raise _Rollback


@pytest.mark.parametrize(
    ("state", "refused"),
    [("failed", False), ("dead", False), ("cancelled", True), ("succeeded", True)],
)
async def test_G6_raw_sql_moves_back_to_pending_only_from_failed_or_dead(
    admin_conn: asyncpg.Connection, tenants: Tenants, state: str, refused: bool
) -> None:
    """The transition guard with the two edges of 0013.operator: attack and control."""
    task_id = await F.create_task(admin_conn, tenants.a)
    async with admin_conn.transaction():  # put it in ``state`` past every guard
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_tasks SET state = $2, state_version = state_version + 1 WHERE id = $1",
            task_id,
            state,
        )
    if refused:
        with pytest.raises(asyncpg.PostgresError) as exc:
            await _back_to_pending(admin_conn, task_id)
        assert exc.value.sqlstate == "AG001"
    else:
        with pytest.raises(_Rollback):
            await _back_to_pending(admin_conn, task_id)


async def test_G6_the_retry_statement_alone_refuses_a_live_task_or_a_stale_version(
    agentdb_pool: _db.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """task_retry run on its own, as a client of the raw statements would: each of its
    guards refuses while the other lets the write through (tasks.retry checks the state
    first and reads the version it passes, so only the statement alone reaches them)."""
    # A task asleep on a signal, at its current version: the version fits, the state does
    # not (waiting -> pending is an edge, and no CHECK stands in the way as one does for a
    # running task's lease).
    live = await tasks.create(agentdb_pool, tenants.a, "live")
    [claimed] = await leases.claim(agentdb_pool, "w1", task_types=["live"])
    asleep = await tasks.transition(
        agentdb_pool, tenants.a, live.id, expected_version=claimed.state_version,
        to_state="waiting", wait_signal="approval", lease=claimed.lease,
    )  # fmt: skip
    assert asleep.state == "waiting"
    before = await admin_conn.fetchrow("SELECT * FROM agent_tasks WHERE id = $1", live.id)
    assert await tasks._retry(
        agentdb_pool, tenants.a, live.id, asleep.state_version, "mallory", {}
    ) is None  # fmt: skip
    assert await admin_conn.fetchrow("SELECT * FROM agent_tasks WHERE id = $1", live.id) == before
    # A failed task at a version it has moved on from: the state fits, the version does not.
    failed = await _finished(agentdb_pool, tenants.a, "failed", max_attempts=1)
    now = await tasks.get(agentdb_pool, tenants.a, failed)
    assert await tasks._retry(
        agentdb_pool, tenants.a, failed, now.state_version - 1, "mallory", {}
    ) is None  # fmt: skip
    assert (await tasks.get(agentdb_pool, tenants.a, failed)) == now
    retried = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_events WHERE event_type = 'task.retried'"
    )
    assert retried == 0
    # Control: both fit.
    row = await tasks._retry(agentdb_pool, tenants.a, failed, now.state_version, "carol", {})
    assert row is not None
    assert (row["state"], row["attempts"]) == ("pending", 0)


# ---- messages and effects -------------------------------------------------------------


async def _dead_message(pool: _db.Pool, tenant: uuid.UUID) -> tuple[uuid.UUID, uuid.UUID]:
    task = await tasks.create(pool, tenant, "mail")
    async with _db.transaction(pool) as conn:
        message = await outbox.enqueue(conn, tenant, "mail.sent", {}, task_id=task.id,
                                       max_attempts=1)  # fmt: skip
    [claimed] = await outbox.claim(pool, "relay-1")
    await outbox.mark_failed(pool, claimed, "consumer down", backoff=timedelta(0))
    return task.id, message


async def test_G10_a_dead_message_goes_back_to_pending_once_with_its_event(
    agentdb_pool: _db.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task_id, message = await _dead_message(agentdb_pool, tenants.a)
    with pytest.raises(NotFound):
        await outbox.retry(agentdb_pool, tenants.b, message, actor="carol")
    retried = await outbox.retry(agentdb_pool, tenants.a, message, actor="carol")
    assert (retried.state, retried.attempts) == ("pending", 0)
    with pytest.raises(InvalidTransition):  # pending now: nothing to retry
        await outbox.retry(agentdb_pool, tenants.a, message, actor="carol")
    actor = await admin_conn.fetchval(
        "SELECT actor_id FROM agent_events WHERE task_id = $1 AND event_type = 'outbox.retried'",
        task_id,
    )
    assert actor == "carol"


async def _unknown_effect(pool: _db.Pool, tenant: uuid.UUID) -> uuid.UUID:
    task = await tasks.create(pool, tenant, "charge")
    [claimed] = await leases.claim(pool, "w1", task_types=["charge"])
    reserved = await operations.reserve(
        pool, tenant, task.id, f"{task.id}/charge", "psp.charge", {"n": 1}, lease=claimed.lease
    )
    await operations.mark_unknown(pool, reserved.operation, error="timeout", lease=claimed.lease)
    await tasks.cancel(pool, tenant, task.id, actor="ops")
    return reserved.operation.id


async def test_G13_unsettled_lists_no_effect_of_a_task_under_a_live_lease(
    agentdb_pool: _db.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """An unknown effect whose holder still runs is its holder's to settle: the operator is
    offered it to reconcile only once the lease has run out."""
    task = await tasks.create(agentdb_pool, tenants.a, "charge")
    [claimed] = await leases.claim(agentdb_pool, "w1", task_types=["charge"])
    reserved = await operations.reserve(
        agentdb_pool, tenants.a, task.id, f"{task.id}/charge", "psp.charge", {"n": 1},
        lease=claimed.lease,
    )  # fmt: skip
    await operations.mark_unknown(
        agentdb_pool, reserved.operation, error="timeout", lease=claimed.lease
    )
    listed = await overview.unsettled(agentdb_pool, tenants.a)
    assert str(reserved.operation.id) not in {r["id"] for r in listed}
    # Control: the holder is gone (its lease ran out), so the effect is the operator's.
    await F.expire_lease(admin_conn, task.id)
    listed = await overview.unsettled(agentdb_pool, tenants.a)
    assert str(reserved.operation.id) in {r["id"] for r in listed}


# ---- the command line -----------------------------------------------------------------

BAD_INPUT: list[tuple[list[str], str]] = [
    (["tenant", "create", ""], "1 to 200"),
    (["tenant", "get", "no-such-tenant"], "no tenant"),
    (["task", "create", "x", "--params", "{oops"], "not JSON"),
    (["task", "create", "x", "--params", "[1]"], "JSON object"),
    (["task", "get", "not-a-uuid"], "not a task id"),
    (["task", "list", "--limit", "0"], "--limit"),
    (["task", "list", "--state", "sleeping"], "invalid choice"),
    (["task", "cancel", "nope"], "not a task id"),
    (["task", "retry", "nope"], "not a task id"),
    (["task", "events", "nope"], "not a task id"),
    (["signal", "send", "nope", "note"], "not a task id"),
    (["signal", "send", str(uuid.UUID(int=1)), "note", "--payload", "x"], "not JSON"),
    (["approve", str(uuid.UUID(int=1))], "--as"),
    (["reject", "nope", "--as", "carol"], "not a task id"),
    (["effects", "list"], "--unsettled"),
    (["effects", "reconcile", "nope", "--reference", "r"], "not a operation id"),
    (["effects", "reconcile", str(uuid.UUID(int=1))], "--reference"),
    (["effects", "fail", "nope", "--error", "e"], "not a operation id"),
    (["outbox", "list"], "--dead"),
    (["outbox", "retry", "nope"], "not a message id"),
]


@pytest.mark.parametrize(
    ("argv", "fragment"), BAD_INPUT, ids=[" ".join(a[:2]) for a, _ in BAD_INPUT]
)
def test_every_operator_command_with_bad_input_is_one_line_and_exit_2(
    db: Database, tenants: Tenants, argv: list[str], fragment: str
) -> None:
    needs_tenant = argv[0] != "tenant"
    extra = ["--tenant", str(tenants.a)] if needs_tenant else []
    _one_line(_cli(*argv, *extra, "--dsn", db.admin_dsn), 2, fragment)


def test_an_unknown_tenant_name_is_bad_input_and_a_missing_row_a_failure(
    db: Database, tenants: Tenants
) -> None:
    _one_line(_cli("task", "list", "--tenant", "globex", "--dsn", db.admin_dsn), 2, "globex")
    missing = str(uuid.uuid4())
    for argv in (
        ["task", "get", missing],
        ["task", "retry", missing],
        ["effects", "fail", missing, "--error", "e"],
        ["outbox", "retry", missing],
    ):
        _one_line(_cli(*argv, "--tenant", str(tenants.a), "--dsn", db.admin_dsn), 1, "not found")


def _json(result: object) -> dict[str, object]:
    out = getattr(result, "stdout", "")
    assert getattr(result, "returncode", 1) == 0, getattr(result, "stderr", "")
    value = json.loads(out)
    assert isinstance(value, dict)
    return value


async def test_each_cli_action_names_its_actor_in_the_audit_trail(
    db: Database,
    tenants: Tenants,
    agentdb_pool: _db.Pool,
    admin_conn: asyncpg.Connection,
) -> None:
    import asyncio

    def cli(*argv: str, login: str | None = OPERATOR) -> dict[str, object]:
        dsn = db.admin_dsn if login is None else db.url(login)
        return _json(_cli(*argv, "--tenant", str(tenants.a), "--dsn", dsn, "--json"))

    async def actor_of(event_type: str, task_id: object) -> object:
        return await admin_conn.fetchval(
            "SELECT actor_id FROM agent_events WHERE task_id = $1 AND event_type = $2"
            " ORDER BY id DESC LIMIT 1",
            uuid.UUID(str(task_id)),
            event_type,
        )

    # Creating a task is the owner's (the operator role creates none).
    created = await asyncio.to_thread(cli, "task", "create", "job", "--as", "carol", login=None)
    assert await actor_of("task.created", created["id"]) == "carol"
    sent = await asyncio.to_thread(cli, "signal", "send", str(created["id"]), "note", "--as", "dan")
    assert await actor_of("task.signalled", sent["task_id"]) == "dan"
    approved = await asyncio.to_thread(cli, "approve", str(created["id"]), "--as", "erin")
    assert await actor_of("task.approved", approved["task_id"]) == "erin"
    rejected = await asyncio.to_thread(cli, "reject", str(created["id"]), "--as", "frank")
    assert await actor_of("task.rejected", rejected["task_id"]) == "frank"
    await asyncio.to_thread(cli, "task", "cancel", str(created["id"]), "--as", "gina")
    assert await actor_of("task.cancelled", created["id"]) == "gina"

    failed = await _finished(agentdb_pool, tenants.a, "failed")
    await asyncio.to_thread(cli, "task", "retry", str(failed), "--as", "hal")
    assert await actor_of("task.retried", failed) == "hal"

    task_id, message = await _dead_message(agentdb_pool, tenants.a)
    listed = await asyncio.to_thread(_cli, "outbox", "list", "--dead", "--tenant", str(tenants.a),
                                     "--dsn", db.url(OPERATOR))  # fmt: skip
    assert str(message) in listed.stdout
    await asyncio.to_thread(cli, "outbox", "retry", str(message), "--as", "ivy")
    assert await actor_of("outbox.retried", task_id) == "ivy"

    for verb in ("reconcile", "fail"):
        op_id = await _unknown_effect(agentdb_pool, tenants.a)
        unsettled = await asyncio.to_thread(
            _cli, "effects", "list", "--unsettled", "--tenant", str(tenants.a),
            "--dsn", db.url(OPERATOR),
        )  # fmt: skip
        assert str(op_id) in unsettled.stdout
        how = ["--reference", "ch_1"] if verb == "reconcile" else ["--error", "declined"]
        await asyncio.to_thread(cli, "effects", verb, str(op_id), *how, "--as", "jo")
        actor = await admin_conn.fetchval(
            "SELECT actor_id FROM agent_events WHERE operation_id = $1 ORDER BY id DESC LIMIT 1",
            op_id,
        )
        assert actor == "jo"

    # The operator's login sees only the tenant it is scoped to: b's task is not there.
    other = await tasks.create(agentdb_pool, tenants.b, "job")
    result = await asyncio.to_thread(
        _cli, "task", "get", str(other.id), "--tenant", str(tenants.a), "--dsn", db.url(OPERATOR)
    )
    _one_line(result, 1, "not found")
    timeline = await asyncio.to_thread(cli, "task", "events", str(created["id"]))
    events = timeline["events"]
    assert isinstance(events, list)
    assert events[0]["event_type"] == "task.created"
