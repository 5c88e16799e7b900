"""Schedules (G24): at most one task per tick, however many schedulers fire it.

The raw-SQL attacks on the tick key, the tick guard and the CHECKs are in
tests/test_attacks.py; here the runtime: the catch-up policies, pause and
resume, schedulers racing on separate connections (and one that bypasses the
lock), a worker that fires what is due, and the cron arithmetic checked
against a brute-force reading of the same expression.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb import schedules, tasks, tenancy
from agentdb.errors import ConfigurationError, IdempotencyConflict, InvariantViolation, NotFound
from agentdb.models import Schedule
from agentdb.worker import Job, Succeed, Worker
from tests import _pg
from tests import factories as F
from tests.conftest import Database, Tenants


def _ago(**kw: float) -> datetime:
    return (datetime.now(UTC) - timedelta(**kw)).replace(microsecond=0)


async def _made(admin: asyncpg.Connection, schedule: Schedule) -> list[tuple[datetime, str]]:
    """The ticks of the tasks a schedule made, in order, with each task's creation event."""
    rows = await admin.fetch(
        "SELECT k.schedule_tick, e.payload FROM agent_tasks k"
        " JOIN agent_events e ON e.tenant_id = k.tenant_id AND e.task_id = k.id"
        "  AND e.event_type = 'task.created'"
        " WHERE k.tenant_id = $1 AND k.schedule_id = $2 ORDER BY k.schedule_tick",
        schedule.tenant_id,
        schedule.id,
    )
    return [(r["schedule_tick"], r["payload"]) for r in rows]


async def test_G24_an_interval_schedule_catches_up_every_missed_tick_once(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    start = _ago(minutes=5, seconds=30)
    s = await schedules.create(pool, tenants.a, "sync", "s-sync", every=timedelta(minutes=1),
                               start_at=start, catch_up="all", params={"n": 1})  # fmt: skip
    assert (s.created, s.next_tick_at) == (True, start)
    fired = await schedules.fire_due(pool)
    assert [f.tick for f in fired] == [start + timedelta(minutes=i) for i in range(6)]
    assert await schedules.fire_due(pool) == []  # the next tick is still ahead
    made = await _made(admin_conn, s)
    assert [t for t, _ in made] == [f.tick for f in fired]
    assert json.loads(made[0][1]) == {"schedule": "sync", "tick": start.isoformat()}
    task = await tasks.get(pool, tenants.a, fired[0].task_id)
    assert (task.task_type, task.params, task.state) == ("s-sync", {"n": 1}, "pending")
    after = await schedules.get(pool, tenants.a, "sync")
    assert (after.last_tick_at, after.next_tick_at) == (
        fired[-1].tick,
        start + timedelta(minutes=6),
    )


async def test_G24_the_latest_policy_fires_one_task_and_says_what_it_skipped(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    start = _ago(minutes=5, seconds=30)
    s = await schedules.create(pool, tenants.a, "digest", "s-digest", every=timedelta(minutes=1),
                               start_at=start, task_deadline=timedelta(hours=1))  # fmt: skip
    [fired] = await schedules.fire_due(pool)
    assert fired.tick == start + timedelta(minutes=5)
    [(tick, payload)] = await _made(admin_conn, s)
    assert json.loads(payload)["skipped_from"] == start.isoformat()
    task = await tasks.get(pool, tenants.a, fired.task_id)
    assert task.deadline_at == tick + timedelta(hours=1)
    assert await schedules.fire_due(pool) == []


async def test_G24_a_paused_schedule_fires_nothing_and_never_fires_its_paused_ticks(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    start = _ago(minutes=3, seconds=30)
    await schedules.create(pool, tenants.a, "nightly", "s-night", every=timedelta(minutes=1),
                           start_at=start, catch_up="all")  # fmt: skip
    paused = await schedules.pause(pool, tenants.a, "nightly")
    assert paused.paused
    assert await schedules.fire_due(pool) == []
    # Nor does the firing itself, called directly (fire_due does not even pick it).
    fired = await admin_conn.fetch(
        "SELECT * FROM agentdb_fire_schedule($1, $2)", paused.tenant_id, paused.id
    )
    assert fired == []
    resumed = await schedules.resume(pool, tenants.a, "nightly")
    assert not resumed.paused
    assert resumed.next_tick_at > datetime.now(UTC) - timedelta(seconds=1)
    assert await schedules.fire_due(pool) == []  # the three ticks of the pause are gone
    assert await _made(admin_conn, resumed) == []
    with pytest.raises(NotFound):
        await schedules.pause(pool, tenants.b, "nightly")  # another tenant's name


async def test_G24_pausing_a_schedule_pauses_that_one_only(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """A tenant's other schedules go on: pausing one by name pauses it alone, and the
    call answers with that one. Kills generated
    ``gen-0007.schedules-agentdb_pause_schedule-and-1`` (every schedule of the tenant
    paused by the name of one)."""
    for name in ("nightly", "hourly"):
        await schedules.create(pool, tenants.a, name, "s-pause", every=timedelta(hours=1))
    paused = await schedules.pause(pool, tenants.a, "nightly")
    assert (paused.name, paused.paused) == ("nightly", True)
    states = {s.name: s.paused for s in await schedules.of_tenant(pool, tenants.a)}
    assert states == {"nightly": True, "hourly": False}


async def test_G24_schedulers_racing_on_one_tick_create_one_task(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Five schedulers on five connections fire at once; then one holds the schedule's lock
    while another tries (and skips it); then a scheduler that ignores the lock altogether
    writes the same tick itself - the tick key refuses it."""
    start = _ago(minutes=2, seconds=30)
    s = await schedules.create(pool, tenants.a, "race", "s-race", every=timedelta(minutes=1),
                               start_at=start, catch_up="all")  # fmt: skip
    conns = [await asyncpg.connect(db.dsn) for _ in range(5)]
    try:
        results = await asyncio.gather(*(schedules.fire_due(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    ticks = sorted(f.tick for fired in results for f in fired)
    assert ticks == [start + timedelta(minutes=i) for i in range(3)]
    assert len(await _made(admin_conn, s)) == 3

    # A second schedule, due: while one scheduler holds its row, another skips it (it
    # neither waits nor fires it); once the row is free, it fires it.
    due = await schedules.create(pool, tenants.a, "held", "s-race", every=timedelta(hours=1),
                                 start_at=_ago(seconds=30))  # fmt: skip
    holder, other = await asyncpg.connect(db.dsn), await asyncpg.connect(db.dsn)
    try:
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM agent_schedules WHERE tenant_id = $1 AND id = $2 FOR UPDATE",
                due.tenant_id, due.id,
            )  # fmt: skip
            skipped = await asyncio.wait_for(schedules.fire_due(other), 10)
            assert skipped == []
        [fired] = await schedules.fire_due(other)
        assert (fired.schedule_id, fired.tick) == (due.id, due.next_tick_at)
        # Rewound to a tick that has its task: firing again makes none.
        await admin_conn.execute(
            "UPDATE agent_schedules SET next_tick_at = $3 WHERE tenant_id = $1 AND id = $2",
            s.tenant_id, s.id, start,
        )  # fmt: skip
        assert await schedules.fire_due(other) == []
    finally:
        await holder.close()
        await other.close()
    assert len(await _made(admin_conn, s)) == 3
    with pytest.raises(asyncpg.UniqueViolationError) as refused:
        await F.create_task(admin_conn, tenants.a, schedule_id=s.id, schedule_tick=start)
    assert _pg.constraint_of(refused.value) == "agent_tasks_schedule_tick_key"


async def test_G24_a_cron_schedule_fires_on_its_minutes_in_utc(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    start = _ago(minutes=10)
    await schedules.create(pool, tenants.a, "every-3", "s-cron", cron="*/3 * * * *",
                           start_at=start, catch_up="all")  # fmt: skip
    fired = await schedules.fire_due(pool)
    assert len(fired) >= 3  # ten minutes hold three or four of them
    for f in fired:
        assert (f.tick.second, f.tick.microsecond, f.tick.minute % 3) == (0, 0, 0)
        assert start <= f.tick <= datetime.now(UTC)
    gaps = {b.tick - a.tick for a, b in itertools.pairwise(fired)}
    assert gaps == {timedelta(minutes=3)}


async def test_G24_create_is_idempotent_by_name_and_refuses_bad_rules(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    first = await schedules.create(pool, tenants.a, "weekly", "s-week", cron="0 9 * * 1")
    again = await schedules.create(pool, tenants.a, "weekly", "s-week", cron="0 9 * * 1")
    assert (first.created, again.created, again.id) == (True, False, first.id)
    with pytest.raises(IdempotencyConflict):
        await schedules.create(pool, tenants.a, "weekly", "s-week", cron="0 10 * * 1")
    for bad in ({}, {"every": timedelta(minutes=1), "cron": "* * * * *"}):
        with pytest.raises(ConfigurationError):
            await schedules.create(pool, tenants.a, "bad", "s-bad", **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        await schedules.create(pool, tenants.a, "bad", "s-bad", cron="* * * * *", catch_up="some")
    with pytest.raises(ConfigurationError):  # a rule that never fires
        await schedules.create(pool, tenants.a, "bad", "s-bad", cron="0 0 31 2 *")
    for rule, constraint in (
        ({"cron": "61 * * * *"}, "agent_schedules_cron_valid"),
        # A step of 0 is no rule (gen-0007.schedules-agentdb_cron_field-int-2: `step < 0`
        # lets it reach generate_series, which raises instead of the constraint refusing).
        ({"cron": "*/0 * * * *"}, "agent_schedules_cron_valid"),
        ({"every": timedelta(days=30, microseconds=5)}, "agent_schedules_every_valid"),
    ):
        with pytest.raises(InvariantViolation) as refused:
            await schedules.create(pool, tenants.a, "bad", "s-bad", **rule)
        assert refused.value.constraint == constraint
    # Params the input hash refuses (a key that is not text; two keys one after NFC):
    # refused before anything is written, never a schedule left behind by a "refused" create.
    bad_params: list[dict[Any, Any]] = [{1: "a"}, {"\u00e9": 1, "e\u0301": 2}]
    for params in bad_params:
        with pytest.raises(ConfigurationError):
            await schedules.create(
                pool, tenants.a, "bad", "s-bad", every=timedelta(hours=1), params=params
            )
    assert [s.name for s in await schedules.of_tenant(pool, tenants.a)] == ["weekly"]


async def test_G24_a_deleted_schedule_leaves_its_tasks_and_a_tenant_deletion_takes_it(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    s = await schedules.create(pool, tenants.b, "gone", "s-gone", every=timedelta(minutes=1),
                               start_at=_ago(seconds=30))  # fmt: skip
    [fired] = await schedules.fire_due(pool)
    assert await schedules.delete(admin_conn, tenants.b, "gone")
    assert not await schedules.delete(admin_conn, tenants.b, "gone")
    kept = await admin_conn.fetchrow(
        "SELECT schedule_id, schedule_tick FROM agent_tasks WHERE id = $1", fired.task_id
    )
    assert kept is not None
    assert (kept["schedule_id"], kept["schedule_tick"]) == (s.id, fired.tick)  # what made it
    await schedules.create(pool, tenants.b, "again", "s-gone", every=timedelta(hours=1))
    dry = await tenancy.delete_tenant(admin_conn, tenants.b, dry_run=True)
    assert [(x.object, x.affected) for x in dry.steps if x.step == 20] == [("agent_schedules", 1)]
    await tenancy.delete_tenant(admin_conn, tenants.b, dry_run=False)
    assert (
        await admin_conn.fetchval(
            "SELECT count(*) FROM agent_schedules WHERE tenant_id = $1", tenants.b
        )
        == 0
    )


async def test_G24_a_worker_fires_due_schedules_as_it_sweeps(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    ran: list[uuid.UUID] = []

    async def report(job: Job) -> Succeed:
        ran.append(job.task.id)
        return Succeed()

    await schedules.create(pool, tenants.a, "w", "s-worker", every=timedelta(hours=1),
                           start_at=_ago(seconds=5))  # fmt: skip
    worker = Worker(pool, {"s-worker": report}, poll_interval=0.05, maintenance_interval=0.1)
    runner = asyncio.create_task(worker.run(install_signals=False))
    try:
        await F.until(lambda: len(ran) == 1)
    finally:
        worker.stop()
        await asyncio.wait_for(runner, 30)
    assert len(ran) == 1


# ---- the cron arithmetic against a brute-force reading --------------------------------

_FIELD = re.compile(r"^(\*|(\d{1,2})(-(\d{1,2}))?)(/(\d{1,2}))?$")


def _values(field: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for part in field.split(","):
        m = _FIELD.match(part)
        assert m is not None, part
        a, b = (lo, hi) if m[1] == "*" else (int(m[2]), int(m[4] or (hi if m[6] else m[2])))
        out |= set(range(a, b + 1, int(m[6] or 1)))
    return out


def _matches(cron: str, t: datetime) -> bool:
    mi, h, dom, mon, dow = cron.split()
    days = {d % 7 for d in _values(dow, 0, 7)}
    weekday = (t.weekday() + 1) % 7  # cron: Sunday is 0
    in_dom, in_dow = t.day in _values(dom, 1, 31), weekday in days
    either = not dom.startswith("*") and not dow.startswith("*")
    return (
        t.minute in _values(mi, 0, 59)
        and t.hour in _values(h, 0, 23)
        and t.month in _values(mon, 1, 12)
        and ((in_dom or in_dow) if either else (in_dom and in_dow))
    )


def _field(lo: int, hi: int) -> st.SearchStrategy[str]:
    one = st.integers(lo, hi)
    part = st.one_of(
        st.just("*"),
        one.map(str),
        st.tuples(one, one).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.tuples(st.sampled_from(["*", str(lo)]), st.integers(1, 9)).map(
            lambda p: f"{p[0]}/{p[1]}"
        ),
    )
    return st.lists(part, min_size=1, max_size=3).map(",".join)


_CRON = st.tuples(
    _field(0, 59), _field(0, 23), st.sampled_from(["*", "1-15", "*/2", "10,20"]),
    st.sampled_from(["*", "1-6", "*/2"]), st.sampled_from(["*", "1-5", "0,6", "7"]),
).map(" ".join)  # fmt: skip
_AT = st.datetimes(datetime(2026, 1, 1), datetime(2030, 12, 31)).map(
    lambda d: d.replace(tzinfo=UTC)
)


async def test_G24_a_day_of_month_and_a_day_of_week_both_restricted_fire_on_either_only(
    admin_conn: asyncpg.Connection,
) -> None:
    """Cron's rule when both day fields are restricted: a day matches on either - here
    "0 0 13 * 5", the 13th or a Friday - and on no other day. January 2026: Friday the
    9th, Tuesday the 13th, Friday the 16th. Kills generated
    ``gen-0007.schedules-agentdb_cron_tick-cmp-3`` (the weekday compared with ``<>``: every
    day but a Friday matching)."""
    cron = "0 0 13 * 5"
    tick = "SELECT agentdb_cron_tick($1, $2, $3)"
    cases = [
        (datetime(2026, 1, 10, 12, tzinfo=UTC), True, datetime(2026, 1, 13, tzinfo=UTC)),
        (datetime(2026, 1, 13, tzinfo=UTC), True, datetime(2026, 1, 16, tzinfo=UTC)),
        (datetime(2026, 1, 12, 12, tzinfo=UTC), False, datetime(2026, 1, 9, tzinfo=UTC)),
        (datetime(2026, 1, 15, 12, tzinfo=UTC), False, datetime(2026, 1, 13, tzinfo=UTC)),
    ]
    for at, forward, expected in cases:
        assert await admin_conn.fetchval(tick, cron, at, forward) == expected, (at, forward)
        assert _matches(cron, expected)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cron=_CRON, at=_AT)
async def test_G24_cron_ticks_agree_with_a_brute_force_reading(
    admin_conn: asyncpg.Connection, cron: str, at: datetime
) -> None:
    forward = await admin_conn.fetchval("SELECT agentdb_cron_tick($1, $2, true)", cron, at)
    back = await admin_conn.fetchval("SELECT agentdb_cron_tick($1, $2, false)", cron, at)
    assert (_matches(cron, forward), _matches(cron, back)) == (True, True), (cron, at)
    assert back <= at < forward
    # Nothing in between: the minutes from back to forward match only at both ends
    # (checked within two days either side, which every expression drawn here fires in).
    step = at.replace(second=0, microsecond=0)
    t = step
    while t > back and step - t < timedelta(days=2):
        assert not _matches(cron, t), (cron, t)
        t -= timedelta(minutes=1)
    t = step + timedelta(minutes=1)
    while t < forward and t - step < timedelta(days=2):
        assert not _matches(cron, t), (cron, t)
        t += timedelta(minutes=1)


async def test_G24_a_schedule_whose_task_is_refused_does_not_hold_up_the_others(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The most overdue schedule comes first every time: were its refusal to stop
    fire_due, no schedule due after it would ever fire."""
    if _pg.ON_CITUS:  # a trigger reaches the shards only so (as the migrations do)
        await admin_conn.execute("SET citus.enable_unsafe_triggers = on")
    await admin_conn.execute(
        "CREATE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN RAISE EXCEPTION 'poisoned' USING ERRCODE = 'AG017',"
        " CONSTRAINT = 'agent_tasks_schedule_guard'; END $$"
    )
    await admin_conn.execute(
        "CREATE TRIGGER test_refuse_poison BEFORE INSERT ON agent_tasks FOR EACH ROW"
        " WHEN (NEW.task_type = 's-poison') EXECUTE FUNCTION test_refuse_poison()"
    )
    await schedules.create(pool, tenants.a, "poison", "s-poison", every=timedelta(hours=1),
                           start_at=_ago(minutes=10))  # fmt: skip
    await schedules.create(pool, tenants.a, "fine", "s-fine", every=timedelta(hours=1),
                           start_at=_ago(minutes=5))  # fmt: skip
    fired = await schedules.fire_due(pool)
    assert [(await tasks.get(pool, tenants.a, f.task_id)).task_type for f in fired] == ["s-fine"]
    assert "not fired" in caplog.text
    assert (await schedules.get(pool, tenants.a, "poison")).last_tick_at is None


async def test_G24_firing_one_schedule_fires_that_schedule_of_that_tenant_only(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """agentdb_fire_schedule(tenant, schedule) reads the one row both name: with two due
    schedules in tenant a, firing one makes only its tasks; naming tenant b with a's
    schedule fires nothing and raises nothing (kills the generated mutants that drop
    either half of its row lookup, which survived at 53e6534 too)."""
    start = _ago(minutes=2, seconds=30)
    one = await schedules.create(pool, tenants.a, "one", "s-one", every=timedelta(minutes=1),
                                 start_at=start, catch_up="all")  # fmt: skip
    two = await schedules.create(pool, tenants.a, "two", "s-two", every=timedelta(minutes=1),
                                 start_at=start, catch_up="all")  # fmt: skip
    wrong = await admin_conn.fetch("SELECT * FROM agentdb_fire_schedule($1, $2)", tenants.b, one.id)
    assert wrong == []
    fired = await admin_conn.fetch("SELECT * FROM agentdb_fire_schedule($1, $2)", tenants.a, two.id)
    assert len(fired) == 3
    assert await _made(admin_conn, one) == []
    assert [t for t, _ in await _made(admin_conn, two)] == [r["fired_tick"] for r in fired]
    made = [await tasks.get(pool, tenants.a, r["fired_task"]) for r in fired]
    assert {t.task_type for t in made} == {"s-two"}  # two's own row, not one's


# ---- the edges (issue 35's blind class "schedule edges") -------------------------------


async def test_G24_catch_up_all_fires_exactly_100_ticks_a_call_and_the_rest_on_the_next(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "schedule edges": the catch-up cap exactly. With more
    than 100 ticks missed, one call fires ticks 1 to 100, not one more nor one fewer, and
    leaves the 101st for the next call. Kills gen-0016.partial_keys-agentdb_fire_schedule-
    int-1 (the cap 101; it survived every test before this one), -int-2 (99), -cmp-6
    (`<= 100`), -and-4 (no cap) and -and-6 (skipped_from written under 'all')."""
    start = _ago(seconds=130)  # 131 ticks due, one a second: more than one call's cap
    s = await schedules.create(pool, tenants.a, "cap", "s-cap", every=timedelta(seconds=1),
                               start_at=start, catch_up="all")  # fmt: skip
    first = await schedules.fire_due(pool)
    assert [f.tick for f in first] == [start + timedelta(seconds=i) for i in range(100)]
    after = await schedules.get(pool, tenants.a, "cap")
    assert (after.last_tick_at, after.next_tick_at) == (
        start + timedelta(seconds=99),
        start + timedelta(seconds=100),
    )
    rest = await schedules.fire_due(pool)
    assert len(rest) >= 31
    assert [f.tick for f in rest] == [start + timedelta(seconds=100 + i) for i in range(len(rest))]
    made = await _made(admin_conn, s)
    assert len(made) == 100 + len(rest)
    # Catching up every tick skips none: no task says it skipped any (-and-6: the
    # 'latest' policy's skipped_from written for every tick after the first).
    assert not [tick for tick, payload in made if "skipped_from" in json.loads(payload)]


async def test_G24_a_start_exactly_on_a_cron_tick_fires_that_tick(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "schedule edges": a start that falls on a cron tick.
    schedule_create's first tick is "the first of the rule at or after its anchor", so the
    tick at start_at is the schedule's first and fires - under either catch-up policy.
    Kills gen-0007.schedules-agentdb_schedule_tick-cmp-1 (`found > p_anchor`: the latest
    tick at the anchor is no tick) and the hand mutant edges-cron-start-tick-skipped (the
    first cron tick strictly after the anchor)."""
    # A daily rule whose tick is this minute's start: due now, the next one a day away, so
    # what fires does not depend on when in the minute the test runs.
    start = await admin_conn.fetchval("SELECT date_trunc('minute', clock_timestamp())")
    cron = f"{start.minute} {start.hour} * * *"
    made: dict[str, Schedule] = {}
    for policy in ("latest", "all"):
        s = await schedules.create(pool, tenants.a, f"on-{policy}", "s-on-tick", cron=cron,
                                   start_at=start, catch_up=policy)  # fmt: skip
        assert s.next_tick_at == start
        made[policy] = s
    fired = await schedules.fire_due(pool)
    assert sorted((f.schedule_id, f.tick) for f in fired) == sorted(
        (s.id, start) for s in made.values()
    )
    [(_, payload)] = await _made(admin_conn, made["latest"])
    assert "skipped_from" not in json.loads(payload)  # nothing before its first tick
    for s in made.values():
        again = await schedules.get(pool, tenants.a, s.name)
        assert (again.last_tick_at, again.next_tick_at) == (start, start + timedelta(days=1))


@pytest.mark.plain_postgres("reads pg_stat_activity for the firing's backend")
async def test_G24_a_schedule_paused_while_it_fires_fires_nothing_after_the_pause(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "schedule edges": a definition changed while firing,
    on two connections. A pause held open in one transaction: a firing on another neither
    waits for it nor fires, and once the pause commits nothing was made. A firing held open
    in one transaction: a pause on another waits for it and keeps the next tick the firing
    moved to. Kills gen-0016.partial_keys-agentdb_fire_schedule-lock-1 (the unlocked firing
    reads the row from before the pause and commits a task after it) and -lock-2 (the
    firing queues behind the pause) by the interleaving, not by a timeout."""
    start = _ago(minutes=2, seconds=30)
    s = await schedules.create(pool, tenants.a, "pausing", "s-pause", every=timedelta(minutes=1),
                               start_at=start, catch_up="all")  # fmt: skip
    pauser, firer = await asyncpg.connect(db.dsn), await asyncpg.connect(db.dsn)
    try:
        pid = await firer.fetchval("SELECT pg_backend_pid()")
        async with pauser.transaction():
            assert (await schedules.pause(pauser, tenants.a, "pausing")).paused
            fire = asyncio.ensure_future(
                firer.fetch("SELECT * FROM agentdb_fire_schedule($1, $2)", s.tenant_id, s.id)
            )
            await _pg.done_or_blocked(admin_conn, pid, fire)
            assert fire.done()  # it skipped the held row: it did not queue behind the pause
        assert await fire == []
        assert await _made(admin_conn, s) == []
        assert await schedules.fire_due(pool) == []

        # Now the other way round: the firing holds the row, the pause waits for it.
        await schedules.resume(pool, tenants.a, "pausing")
        await admin_conn.execute(  # due again, its three ticks missed
            "UPDATE agent_schedules SET next_tick_at = $3 WHERE tenant_id = $1 AND id = $2",
            s.tenant_id, s.id, start,
        )  # fmt: skip
        pid = await pauser.fetchval("SELECT pg_backend_pid()")
        async with firer.transaction():
            fired = await firer.fetch(
                "SELECT * FROM agentdb_fire_schedule($1, $2)", s.tenant_id, s.id
            )
            assert [r["fired_tick"] for r in fired] == [
                start + timedelta(minutes=i) for i in range(3)
            ]
            pause = asyncio.ensure_future(schedules.pause(pauser, tenants.a, "pausing"))
            await _pg.done_or_blocked(admin_conn, pid, pause)
            assert not pause.done()
        paused = await pause
        assert (paused.paused, paused.next_tick_at) == (True, start + timedelta(minutes=3))
    finally:
        await pauser.close()
        await firer.close()
    assert len(await _made(admin_conn, s)) == 3


async def test_G24_firing_a_schedule_moves_only_its_own_tenant_s_row(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Closes issue 35's blind class "schedule edges": a schedule id is unique per tenant
    only (agent_schedules_pkey is (tenant_id, id)), so another tenant may hold a schedule
    of the same id - one inserted with its id, as a copy of a tenant's schedules is. Firing
    a's must not move b's next tick: b's missed ticks would be lost unfired. Kills
    gen-0016.partial_keys-agentdb_fire_schedule-tenant-2 (the final UPDATE without its
    tenant condition), so that mutant is not equivalent."""
    start = _ago(minutes=2, seconds=30)
    a = await schedules.create(pool, tenants.a, "twin", "s-twin", every=timedelta(minutes=1),
                               start_at=start, catch_up="all")  # fmt: skip
    await admin_conn.execute(
        "INSERT INTO agent_schedules (tenant_id, id, name, task_type, every, anchor, catch_up,"
        " next_tick_at) VALUES ($1, $2, 'twin', 's-twin', $3, $4, 'all', $4)",
        tenants.b, a.id, timedelta(minutes=1), start,
    )  # fmt: skip
    fired = await admin_conn.fetch("SELECT * FROM agentdb_fire_schedule($1, $2)", tenants.a, a.id)
    assert len(fired) == 3
    b = await schedules.get(pool, tenants.b, "twin")
    assert (b.last_tick_at, b.next_tick_at) == (None, start)  # untouched by a's firing
    fired_b = await admin_conn.fetch("SELECT * FROM agentdb_fire_schedule($1, $2)", tenants.b, a.id)
    assert [r["fired_tick"] for r in fired_b] == [start + timedelta(minutes=i) for i in range(3)]


@pytest.mark.plain_postgres("counts calls of a function on the coordinator's session")
async def test_G24_a_pass_tries_to_fire_only_the_schedules_that_are_due(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """One schedule is due, three tick only in an hour: a pass of the scheduler fires the
    due one and calls the firing function for it alone - a thousand idle schedules cost a
    pass nothing. Kills generated ``gen-schedules-schedule_due-and-2`` (every schedule not
    paused read as due: each tried, and let go by the function's own check)."""
    await schedules.create(pool, tenants.a, "due", "s-due", every=timedelta(hours=1),
                           start_at=_ago(seconds=5))  # fmt: skip
    for n in range(3):
        await schedules.create(pool, tenants.a, f"later-{n}", "s-later", every=timedelta(hours=1),
                               start_at=datetime.now(UTC) + timedelta(hours=1))  # fmt: skip
    await admin_conn.execute("SET track_functions = 'pl'")
    async with admin_conn.transaction():
        fired = await schedules.fire_due(admin_conn)
        calls = await admin_conn.fetchval(
            "SELECT pg_stat_get_xact_function_calls("
            "'agentdb_fire_schedule(uuid, uuid)'::regprocedure)"
        )
    assert [f.schedule_id for f in fired] == [(await schedules.get(pool, tenants.a, "due")).id]
    assert calls == 1


async def test_G2_G24_a_tenant_s_schedules_are_listed_without_another_tenant_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenants a and b each have a schedule: each tenant's list holds its own only. Kills
    generated ``gen-schedules-schedule_list-tenant-1`` (every tenant's schedules listed)."""
    for tenant, name in ((tenants.a, "a-nightly"), (tenants.b, "b-nightly")):
        await schedules.create(pool, tenant, name, "s-list", every=timedelta(hours=1))
    assert [s.name for s in await schedules.of_tenant(pool, tenants.a)] == ["a-nightly"]
    assert [s.name for s in await schedules.of_tenant(pool, tenants.b)] == ["b-nightly"]
