"""Events by month (opt-in, sql/migrations/0011.retention): the guarantees unchanged (G8, G9).

An event lands in the partition of its created_at; one event per recorded
version holds across partitions (a deferred trigger now, no unique index can
span them), also between two transactions that interleave; every partition
is append-only, TRUNCATE included; retention drops a month only when it is
over and none of its rows is retained; an install that holds events is
converted in place and rolled back without losing one.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import asyncpg
import pytest

from agentdb import _db, errors, migrate, retention
from agentdb.errors import CONSTRAINTS
from tests import _pg
from tests import factories as F
from tests.conftest import Tenants
from tests.test_catalogue import _RAISED_NAMES, _SCHEMA_NAMES

_NEXT_VERSION = (
    "UPDATE agent_tasks SET current_step = 'next', state_version = state_version + 1 WHERE id = $1"
)
_RETAINED = "SELECT EXISTS (SELECT 1 FROM {} WHERE retain_until > now())"


@pytest.fixture(autouse=True)
async def _by_month(admin_conn: asyncpg.Connection) -> None:
    """Every test here runs on the opt-in layout: the clone converted first."""
    await admin_conn.execute("CALL agentdb_partition_events()")


def _month(offset: int) -> datetime:
    """The first instant (UTC) of the month ``offset`` months from this one."""
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 + offset
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def _name(month: datetime) -> str:
    return f"agent_events_p{month:%Y_%m}"


def _refused_by(exc: BaseException, name: str, *, in_transaction: bool = False) -> None:
    """``exc`` is a refusal by ``name`` - or, on Citus, of a deferred check that fails at
    a worker's COMMIT, which Citus reports as "could not commit transaction" (XX000)."""
    if _pg.ON_CITUS and in_transaction and getattr(exc, "sqlstate", None) == "XX000":
        return
    assert _pg.constraint_of(exc) == name, exc


async def _partitions(conn: asyncpg.Connection) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'agent_events'::regclass"
    )
    return {r["relname"]: r["bound"] for r in rows}


async def _where(conn: asyncpg.Connection, event_id: int) -> str:
    """The partition holding an event (on Citus, the shard's name less its shard id)."""
    found: str = await conn.fetchval(
        "SELECT tableoid::regclass::text FROM agent_events WHERE id = $1", event_id
    )
    return re.sub(r"_[0-9]{5,}$", "", found)


async def test_G8_an_event_lands_in_the_partition_of_its_month(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """The months ahead exist from the migration on; a month nobody created yet goes to
    the DEFAULT partition, so no insert fails for want of a partition."""
    parts = await _partitions(admin_conn)
    assert {"agent_events_legacy", "agent_events_default", _name(_month(2))} <= set(parts)
    assert parts["agent_events_default"] == "DEFAULT"
    task = await F.create_task(admin_conn, tenants.a)
    placed = {
        await F.event(admin_conn, tenants.a, task, created_at=at): where
        for at, where in (
            (datetime.now(UTC), None),  # this month: the legacy range or its own month
            (_month(2) + timedelta(days=3), _name(_month(2))),
            (_month(9), "agent_events_default"),
        )
    }
    for event_id, where in placed.items():
        if where is not None:
            assert await _where(admin_conn, event_id) == where
    # The article's INSERT names no created_at and no partition: it routes by itself.
    assert (
        await admin_conn.fetchval("SELECT count(*) FROM agent_events WHERE task_id = $1", task) == 4
    )


async def test_G8_a_second_event_for_a_version_is_refused_from_another_month(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """The creation event (version 0) is in this month's partition; a forged second one
    two months on lands in another partition, where no unique index could see the first."""
    task = await F.create_task(admin_conn, tenants.a)
    with pytest.raises(asyncpg.UniqueViolationError) as twice:
        await F.event(
            admin_conn,
            tenants.a,
            task,
            task_state_version=0,
            created_at=_month(2) + timedelta(days=1),
        )
    _refused_by(twice.value, "agent_events_task_version_key")
    op = await F.create_operation(admin_conn, tenants.a, task)
    with pytest.raises(asyncpg.UniqueViolationError) as again:
        await F.event(
            admin_conn, tenants.a, task, operation_id=op, operation_state_version=0,
            created_at=_month(9),
        )  # fmt: skip
    _refused_by(again.value, "agent_events_operation_version_key")
    # Control: events that record no version are any number, in any month.
    for at in (datetime.now(UTC), _month(2), _month(9)):
        await F.event(admin_conn, tenants.a, task, operation_id=op, created_at=at)


async def test_G8_an_event_for_a_version_not_reached_or_days_older_than_its_task_is_refused(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    task = await F.create_task(admin_conn, tenants.a)
    with pytest.raises(asyncpg.CheckViolationError) as ahead:
        await F.event(admin_conn, tenants.a, task, task_state_version=1)
    _refused_by(ahead.value, "agent_events_task_version_key")
    born = await admin_conn.fetchval("SELECT created_at FROM agent_tasks WHERE id = $1", task)
    # Control: the event may come first, the state change it records later, one transaction.
    async with admin_conn.transaction():
        await F.event(admin_conn, tenants.a, task, task_state_version=1, to_state="pending")
        version = await admin_conn.fetchval(
            "UPDATE agent_tasks SET current_step = 'next', state_version = state_version + 1"
            " WHERE id = $1 RETURNING state_version",
            task,
        )
    assert version == 1

    async def older_event_then_its_change() -> None:
        async with admin_conn.transaction():
            await F.event(
                admin_conn, tenants.a, task, task_state_version=2,
                created_at=born - timedelta(days=2),
            )  # fmt: skip
            await admin_conn.execute(_NEXT_VERSION, task)

    with pytest.raises(asyncpg.PostgresError) as older:
        await older_event_then_its_change()
    _refused_by(older.value, "agent_events_task_version_key", in_transaction=True)
    op = await F.create_operation(admin_conn, tenants.a, task)
    with pytest.raises(asyncpg.CheckViolationError) as op_ahead:
        await F.event(admin_conn, tenants.a, task, operation_id=op, operation_state_version=3)
    _refused_by(op_ahead.value, "agent_events_operation_version_key")


@pytest.mark.parametrize("isolation", ["read_committed", "repeatable_read"])
@pytest.mark.parametrize("commits_first", ["mover", "forger"])
async def test_G8_a_forged_event_racing_the_state_change_it_copies_is_refused(
    admin_conn: asyncpg.Connection,
    other_conn: asyncpg.Connection,
    tenants: Tenants,
    isolation: Literal["read_committed", "repeatable_read"],
    commits_first: str,
) -> None:
    """Two connections: one moves the task to version 1 with its event, the other
    inserts a second event for version 1 while the first is open. Whoever commits first,
    at either isolation level, the forger is refused and the mover's change stands."""
    task = await F.create_task(admin_conn, tenants.a)
    mover = admin_conn.transaction()
    forger = other_conn.transaction(isolation=isolation)
    await mover.start()
    await forger.start()
    await other_conn.fetchval("SELECT state_version FROM agent_tasks WHERE id = $1", task)
    await admin_conn.execute(_NEXT_VERSION, task)
    await F.event(admin_conn, tenants.a, task, task_state_version=1, to_state="pending")
    await F.event(other_conn, tenants.a, task, task_state_version=1, to_state="pending")
    refused = asyncpg.PostgresError
    if commits_first == "mover":
        await mover.commit()
        with pytest.raises(refused) as caught:
            await forger.commit()
    else:
        # The forger's check takes the task row the mover holds: it waits for it.
        pending = asyncio.ensure_future(forger.commit())
        await _until_waiting(admin_conn, other_conn.get_server_pid())
        await mover.commit()
        with pytest.raises(refused) as caught:
            await pending
    if isolation == "repeatable_read" and caught.value.sqlstate == "40001":
        return  # the row it waited for changed under its snapshot: refused, to retry
    _refused_by(caught.value, "agent_events_task_version_key", in_transaction=True)
    if not _pg.ON_CITUS:
        assert isinstance(caught.value, (asyncpg.UniqueViolationError, asyncpg.CheckViolationError))
    counted = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_events WHERE task_id = $1 AND task_state_version = 1", task
    )
    assert counted == 1


async def _until_waiting(conn: asyncpg.Connection, pid: int) -> None:
    """Return once backend ``pid`` waits for a lock (on Citus, the wait is on a worker:
    give it a moment instead)."""
    for _ in range(200):
        waits = await conn.fetchval(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
        )
        if waits == "Lock":
            return
        await asyncio.sleep(0.02)
    assert _pg.ON_CITUS, "the forger's commit never waited for the mover's row lock"


async def _one_event_per_partition(conn: asyncpg.Connection, tenant: uuid.UUID) -> dict[str, int]:
    task = await F.create_task(conn, tenant)
    ids = {}
    for at in (datetime.now(UTC) - timedelta(days=400), _month(1), _month(9)):
        event_id = await F.event(conn, tenant, task, created_at=at, payload='{"n": 1}')
        ids[await _where(conn, event_id)] = event_id
    return ids


async def test_G8_every_partition_is_append_only_truncate_included(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Reached directly, by name: each partition refuses UPDATE, DELETE and TRUNCATE
    (AG003) and allows only the payload erasure (control)."""
    ids = await _one_event_per_partition(admin_conn, tenants.a)
    assert set(ids) == {"agent_events_legacy", _name(_month(1)), "agent_events_default"}
    for part, event_id in ids.items():
        for attack in (
            f"UPDATE {part} SET event_type = 'rewritten' WHERE id = $1",  # noqa: S608 - our names
            f"DELETE FROM {part} WHERE id = $1",  # noqa: S608
        ):
            with pytest.raises(asyncpg.PostgresError) as refused:
                await admin_conn.execute(attack, event_id)
            assert refused.value.sqlstate == "AG003", (part, attack)
        with pytest.raises(asyncpg.PostgresError) as truncated:
            await admin_conn.execute(f"TRUNCATE {part}")
        assert truncated.value.sqlstate == "AG003", part
        erased = await admin_conn.execute(
            f"UPDATE {part} SET payload = NULL WHERE id = $1",  # noqa: S608
            event_id,
        )
        assert erased == "UPDATE 1", part
    with pytest.raises(asyncpg.PostgresError) as whole:
        await admin_conn.execute("TRUNCATE agent_events")
    assert whole.value.sqlstate == "AG003"


async def test_G9_a_month_created_later_gets_the_truncate_guard(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    await admin_conn.execute(f"DROP TABLE {_name(_month(2))}")
    rows = await admin_conn.fetch("SELECT * FROM agentdb_event_partitions(2)")
    assert [(r["partition_name"], r["action"]) for r in rows] == [(_name(_month(2)), "created")]
    task = await F.create_task(admin_conn, tenants.a)
    await F.event(admin_conn, tenants.a, task, created_at=_month(2))
    with pytest.raises(asyncpg.PostgresError) as truncated:
        await admin_conn.execute(f"TRUNCATE {_name(_month(2))}")
    assert truncated.value.sqlstate == "AG003"


async def _past_months(conn: asyncpg.Connection) -> tuple[str, str]:
    """Give the test database two months that are over: the legacy partition narrowed to
    end two months ago, and last month's own partition (both empty in a fresh clone)."""
    assert await conn.fetchval("SELECT count(*) FROM agent_events") == 0
    await conn.execute("ALTER TABLE agent_events DETACH PARTITION agent_events_legacy")
    await conn.execute(
        "ALTER TABLE agent_events ATTACH PARTITION agent_events_legacy"
        f" FOR VALUES FROM (MINVALUE) TO ('{_month(-1).isoformat()}')"
    )
    for month in (-1, 0):
        lo, hi = _month(month).isoformat(), _month(month + 1).isoformat()
        await conn.execute(
            f"CREATE TABLE {_name(_month(month))} PARTITION OF agent_events"
            f" FOR VALUES FROM ('{lo}') TO ('{hi}')"
        )
    return "agent_events_legacy", _name(_month(-1))


async def _event_in(
    conn: asyncpg.Connection, tenant: uuid.UUID, task: uuid.UUID, at: datetime, **kw: Any
) -> int:
    return await F.event(
        conn, tenant, task, created_at=at, payload_expires_at=at, retain_until=at, **kw
    )


async def test_G9_a_month_goes_whole_only_when_over_and_nothing_in_it_is_retained(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    legacy, last_month = await _past_months(admin_conn)
    task = await F.create_task(
        admin_conn, tenants.a, created_at=datetime.now(UTC) - timedelta(days=500)
    )
    old = _month(-3)
    for _ in range(3):
        await _event_in(admin_conn, tenants.a, task, old)
        await _event_in(admin_conn, tenants.a, task, _month(-1))
    # One row of last month is still retained: the month stays, the others in it too.
    await F.event(
        admin_conn, tenants.a, task, created_at=_month(-1), payload_expires_at=_month(-1),
        retain_until=datetime.now(UTC) + timedelta(days=1),
    )  # fmt: skip
    # This month is not over: its expired rows stay until the row purge takes them.
    now = datetime.now(UTC)
    await F.event(admin_conn, tenants.a, task, payload_expires_at=now, retain_until=now)
    # Nor is next month, however expired its one row.
    await _event_in(admin_conn, tenants.a, task, _month(1))
    rows = await admin_conn.fetch("SELECT * FROM agentdb_event_partitions(0)")
    assert [(r["partition_name"], r["action"], r["events"]) for r in rows] == [
        (legacy, "dropped", 3)
    ]
    parts = await _partitions(admin_conn)
    assert legacy not in parts
    assert last_month in parts
    assert _name(_month(0)) in parts
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_events") == 4 + 1 + 1 + 1
    assert await admin_conn.fetchval(_RETAINED.format(last_month)) is True


async def test_G9_purge_drops_whole_months_and_counts_their_rows(
    admin_conn: asyncpg.Connection, tenants: Tenants, db: Any
) -> None:
    await _past_months(admin_conn)
    task = await F.create_task(
        admin_conn, tenants.a, created_at=datetime.now(UTC) - timedelta(days=500)
    )
    for _ in range(5):
        await _event_in(admin_conn, tenants.a, task, _month(-1))
    report = await retention.purge(admin_conn, classes=("events",))
    dropped = [p for p in report.partitions if p.action == "dropped"]
    # The legacy partition's range is over too, and it is empty: it goes as well.
    assert [(p.name, p.events) for p in dropped] == [
        ("agent_events_legacy", 0),
        (_name(_month(-1)), 5),
    ]
    assert {_name(_month(m)) for m in range(3)} <= set(await _partitions(admin_conn))
    assert report.removed["events"] == 5
    assert await admin_conn.fetchval("SELECT count(*) FROM agent_events") == 1  # the creation


async def test_G9_a_month_whose_rows_sit_in_the_default_partition_is_left_there(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    task = await F.create_task(admin_conn, tenants.a)
    stray = await F.event(admin_conn, tenants.a, task, created_at=_month(4) + timedelta(days=2))
    rows = await admin_conn.fetch("SELECT * FROM agentdb_event_partitions(5)")
    assert [(r["partition_name"], r["action"]) for r in rows] == [
        (_name(_month(3)), "created"),
        (_name(_month(4)), "left in the default partition"),
        (_name(_month(5)), "created"),
    ]
    assert await _where(admin_conn, stray) == "agent_events_default"


async def test_G9_only_the_owner_rotates_months(
    runtime_conn: asyncpg.Connection, admin_conn: asyncpg.Connection
) -> None:
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await runtime_conn.fetch("SELECT * FROM agentdb_event_partitions(2)")
    with pytest.raises(asyncpg.InvalidParameterValueError):
        await admin_conn.fetch("SELECT * FROM agentdb_event_partitions(25)")
    # Control: the runtime role reaches events through agent_events, never a partition.
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await runtime_conn.fetch("SELECT * FROM agent_events_default")
    await runtime_conn.fetch("SELECT * FROM agent_events LIMIT 1")


def test_G8_an_install_holding_events_is_converted_and_rolled_back_whole(
    pg_server: _pg.Server,
) -> None:
    """An install with events (and the unique keys of one table) is converted in place by
    `migrate --events-by-month`: every row moves into the legacy partition, and what an
    operator added to the table goes with it. agentdb_unpartition_events() - what the
    rollback of 0011.retention runs - moves them back: the same rows, the same schema."""
    ids = migrate.migration_ids()
    with _pg.temp_database(pg_server) as name:
        dsn = pg_server.url(name)
        migrate.migrate(dsn)
        with _pg.admin(dsn) as conn:
            [(tenant,)] = conn.execute(
                "INSERT INTO agent_tenants (name) VALUES ('t') RETURNING id"
            ).fetchall()
            [(task,)] = conn.execute(
                "WITH t AS (INSERT INTO agent_tasks (tenant_id, task_type, workflow_version)"
                " VALUES (%s, 'x', 'v1') RETURNING tenant_id, id)"
                " INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                "   policy_version, task_state_version)"
                " SELECT tenant_id, id, 'task.created', 'a', 'v1', 0 FROM t RETURNING task_id",
                (tenant,),
            ).fetchall()
            conn.execute(
                "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                " policy_version) SELECT %s, %s, 'note', 'a', 'v1' FROM generate_series(1, 50)",
                (tenant, task),
            )
            # Dated past the cut-over (next month): it moves to the DEFAULT partition.
            conn.execute(
                "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                " policy_version, created_at) VALUES (%s, %s, 'later', 'a', 'v1', '2100-01-01')",
                (tenant, task),
            )
            # What an operator added to the table goes with it.
            conn.execute("GRANT SELECT ON agent_events TO agentdb_runtime WITH GRANT OPTION")
            conn.execute(
                "CREATE POLICY reporting ON agent_events FOR SELECT TO agentdb_agent"
                " USING (event_type = 'note')"
            )
            before = conn.execute("SELECT * FROM agent_events ORDER BY id").fetchall()
        one_table = _pg.schema_dump(dsn)
        migrate.migrate(dsn)  # without --events-by-month nothing changes
        with _pg.admin(dsn) as conn:
            kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'agent_events'")
            assert kind.fetchall() == [("r",)]
        migrate.migrate(dsn, events_by_month=True)
        migrate.migrate(dsn, events_by_month=True)  # a no-op the second time
        with _pg.admin(dsn) as conn:
            assert conn.execute("SELECT * FROM agent_events ORDER BY id").fetchall() == before
            where = conn.execute(
                "SELECT tableoid::regclass::text, count(*) FROM agent_events GROUP BY 1 ORDER BY 1"
            )
            assert where.fetchall() == [("agent_events_default", 1), ("agent_events_legacy", 51)]
            policies = conn.execute(
                "SELECT tablename, qual FROM pg_policies WHERE policyname = 'reporting'"
            ).fetchall()
            assert policies == [("agent_events", "(event_type = 'note'::text)")]
            grantable = conn.execute(
                "SELECT has_table_privilege("
                "   'agentdb_runtime', 'agent_events', 'SELECT WITH GRANT OPTION'),"
                " has_table_privilege('agentdb_runtime', 'agent_events_legacy', 'SELECT')"
            ).fetchall()
            assert grantable == [(True, False)]
            with pytest.raises(Exception, match="two events record") as twice:
                conn.execute(
                    "INSERT INTO agent_events (tenant_id, task_id, event_type, actor_id,"
                    " policy_version, task_state_version, created_at)"
                    " VALUES (%s, %s, 'forged', 'a', 'v1', 0, %s)",
                    (tenant, task, _month(2)),
                )
            assert getattr(twice.value, "sqlstate", None) == "23505"
            conn.execute("CALL agentdb_unpartition_events()")
            assert conn.execute("SELECT * FROM agent_events ORDER BY id").fetchall() == before
            assert conn.execute(
                "SELECT count(*) FROM pg_policies WHERE policyname = 'reporting'"
                " AND tablename = 'agent_events'"
            ).fetchall() == [(1,)]
        assert _pg.schema_dump(dsn) == one_table
        # The rollback of 0011.retention (and of what follows it) unpartitions too.
        migrate.migrate(dsn, events_by_month=True)
        back = migrate.rollback(dsn, count=len(ids) - ids.index("0011.retention"))
        assert back[-1] == "0011.retention"
        with _pg.admin(dsn) as conn:
            assert conn.execute("SELECT * FROM agent_events ORDER BY id").fetchall() == before
            kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'agent_events'")
            assert kind.fetchall() == [("r",)]


@pytest.mark.parametrize("scope", ["every tenant", "one tenant"])
async def test_G9_the_row_purge_takes_an_expired_event_not_a_copy_of_its_id(
    admin_conn: asyncpg.Connection, tenants: Tenants, scope: str
) -> None:
    """Ids are unique with their created_at: a retained row inserted under an expired
    row's id (anyone who may INSERT events may name one) is neither deleted with it nor
    the reason a purge batch fails on the append-only guard - nor has its payload erased
    with the expired one's. Both ways a purge runs: every tenant's (agentdb_purge) and
    one tenant's (agentdb_purge_tenant, as on Citus). The one-tenant way kills generated
    ``gen-0023.event_expiry-agentdb_purge_tenant-and-3`` (the payload erasure matching the
    id alone)."""
    task = await F.create_task(admin_conn, tenants.a)
    past = datetime.now(UTC) - timedelta(days=1)
    expired = await _event_in(admin_conn, tenants.a, task, past)
    await F.event(admin_conn, tenants.a, task, id=expired)  # retained 400 days
    if scope == "every tenant":
        report = await retention.purge(admin_conn, classes=("event_payloads", "events"))
        removed = (report.removed["event_payloads"], report.removed["events"])
    else:
        one = "SELECT agentdb_purge_tenant($1, $2, 100, interval '0')"
        removed = (
            await admin_conn.fetchval(one, tenants.a, "event_payloads"),
            await admin_conn.fetchval(one, tenants.a, "events"),
        )
    assert removed == (1, 1)
    rows = await admin_conn.fetch(
        "SELECT retain_until > now() AS kept, payload FROM agent_events WHERE id = $1", expired
    )
    assert [(r["kept"], r["payload"]) for r in rows] == [(True, "{}")]


async def test_G8_a_transaction_begun_before_its_task_existed_records_its_versions(
    admin_conn: asyncpg.Connection, other_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Its now() - the events' created_at - is older than the task: within a day, the
    state change commits (one table accepts it; the one-day rule must not refuse it)."""
    async with other_conn.transaction():
        await other_conn.fetchval("SELECT now()")  # this transaction's now() is fixed here
        task = await F.create_task(admin_conn, tenants.a)
        await other_conn.execute(_NEXT_VERSION, task)
        await F.event(other_conn, tenants.a, task, task_state_version=1, to_state="pending")
    assert (
        await admin_conn.fetchval(
            "SELECT count(*) FROM agent_events WHERE task_id = $1 AND task_state_version = 1", task
        )
        == 1
    )


async def test_G9_months_are_rotated_at_read_committed_only(admin_conn: asyncpg.Connection) -> None:
    """A snapshot taken before a late insert into an ended month would not see it under
    the lock, and the month would go with it: refused outside READ COMMITTED."""
    for isolation in ("repeatable_read", "serializable"):
        with pytest.raises(asyncpg.PostgresError) as refused:
            async with admin_conn.transaction(isolation=isolation):
                await admin_conn.fetch("SELECT * FROM agentdb_event_partitions(2)")
        assert refused.value.sqlstate == "25000", isolation
    async with admin_conn.transaction():  # control
        await admin_conn.fetch("SELECT * FROM agentdb_event_partitions(2)")


async def test_G8_a_state_change_without_its_event_is_refused_by_month_too(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """The by-month check (its lookup bounded to the task's months) still refuses the
    change that has no event (AG006); control: with its event it commits."""
    task = await F.create_task(admin_conn, tenants.a)
    with pytest.raises(asyncpg.PostgresError) as silent:
        await admin_conn.execute(_NEXT_VERSION, task)
    assert silent.value.sqlstate == "AG006"
    await F.update_task(admin_conn, tenants.a, task, current_step="next", state_version=1)


@pytest.mark.plain_postgres(
    "a distributed schema drops the NOTIFY triggers and a foreign key, so the catalogue"
    " is compared on plain PostgreSQL (as tests/test_catalogue.py is)"
)
async def test_G8_the_catalogue_names_the_same_objects_by_month(
    admin_conn: asyncpg.Connection,
) -> None:
    """Errors map on names: the layout keeps every name (the version keys become
    triggers and plain indexes of the same names), adds none."""
    names = {r[0] for r in await admin_conn.fetch(_SCHEMA_NAMES)}
    assert set(CONSTRAINTS) - _RAISED_NAMES == names


def test_migrate_events_by_month_from_the_command_line(pg_server: _pg.Server) -> None:
    with _pg.temp_database(pg_server) as name:
        dsn = pg_server.url(name)
        for _ in range(2):  # the second run converts nothing and says the same
            done = subprocess.run(
                [sys.executable, "-m", "agentdb", "migrate", "--events-by-month", "--dsn", dsn],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "agent_events: partitioned by month of created_at" in done.stdout
        with _pg.admin(dsn) as conn:
            kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'agent_events'")
            assert kind.fetchall() == [("p",)]


async def test_G2_a_copied_event_key_is_refused_and_maps_to_the_tables_key(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """The server names the partition's index (agent_events_default_pkey here); agentdb
    maps it to the key it enforces, agent_events_pkey. Control: the id alone at another
    instant is another key (ids are unique with their created_at)."""
    task = await F.create_task(admin_conn, tenants.a)
    far = datetime(2100, 1, 1, tzinfo=UTC)  # past every month partition: the DEFAULT one
    first = await F.event(admin_conn, tenants.a, task, created_at=far)
    with pytest.raises(asyncpg.UniqueViolationError) as copied:
        await F.event(admin_conn, tenants.a, task, id=first, created_at=far)
    if not _pg.ON_CITUS:
        assert copied.value.constraint_name == "agent_events_default_pkey"
    mapped = _db.translate(copied.value)
    assert isinstance(mapped, errors.DuplicateKey)
    assert (mapped.constraint, mapped.guarantee) == ("agent_events_pkey", "G2")
    await F.event(admin_conn, tenants.a, task, id=first, created_at=far + timedelta(days=1))


async def test_G8_an_operation_s_events_are_checked_against_its_own_tenant_s_row(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """An operation id is unique per tenant only (agent_operations_pkey is (tenant_id,
    id)): tenant b may hold an operation of the id of a's, at another version. Each
    one's events are checked against its own row: a's moves to version 1 while b's is at
    0, then b's to 2 while a's is at 1, and every event commits. Kills
    ``gen-0011.retention-agentdb_event_records_once-tenant-3`` (the operation looked up
    by id alone: whichever twin it reads, one of the moves is refused as recording a
    version its operation has not reached)."""
    task_a = await F.create_task(admin_conn, tenants.a)
    task_b = await F.create_task(admin_conn, tenants.b)
    op = await F.create_operation(admin_conn, tenants.a, task_a)
    await F.create_operation(admin_conn, tenants.b, task_b, id=op)
    for tenant, version, state in (
        (tenants.a, 1, "in_flight"),
        (tenants.b, 1, "in_flight"),
        (tenants.b, 2, "succeeded"),
    ):
        reached = await F.update_operation(
            admin_conn, tenant, op, state=state, state_version=version
        )
        assert reached == version
    rows = await admin_conn.fetch(
        "SELECT tenant_id, operation_state_version FROM agent_events WHERE operation_id = $1"
        " AND operation_state_version IS NOT NULL",
        op,
    )
    assert sorted((r["tenant_id"] == tenants.a, r["operation_state_version"]) for r in rows) == [
        (False, 0), (False, 1), (False, 2), (True, 0), (True, 1),
    ]  # fmt: skip


async def test_G8_a_task_s_events_are_counted_against_its_own_tenant_s_row(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """A task id is unique per tenant only (agent_tasks_pkey is (tenant_id, id)): tenant
    b's task of the id of a's records its own versions 0 and 1, and a's its own - each
    event is one of its tenant's task, none a second of the other's. Kills generated
    ``gen-0011.retention-agentdb_event_records_once-tenant-2`` (a version's events counted
    by task id alone: b's creation event refused as a second record of a's version 0)."""
    task = await F.create_task(admin_conn, tenants.a)
    await F.create_task(admin_conn, tenants.b, id=task)
    for tenant in (tenants.a, tenants.b):
        assert await F.update_task(admin_conn, tenant, task, current_step="next",
                                   state_version=1) == 1  # fmt: skip
    rows = await admin_conn.fetch(
        "SELECT tenant_id, task_state_version FROM agent_events WHERE task_id = $1"
        " AND task_state_version IS NOT NULL",
        task,
    )
    assert sorted((r["tenant_id"] == tenants.a, r["task_state_version"]) for r in rows) == [
        (False, 0), (False, 1), (True, 0), (True, 1),
    ]  # fmt: skip


async def test_G8_an_event_days_older_than_its_task_is_not_counted_as_a_second_record(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """An event of the task's id days older than the task (a previous task of that id,
    whose event outlived it: written with the triggers off, as a restore would) is no
    record of this task's versions: the task's own version 1 is recorded. Kills generated
    ``gen-0011.retention-agentdb_event_records_once-and-6`` (the old event counted: the
    version refused as recorded twice)."""
    task = await F.create_task(admin_conn, tenants.a)
    born = await admin_conn.fetchval("SELECT created_at FROM agent_tasks WHERE id = $1", task)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await F.event(admin_conn, tenants.a, task, task_state_version=1, to_state="pending",
                      created_at=born - timedelta(days=2))  # fmt: skip
    assert await F.update_task(admin_conn, tenants.a, task, current_step="next",
                               state_version=1) == 1  # fmt: skip


async def test_G8_an_event_exactly_a_day_older_than_its_task_records_its_version(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """The day allowed for clocks that disagree is inclusive: an event dated exactly a day
    before its task was created records the version it names (two days are refused: the
    test above). Kills generated ``gen-0011.retention-agentdb_event_records_once-cmp-5``
    (``>``: the event at exactly a day refused as older than its task)."""
    task = await F.create_task(admin_conn, tenants.a)
    born = await admin_conn.fetchval("SELECT created_at FROM agent_tasks WHERE id = $1", task)
    async with admin_conn.transaction():
        await F.event(admin_conn, tenants.a, task, task_state_version=1, to_state="pending",
                      created_at=born - timedelta(days=1))  # fmt: skip
        await admin_conn.execute(_NEXT_VERSION, task)
    reached = await admin_conn.fetchval("SELECT state_version FROM agent_tasks WHERE id = $1", task)
    assert reached == 1


async def test_G8_a_forged_operation_event_racing_the_move_it_copies_waits_and_is_refused(
    admin_conn: asyncpg.Connection, other_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Two connections at READ COMMITTED: one moves an operation to version 1 with its
    event, the other inserts a second event for version 1 while the first is open and
    commits first. The forger's check takes the operation's row, which the mover holds:
    it waits, and once the mover commits it counts both events and is refused as the
    second record of the version; the mover's change stands. Kills generated
    ``gen-0011.retention-agentdb_event_records_once-lock-2`` (the operation read without
    FOR NO KEY UPDATE: no wait, the forger judged on the version before the move)."""
    task = await F.create_task(admin_conn, tenants.a)
    op = await F.create_operation(admin_conn, tenants.a, task)
    mover = admin_conn.transaction()
    forger = other_conn.transaction()
    await mover.start()
    await forger.start()
    await admin_conn.execute(
        "UPDATE agent_operations SET state = 'in_flight', state_version = 1 WHERE id = $1", op
    )
    await F.event(admin_conn, tenants.a, task, operation_id=op, operation_state_version=1)
    await F.event(other_conn, tenants.a, task, operation_id=op, operation_state_version=1)
    pending = asyncio.ensure_future(forger.commit())
    await F.wait_until_blocked(admin_conn, other_conn.get_server_pid())
    await mover.commit()
    with pytest.raises(asyncpg.PostgresError) as caught:
        await pending
    _refused_by(caught.value, "agent_events_operation_version_key", in_transaction=True)
    assert isinstance(caught.value, asyncpg.UniqueViolationError)  # two, not one ahead
    counted = await admin_conn.fetchval(
        "SELECT count(*) FROM agent_events WHERE operation_id = $1 AND operation_state_version = 1",
        op,
    )
    state = await admin_conn.fetchval("SELECT state FROM agent_operations WHERE id = $1", op)
    assert (counted, state) == (1, "in_flight")


async def test_G8_an_event_dated_at_the_cut_over_instant_moves_to_the_default_partition(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Converting an install moves each event dated from the cut-over (the first instant of
    next month, UTC) on into the DEFAULT partition, the legacy one keeping what is older:
    an event dated exactly at the cut-over is moved, not lost. One transaction, so the
    cut-over the conversion computes is the one the event was dated with. Kills generated
    ``gen-0023.event_expiry-agentdb_partition_events-cmp-4`` (``>``: the event at the
    cut-over deleted from the legacy partition and copied nowhere)."""
    await admin_conn.execute("CALL agentdb_unpartition_events()")
    task = await F.create_task(admin_conn, tenants.a)
    async with admin_conn.transaction():
        cutover = await admin_conn.fetchval(
            "SELECT date_trunc('month', now(), 'UTC') + interval '1 month'"
        )
        before = await F.event(admin_conn, tenants.a, task,
                               created_at=cutover - timedelta(microseconds=1))  # fmt: skip
        at = await F.event(admin_conn, tenants.a, task, created_at=cutover)
        await admin_conn.execute("CALL agentdb_partition_events()")
    assert cutover == _month(1)
    assert (await _where(admin_conn, before), await _where(admin_conn, at)) == (
        "agent_events_legacy",
        "agent_events_default",
    )
