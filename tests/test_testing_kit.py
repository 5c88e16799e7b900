"""The testing kit (agentdb.testing): its plugin's fixtures, drain, the ledger assertions and
the crash matrix - each against real Postgres, the crash matrix with real worker processes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import asyncpg
import pytest

from agentdb import inbox, outbox, schema, tasks
from agentdb.models import OutboxMessage
from agentdb.testing import (
    WORKER_POINTS,
    CrashTestError,
    Database,
    DrainTimeout,
    LedgerAssertion,
    NotIdempotent,
    assert_events,
    assert_inbox,
    assert_operation,
    assert_outbox,
    assert_tasks,
    crash_test,
    drain,
)
from agentdb.tools.pgbouncer import Bouncer
from tests import kit_handlers as kit
from tests.conftest import RUNTIME, Tenants
from tests.conftest import Database as SuiteDatabase

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    """examples/test_my_handlers.py, imported as the module its worker processes import."""
    path = ROOT / "examples" / "test_my_handlers.py"
    spec = importlib.util.spec_from_file_location("test_my_handlers", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


# --- the plugin -----------------------------------------------------------------------------


def test_the_plugin_is_registered_and_the_testing_extra_is_exactly_what_it_needs() -> None:
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="pytest11") if e.name == "agentdb"] == [
        "agentdb.testing.plugin"
    ]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    testing = {d.split(">")[0] for d in project["optional-dependencies"]["testing"]}
    assert testing == {"pytest", "pytest-asyncio", "pgserver"}
    assert project["entry-points"]["pytest11"] == {"agentdb": "agentdb.testing.plugin"}


def test_the_plugin_registers_nothing_and_breaks_nothing_without_pytest_asyncio() -> None:
    """pytest imports every installed plugin: agentdb without [testing] must not break it."""
    probe = (
        "import sys; sys.modules['pytest_asyncio'] = None\n"
        "import agentdb.testing.plugin as p\n"
        "print(sorted(n for n in vars(p) if n.startswith('agentdb_')))\n"
        "import agentdb.testing._fixtures\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    assert run.stdout.strip() == "[]", run.stdout + run.stderr
    # The control: the fixtures module itself does need pytest-asyncio.
    assert run.returncode != 0, run.stderr
    assert "pytest_asyncio" in run.stderr, run.stderr


async def test_agentdb_db_is_a_migrated_clone_of_its_own(
    agentdb_db: Database, agentdb_template: str, admin_conn: asyncpg.Connection
) -> None:
    assert agentdb_db.name != agentdb_template
    await schema.check(admin_conn)  # MigrationError unless migrated
    # The clone is this test's alone: what it writes is not in the template.
    await admin_conn.execute(
        "INSERT INTO agent_tenants (id, name) VALUES ($1, 'only here')", uuid.uuid4()
    )
    conn = await asyncpg.connect(agentdb_db.server.url(agentdb_template))
    try:
        assert await conn.fetchval("SELECT count(*) FROM agent_tenants") == 0
    finally:
        await conn.close()


async def test_agentdb_pool_logs_in_as_agentdb_login_and_the_tenant_exists(
    agentdb_pool: asyncpg.Pool, agentdb_tenant: uuid.UUID, tenants: Tenants
) -> None:
    assert await agentdb_pool.fetchval("SELECT session_user") == RUNTIME  # the suite's override
    assert tenants.a == agentdb_tenant
    name = await agentdb_pool.fetchval("SELECT name FROM agent_tenants WHERE id = $1", tenants.a)
    assert name == "test tenant"


async def test_pooled_fixtures_go_through_pgbouncer_in_transaction_mode(
    agentdb_db: Database,
    agentdb_pooled_db: Database,
    agentdb_pooled_pool: asyncpg.Pool,
    agentdb_bouncer: Bouncer,
    agentdb_tenant: uuid.UUID,
) -> None:
    assert f":{agentdb_bouncer.port}/" in agentdb_pooled_db.dsn
    assert await agentdb_pooled_pool.fetchval("SELECT current_database()") == agentdb_db.name
    # A whole handler run through the proxy, with no named prepared statements.
    await tasks.create(agentdb_pooled_pool, agentdb_tenant, "order", params={"order": 1})
    result = await drain(agentdb_pooled_pool, kit.TWO_PROVIDERS)
    assert [t.state for t in result.tasks] == ["succeeded"], result
    assert len(await kit.psp.effects(agentdb_pooled_pool)) == 1
    assert len(await kit.mailer.effects(agentdb_pooled_pool)) == 1


# --- drain ----------------------------------------------------------------------------------


async def test_drain_runs_retries_and_reports_final_rows(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    flaky = await tasks.create(pool, tenants.a, "flaky")
    broken = await tasks.create(pool, tenants.b, "broken", max_attempts=3)
    result = await drain(pool, {"flaky": kit.flaky, "broken": kit.always_raises})
    assert result.task(flaky.id).state == "succeeded"
    assert result.task(flaky.id).attempts == 2
    dead = result.task(broken.id)
    assert (dead.state, dead.attempts) == ("dead", 3)
    assert dead.last_error == "ValueError: broken handler"
    assert result.runs == 5  # 2 + 3 attempts
    assert (result.count("dead"), result.count("succeeded")) == (1, 1)
    assert "dead attempts=3 last_error='ValueError: broken handler'" in str(result)


async def test_drain_does_not_wait_for_tasks_that_wait_on_purpose(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await tasks.create(pool, tenants.a, "sleeps")
    await tasks.create(pool, tenants.a, "later")
    result = await drain(pool, {"sleeps": kit.sleeps, "later": kit.later}, within=10)
    assert sorted(t.state for t in result.tasks) == ["pending", "waiting"]
    assert result.elapsed < 5


async def test_drain_times_out_showing_the_tasks_still_at_work(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await tasks.create(pool, tenants.a, "hangs")
    with pytest.raises(DrainTimeout, match=rf"(?s)after 1s:.*{task.id} hangs running"):
        await drain(pool, {"hangs": kit.hangs}, within=1)


async def test_drain_relays_the_outbox_to_a_publisher(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    async def consume(message: OutboxMessage) -> None:
        async def apply(conn: object) -> None:
            return None

        await inbox.process_once(pool, message.tenant_id, "ledger", message.id, apply)

    task = await tasks.create(pool, tenants.a, "order", params={"order": 9})
    async with pool.acquire() as conn, conn.transaction():
        await outbox.enqueue(conn, tenants.a, "order.placed", {"order": 9}, task_id=task.id)
    result = await drain(pool, kit.TWO_PROVIDERS, publisher=consume)
    assert result.delivered == 1
    [sent] = await assert_outbox(admin_conn, "order.placed", count=1, state="delivered")
    await assert_inbox(admin_conn, "ledger", count=1, message_ids=[sent["id"]])


# --- the ledger assertions: they pass on what is there and show the rows when not ----------


async def test_ledger_assertions_pass_and_return_the_rows(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "order", params={"order": 3})
    await drain(pool, kit.TWO_PROVIDERS)
    [done] = await assert_tasks(admin_conn, "succeeded", count=1, task_type="order")
    assert done.id == task.id
    op = await assert_operation(admin_conn, "order-3/email", tenant=tenants.a)
    assert op.action == "email"
    assert op.provider_reference is not None
    events = await assert_events(
        admin_conn, task.id,
        ["task.created", "task.claimed", "operation.reserved", "operation.succeeded",
         "operation.reserved", "operation.succeeded", "task.succeeded"],
    )  # fmt: skip
    assert events[-1]["to_state"] == "succeeded"


async def test_ledger_assertion_failures_show_the_actual_rows(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    task = await tasks.create(pool, tenants.a, "broken", max_attempts=1)
    await drain(pool, {"broken": kit.always_raises})
    with pytest.raises(LedgerAssertion) as failed:
        await assert_tasks(admin_conn, "succeeded", count=1, task_type="broken")
    assert "expected exactly 1 task(s) of type 'broken' in state 'succeeded', found 0" in str(
        failed.value
    )
    assert f"{task.id}  broken     dead" in str(failed.value)
    assert "ValueError: broken handler" in str(failed.value)

    with pytest.raises(LedgerAssertion, match=r"key 'nope' in state 'succeeded', found: none"):
        await assert_operation(admin_conn, "nope")
    with pytest.raises(LedgerAssertion, match=r"(?s)got \['task.created', 'task.claimed'.*dead"):
        await assert_events(admin_conn, task.id, ["task.created", "task.succeeded"])
    with pytest.raises(LedgerAssertion, match=r"(?s)at least one outbox message.*\(no rows\)"):
        await assert_outbox(admin_conn, "order.placed")
    with pytest.raises(LedgerAssertion, match=r"inbox of consumer 'ledger', found 0"):
        await assert_inbox(admin_conn, "ledger", count=1)


# --- the crash matrix -----------------------------------------------------------------------


async def test_the_idempotent_example_handler_passes_every_crash_point(
    db: SuiteDatabase, example: ModuleType
) -> None:
    work = [("send_invoice", {"invoice": 11})]
    report = await crash_test(db, example.HANDLERS, work, example.payments)
    assert report.ok, report
    # Every point a handler of reserve/complete passes (a straight-line one passes the
    # step and effect points too: test_a_straight_line_handler_passes_every_crash_point).
    durable = ("during_step", "during_effect")
    assert [s.point for s in report.scenarios] == [p for p in WORKER_POINTS if p not in durable]
    assert report.not_reached == ()  # every point was passed, and the worker died there
    # The worker that died at the provider call left a request that did nothing.
    during = next(s for s in report.scenarios if s.point == "during_call")
    assert [c.outcome for _, c in during.calls] == ["received", "executed"]


async def test_charging_before_reserving_is_caught_naming_the_steps(
    db: SuiteDatabase, example: ModuleType
) -> None:
    work = [("send_invoice", {"invoice": 12})]
    with pytest.raises(NotIdempotent) as caught:
        await crash_test(db, example.CHARGING_FIRST, work, example.payments)
    message = str(caught.value)
    failed = "before_reserve_commit, after_reserve, after_call, after_complete, before_group_commit"
    assert message.startswith(f"not idempotent at {failed} (5 of 9")
    assert (
        'payments: charge({"invoice":12}) was performed 2 time(s) when the worker was killed at'
        " after_reserve, 1 without a crash: the step is not idempotent"
    ) in message
    report = await crash_test(db, example.CHARGING_FIRST, work, example.payments, check=False)
    assert report.failed == (
        "before_reserve_commit",
        "after_reserve",
        "after_call",
        "after_complete",
        "before_group_commit",
    )


async def test_two_providers_through_pgbouncer(
    db: SuiteDatabase, bouncer: Bouncer, admin_conn: asyncpg.Connection
) -> None:
    report = await crash_test(
        db.through(bouncer), kit.TWO_PROVIDERS, [("order", {"order": 1}), ("order", {"order": 2})],
        [kit.psp, kit.mailer], points=["after_reserve", "after_call"], pooler="transaction",
    )  # fmt: skip
    assert report.ok, report
    for s in (report.baseline, *report.scenarios):
        executed = sorted(f"{p}:{c.action}:{c.args['order']}" for p, c in s.calls
                          if c.outcome == "executed")  # fmt: skip
        assert executed == ["mailer:email:1", "mailer:email:2", "psp:charge:1", "psp:charge:2"]


async def test_a_call_the_key_absorbed_after_agentdb_recorded_it_done_is_caught(
    db: SuiteDatabase,
) -> None:
    with pytest.raises(NotIdempotent) as caught:
        await crash_test(
            db, kit.IGNORES_FRESH, [("order", {"order": 5})], kit.psp,
            points=["after_reserve", "after_call", "after_complete"],
        )  # fmt: skip
    message = str(caught.value)
    assert message.startswith("not idempotent at after_call, after_complete (2 of 4 runs)")
    assert "key 'order-5/charge') -> replayed came after agentdb had recorded operation" in message
    assert "without checking Reservation.fresh" in message


async def test_a_handler_without_a_reconcile_hook_calls_again_with_the_key(
    db: SuiteDatabase,
) -> None:
    """G13: the charge a crash left unknown is called again with its key, which the provider
    answers with the first call's effect - performed once, and nothing left unfinished."""
    report = await crash_test(
        db, "tests.kit_handlers:NO_HOOK", [("order", {"order": 6})], [kit.psp, kit.mailer],
        points=["during_call", "after_call"],
    )  # fmt: skip
    assert report.ok, report
    for s in report.scenarios:
        charges = [c.outcome for name, c in s.calls if name == "psp"]
        assert (
            charges == ["received", "executed"]
            if s.point == "during_call"
            else ["executed", "replayed"]
        ), s.describe()


async def test_a_manual_effect_left_unknown_is_reported_unfinished(db: SuiteDatabase) -> None:
    with pytest.raises(NotIdempotent) as caught:
        await crash_test(
            db, "tests.kit_handlers:MANUAL_CHARGE", [("order", {"order": 7})],
            [kit.psp, kit.mailer], points=["after_reserve"], within=6,
        )  # fmt: skip
    message = str(caught.value)
    assert "not idempotent at after_reserve (1 of 2 runs)" in message
    assert "the tasks did not finish within 6s" in message
    assert "parked" in message
    assert "reconcilers={action: provider.lookup}" in message


async def test_a_straight_line_handler_passes_every_crash_point(db: SuiteDatabase) -> None:
    """G25: a step, a fan-out, an effect, a durable sleep, another effect - killed at every
    point it passes, inside its step and its effect included: each effect once."""
    report = await crash_test(
        db, "tests.kit_handlers:DURABLE", [("d-order", {"order": 8})], [kit.psp, kit.mailer]
    )
    assert report.ok, report
    points = [s.point for s in report.scenarios]
    assert {"during_step", "during_effect", "after_reserve", "after_call"} <= set(points)
    assert report.not_reached == ()
    for s in (report.baseline, *report.scenarios):
        executed = sorted(f"{p}:{c.action}" for p, c in s.calls if c.outcome == "executed")
        assert executed == ["mailer:email", "psp:charge"], s.describe()


def test_at_least_a_third_of_the_suite_runs_on_the_plugins_fixtures() -> None:
    """The project eats its own dog food: counted over the whole suite, as collected."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tests._census",
         "-p", "no:cacheprovider", str(ROOT / "tests")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("AGENTDB_CENSUS "))
    census = json.loads(line.removeprefix("AGENTDB_CENSUS "))
    assert census["tests"] > 1000
    assert census["using"] * 3 >= census["tests"], census


async def test_handlers_a_worker_cannot_import_are_a_crash_test_error_quoting_its_log(
    db: SuiteDatabase,
) -> None:
    with pytest.raises(
        CrashTestError, match=r"(?s)baseline: the worker exited with 2.*cannot import"
    ):
        await crash_test(db, "tests.no_such_module:HANDLERS", [("order", {"order": 1})], kit.psp)
