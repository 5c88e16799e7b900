"""One demo run: seed invoice tasks, run the fleet with its crashes, count from the database.

Everything :class:`Result` reports is counted from the database alone, by
comparing agentdb's ledger (``agent_operations``, ``agent_events``,
``agent_outbox``, ``agent_signals``, ``agent_schedules``) with the
provider's and the consumer's own (:mod:`agentdb.tools.demo.provider`) and
those of the reviewer and the canceller (:mod:`agentdb.tools.demo.actors`;
their counts are :mod:`agentdb.tools.demo.checks`).

Each invoice has one to four line items, priced by child tasks; one above
:data:`~agentdb.tools.demo.provider.REVIEW_ABOVE` waits for the reviewer
first. While the fleet runs, the driver's actors review, cancel and fire
schedules; when every invoice is done it pauses the schedules and waits for
the last tasks (the ticks', the children of cancelled invoices) and the
outbox. A run in which every unfinished invoice sleeps although what it waits
for is there (a signal unread, its children finished) for
:data:`STALL_AFTER` seconds stops there and counts those as lost, instead
of waiting for the deadline.

Replays
-------

The provider's effects are keyed by the idempotency key, so they cannot
show a worker that called the provider again for an effect that had
already happened: the provider answers such a request from its key
('replayed') and nothing new happens. The requests it logged can. A
replayed request ``R`` for key ``K`` (the operation ``O`` agentdb holds
under ``K`` for ``R``'s task) is *justified* when, counting only the events
of ``O`` in ``agent_events`` written before ``R`` arrived
(``provider_requests.at``), either

1. agentdb had granted at least ``n`` calls, where ``R`` is the ``n``-th
   request for ``K`` by arrival: a grant is ``O``'s reservation
   (``operation.reserved``) or a re-arm (``operation.retried``), which
   agentdb makes only when the previous attempt's call was recorded failed,
   never as done (refused, or the reconcile hook found no effect while that
   call was still on its way). Each grant entitles one call, whichever
   attempt's request happens to land first; or
2. ``O``'s outcome had been recorded unknown (``operation.unknown``) and not
   yet recorded succeeded (no event with ``to_state = 'succeeded'``): the
   effect may have happened, and an idempotent retry is what the key is
   for.

Any other replay is *unjustified*: agentdb had recorded the effect as done
(``operation.succeeded`` or ``operation.reconciled``), or had never handed
out the call (a worker that ignored ``Reservation.fresh``, or a reserve that
answered fresh for a key it already held), or holds no operation for the key
at all. With the demo's reconcile hook a crashed attempt's operation is
reconciled rather than called again, so replays are normally 0; a run with
an unjustified replay fails, like one with a duplicate effect.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from agentdb import _db, budgets, tasks, tenancy
from agentdb.tools.demo import checks
from agentdb.tools.demo.actors import Canceller, Invoice, Reviewer, Ticker
from agentdb.tools.demo.fleet import Fleet, Workload, kills_by_point
from agentdb.tools.demo.limits import REPORT_GRACE, Limits
from agentdb.tools.demo.provider import BUDGET_UNIT, SCHEMA, TASK_TYPE

__all__ = ["STALL_AFTER", "Result", "count", "run_workload", "with_database"]

#: Seconds every unfinished invoice may sleep on a wake-up that came before the run stops.
STALL_AFTER = 10.0


_TERMINAL = ("succeeded", "failed", "dead", "cancelled")

# Independent counts, not one aggregate with a sub-select beside it:
# Citus cannot push a sub-select in the target list down next to an aggregate.
_PROGRESS = (
    "SELECT (SELECT count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND task_type = 'demo.invoice' AND state IN ('succeeded', 'failed', 'dead', 'cancelled')),"
    " (SELECT count(*) FROM agent_outbox o WHERE o.tenant_id = ANY ($1) AND o.state = 'pending'),"
    " (SELECT count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND state NOT IN ('succeeded', 'failed', 'dead', 'cancelled'))"
)

# The provider's own tables: SCHEMA recreates them for every run, so all they
# hold is this run's and these statements take no parameter.
_PROVIDER_COUNTS = {
    "requests": "SELECT count(*) FROM agentdb_demo.provider_requests",
    "refused": "SELECT count(*) FROM agentdb_demo.provider_requests WHERE outcome = 'refused'",
    "effects": "SELECT count(*) FROM agentdb_demo.provider_effects",
    "replayed": "SELECT count(*) FROM agentdb_demo.provider_requests WHERE outcome = 'replayed'",
    "duplicates": "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n"
    " FROM agentdb_demo.provider_effects GROUP BY task_id, action) g",
    "redeliveries": "SELECT count(*) FROM agentdb_demo.consumer_redeliveries",
}

# The rule of the module docstring, request by request: the provider's log
# (a local table of the demo) and agentdb's ledger are read apart and joined
# here, because Citus cannot join a local table into a lateral subquery over
# a distributed one.
_REPLAYED = """
SELECT r.key, r.task_id, r.at,
       row_number() OVER (PARTITION BY r.key ORDER BY r.at, r.id) AS nth, r.outcome
FROM agentdb_demo.provider_requests r
"""
_OPERATIONS = """
SELECT o.id, o.task_id, o.idempotency_key FROM agent_operations o WHERE o.tenant_id = ANY ($1)
"""
_OPERATION_EVENTS = """
SELECT e.operation_id, e.event_type, e.to_state, e.created_at
FROM agent_events e
WHERE e.tenant_id = ANY ($1) AND e.operation_id IS NOT NULL
"""
_CONSUMED = "SELECT message_id FROM agentdb_demo.consumer_ledger WHERE tenant_id = ANY ($1)"
_SENT = "SELECT id FROM agent_outbox WHERE tenant_id = ANY ($1)"


async def _unjustified_replays(db: _db.Executor, tenant_ids: list[uuid.UUID]) -> int:
    ops = {
        (r["idempotency_key"], r["task_id"]): r["id"]
        for r in await db.fetch(_OPERATIONS, tenant_ids)
    }
    events: dict[uuid.UUID, list[_db.Record]] = {}
    for e in await db.fetch(_OPERATION_EVENTS, tenant_ids):
        events.setdefault(e["operation_id"], []).append(e)
    bad = 0
    for req in await db.fetch(_REPLAYED):
        if req["outcome"] != "replayed":
            continue
        op = ops.get((req["key"], req["task_id"]))
        before = [e for e in events.get(op, []) if e["created_at"] < req["at"]] if op else []
        grants = sum(e["event_type"] in ("operation.reserved", "operation.retried") for e in before)
        unknown = any(e["event_type"] == "operation.unknown" for e in before)
        succeeded = any(e["to_state"] == "succeeded" for e in before)
        if not (grants >= req["nth"] or (unknown and not succeeded)):
            bad += 1
    return bad


# agentdb's tables (and the consumer's) keep every run's rows: these take the
# run's tenant ids ($1).
_LEDGER_COUNTS = {
    "reconciled": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.reconciled'",
    "unknown": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.unknown'",
    "reclaimed": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'task.reclaimed'",
    "consumed": "SELECT count(*) FROM agentdb_demo.consumer_ledger WHERE tenant_id = ANY ($1)",
    # G19: the budget's books, its refusals, and the charges it paid for.
    "budget_limit": "SELECT sum(limit_amount) FROM agent_budgets WHERE tenant_id = ANY ($1)",
    "budget_spent": "SELECT sum(spent) FROM agent_budgets WHERE tenant_id = ANY ($1)",
    "budget_held": "SELECT sum(held) FROM agent_budgets WHERE tenant_id = ANY ($1)",
    "overspent": "SELECT sum(greatest(spent + held - limit_amount, 0)) FROM agent_budgets"
    " WHERE tenant_id = ANY ($1)",
    "budget_refused": "SELECT count(*) FROM agent_events WHERE tenant_id = ANY ($1)"
    " AND event_type = 'operation.refused' AND payload->>'reason' = 'budget'",
    "budget_stopped": "SELECT count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND state = 'failed' AND last_error LIKE 'budget exhausted%'",  # provider.BUDGET_STOP
    "rejected_failed": "SELECT count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND task_type = 'demo.invoice' AND state = 'failed'"
    " AND last_error = 'rejected by the reviewer'",  # provider.REJECTED
    "budget_charged": "SELECT sum((t.params->>'amount')::bigint) FROM agent_operations o"
    " JOIN agent_tasks t ON t.tenant_id = o.tenant_id AND t.id = o.task_id"
    " JOIN agent_budgets b ON b.tenant_id = o.tenant_id AND b.task_id IS NULL"
    " AND b.unit = 'usd_cents'"  # provider.BUDGET_UNIT
    " WHERE o.tenant_id = ANY ($1) AND o.action = 'charge' AND o.state = 'succeeded'",
}
_TASKS_BY_STATE = (
    "SELECT state, count(*) FROM agent_tasks WHERE tenant_id = ANY ($1)"
    " AND task_type = 'demo.invoice' GROUP BY state"
)
_OUTBOX_BY_STATE = (
    "SELECT state, count(*) FROM agent_outbox WHERE tenant_id = ANY ($1) GROUP BY state"
)


@dataclass
class Result:
    """What a run did, counted from the database."""

    finished: bool  # run_workload's always are: a run that does not finish raises DemoTimeout
    elapsed: float
    kills: int
    kills_by_point: dict[str, int]
    counts: dict[str, int]
    tasks_by_state: dict[str, int]
    outbox_by_state: dict[str, int]
    log_path: Path

    @property
    def stuck(self) -> int:
        """Invoices unfinished, and the other tasks (children, ticks) too."""
        unfinished = sum(n for s, n in self.tasks_by_state.items() if s not in _TERMINAL)
        return unfinished + self.counts["other_stuck"]

    @property
    def ok(self) -> bool:
        """Finished with no duplicate effect, no unjustified replay, no lost message, none
        stuck, no budget overspent and its books equal to the charges it paid for - and
        every approval recorded once, read once, never lost nor skipped by a charge, every
        parent woken once with the right total, nothing new after a cancel, one task per
        tick (:mod:`agentdb.tools.demo.checks`)."""
        c = self.counts
        return (
            self.finished
            and c["duplicates"] == 0
            and c["unjustified_replays"] == 0
            and c["lost"] == 0
            and self.stuck == 0
            and c["overspent"] == 0
            and c["budget_spent"] == c["budget_charged"]
            and all(c[k] == 0 for k in _FLOW_FAILURES)
        )


#: The counts of :mod:`agentdb.tools.demo.checks` that fail a run unless 0.
_FLOW_FAILURES = (
    "approvals_miscounted", "signals_read_twice", "lost_signals", "unapproved_charges",
    "model_after_record", "double_wakes", "lost_wakes", "fan_in_wrong", "after_cancel",
    "ticks_missed", "ticks_doubled",
)  # fmt: skip


async def count(db: _db.Executor, tenant_ids: Sequence[uuid.UUID]) -> dict[str, int]:
    """Count what the provider, the consumer and agentdb's ledger saw for these tenants.

    Keys: requests, refused, effects, replayed, duplicates, redeliveries
    (the provider's and consumer's ledgers), unjustified_replays (see the
    module docstring), reconciled, unknown, reclaimed, consumed, lost, the
    budget's, rejected_failed, and :data:`~agentdb.tools.demo.checks.FLOW_KEYS`.

    Raises:
        asyncpg.PostgresError: the demo's schema is missing (not seeded).
    """
    found: dict[str, int] = {}
    for name, sql in _PROVIDER_COUNTS.items():
        found[name] = int(await db.fetchval(sql) or 0)
    for name, sql in _LEDGER_COUNTS.items():
        found[name] = int(await db.fetchval(sql, list(tenant_ids)) or 0)
    found["unjustified_replays"] = await _unjustified_replays(db, list(tenant_ids))
    consumed = {r[0] for r in await db.fetch(_CONSUMED, list(tenant_ids))}
    found["lost"] = sum(r[0] not in consumed for r in await db.fetch(_SENT, list(tenant_ids)))
    found.update(await checks.count_flows(db, tenant_ids))
    return found


def _bar(done: int, total: int, kills: int, elapsed: float, tty: bool) -> str:
    width = 30
    filled = int(width * done / total) if total else width
    lead = "\r" if tty else ""
    return (
        f"{lead}[{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks"
        f"  {kills} kills  {elapsed:5.1f}s"
    )


def _lines(rng: random.Random, amount: int) -> list[int]:
    """Split ``amount`` into one to four line items of at least 1 each."""
    n = min(rng.randint(1, 4), amount)
    cuts = sorted(rng.sample(range(1, amount), n - 1)) if n > 1 else []
    return [b - a for a, b in zip([0, *cuts], [*cuts, amount], strict=True)]


@dataclass
class _Run:
    """What a run seeded, and the actors of the driving process."""

    tenants: list[uuid.UUID]
    invoices: list[Invoice]
    reviewer: Reviewer
    canceller: Canceller
    ticker: Ticker


async def _seed(
    pool: _db.Pool, w: Workload, rng: random.Random, limits: Limits, ticker: Ticker
) -> _Run:
    async with pool.acquire() as conn:
        for statement in SCHEMA:
            await conn.execute(statement)
    await ticker.pause_left_running(pool)
    run = uuid.uuid4().hex[:6]
    tenants = [await tenancy.create_tenant(pool, f"demo-{run}-{i}") for i in range(w.tenants)]
    first = 0  # what the first tenant's charges add up to
    invoices: list[Invoice] = []
    for i in range(w.tasks):
        limits.at("seeding the tasks", f"{i} of {w.tasks} tasks created, none run")
        amount = rng.randint(1, 500)
        first += amount if i % len(tenants) == 0 else 0
        task = await tasks.create(
            pool, tenants[i % len(tenants)], TASK_TYPE,
            params={"invoice": i, "amount": amount, "lines": _lines(rng, amount)},
            dedupe_key=f"invoice-{run}-{i}", max_attempts=w.max_attempts, lease_ttl=w.lease_ttl,
        )  # fmt: skip
        invoices.append(Invoice(task.tenant_id, task.id, i, amount))
    # G19: the first tenant may spend about half of what its invoices would charge.
    await budgets.set_budget(pool, tenants[0], BUDGET_UNIT, first // 2)
    for tenant in tenants:  # G24: its schedule, ticking for the first actors.TICKING seconds
        await ticker.create(pool, tenant)
    # The plans are the seed's and each invoice's number's alone (actors.Plan).
    plans = str(w.seed) if w.seed is not None else uuid.uuid4().hex
    return _Run(tenants, invoices, Reviewer(invoices, plans), Canceller(invoices, plans), ticker)


async def _drive(pool: _db.Pool, fleet: Fleet, run: _Run, limits: Limits) -> float:
    """Kill and replace processes until every task is terminal and the outbox drained.

    Meanwhile the reviewer, the canceller and the ticker act, each round. Returns
    the seconds it took. It has no deadline of its own: the run's (``limits``)
    cancels it, wherever it waits.
    """
    w = fleet.workload
    tenant_ids = run.tenants
    rng = random.Random(w.seed)
    tty = w.progress and sys.stderr.isatty()
    start = time.monotonic()
    next_kill = start + (rng.expovariate(1 / w.kill_every) if w.kill_every > 0 else 1e18)
    last_line, done = 0.0, 0
    moved, stalled_since, next_look = start, 0.0, 0.0  # the stall check's
    limits.at("running the workload", f"{w.tasks} of {w.tasks} tasks unfinished")
    try:
        while True:
            row = await pool.fetchrow(_PROGRESS, tenant_ids)
            assert row is not None
            now = time.monotonic()
            if int(row[0]) != done:
                moved, stalled_since = now, 0.0
            done, pending_out, open_tasks = int(row[0]), int(row[1]), int(row[2])
            limits.at(
                "running the workload",
                f"{w.tasks - done} of {w.tasks} tasks unfinished,"
                f" {pending_out} outbox messages undelivered",
            )
            if w.progress and (tty or now - last_line >= 5):
                bar = _bar(done, w.tasks, fleet.died, now - start, tty)
                print(bar, end="" if tty else "\n", file=sys.stderr, flush=True)
                last_line = now
            if done == w.tasks and not run.ticker.paused:
                await run.ticker.pause(pool)  # the ticks' last tasks, then the end
            elif done == w.tasks and open_tasks == 0 and pending_out == 0:
                break
            if done < w.tasks:
                await run.reviewer.step(pool, now)
                await run.canceller.step(pool, now)
                await run.ticker.step(pool, now)
                if now - moved >= 5 and now >= next_look:
                    # Everything left asleep on a wake-up that came: lost, not slow.
                    next_look = now + 1
                    lost = await checks.stalled(pool, tenant_ids)
                    if sum(lost.values()) < w.tasks - done:
                        stalled_since = 0.0
                    elif not stalled_since:
                        stalled_since = now
                    elif now - stalled_since >= STALL_AFTER:
                        break
            # A run that finished before its first kill proved nothing about crashes: the
            # first comes by the time half the tasks are done, whatever the dice said.
            first = w.kill_every > 0 and not fleet.external_kills and done >= w.tasks // 2
            if (now >= next_kill or first) and done < w.tasks:
                fleet.kill_one(rng)
                next_kill = now + rng.expovariate(1 / w.kill_every)
            fleet.supervise()
            await asyncio.sleep(0.1)
    except BaseException:
        if tty:
            print(file=sys.stderr)  # end the bar's line: the line saying why follows
        raise
    elapsed = time.monotonic() - start
    if w.progress:
        print(_bar(done, w.tasks, fleet.died, elapsed, tty), file=sys.stderr)
    return elapsed


async def run_workload(
    dsn: str, w: Workload, log: IO[bytes], log_path: Path, limits: Limits | None = None
) -> Result:
    """Seed ``w.tasks`` invoice tasks, run the fleet with its crashes until done, and count.

    ``limits``: the run's deadline, when it started before this call (the
    demo's counts its migrations too); default ``w.timeout`` from now. Every
    step is held to it, and however the run ends its processes are reaped
    and its schedules paused (at most a few seconds more, on a way out other
    than the end).

    Raises:
        DemoTimeout: the deadline passed (the fleet was stopped).
        DemoStopped: SIGTERM or SIGINT (the fleet was stopped).
        DatabaseUnavailable: ``dsn`` cannot be reached.
        AgentDBError: seeding the tenants or tasks failed.
    """
    limits = limits or Limits(w.timeout)
    seed_rng = random.Random(w.seed)
    fault_log = log_path.with_suffix(".faults")
    fault_log.unlink(missing_ok=True)
    ticker = Ticker()
    try:
        async with limits.watch():
            limits.at("connecting to the database", "no task was created")
            pool = await _db.create_pool(dsn, min_size=1, max_size=3)
            # First, when the run is stopped: a statement queued in PgBouncer ignores cancellation.
            limits.on_stop(pool.terminate)
            try:
                run = await _seed(pool, w, seed_rng, limits, ticker)
                fleet = Fleet(dsn, w, log, fault_log)
                limits.track(fleet.processes)
                limits.log_path = log_path
                with fleet:  # stopped and reaped on the way out, however the run ends
                    elapsed = await _drive(pool, fleet, run, limits)
                # The work is done: its counts may take a little longer than the deadline.
                limits.extend(REPORT_GRACE)
                limits.at("counting the results", f"all {w.tasks} tasks finished, none counted")
                if not ticker.paused:
                    await ticker.pause(pool)  # a run that stalled
                by_point = kills_by_point(fault_log)
                result = Result(
                    finished=True,
                    elapsed=elapsed,
                    kills=fleet.external_kills + sum(by_point.values()),
                    kills_by_point=by_point,
                    counts=await count(pool, run.tenants),
                    tasks_by_state={
                        r[0]: r[1] for r in await pool.fetch(_TASKS_BY_STATE, run.tenants)
                    },
                    outbox_by_state={
                        r[0]: r[1] for r in await pool.fetch(_OUTBOX_BY_STATE, run.tenants)
                    },
                    log_path=log_path,
                )
            except BaseException:
                # Closing would wait for whatever the connections were doing: the run is over.
                pool.terminate()
                raise
            await pool.close()
    except BaseException:
        await ticker.pause_quietly(dsn)  # else they would go on ticking, every second
        raise
    return result


def _fresh_on_citus(dsn: str) -> bool:
    """Whether ``dsn``'s database has the citus extension and no agentdb schema yet.

    The demo then distributes what it migrates, as ``agentdb migrate --citus``
    would: run on coordinator-local tables it would pass and show nothing of
    Citus. A schema migrated already is left as it is (distributing it is the
    operator's step: ``agentdb migrate --citus``). A server it cannot reach is
    for the migration to report, in its own words.
    """
    import psycopg

    from agentdb._citus.migrate import HAS_CITUS
    from agentdb.migrate import libpq_dsn

    try:
        with psycopg.connect(libpq_dsn(dsn), autocommit=True, connect_timeout=10) as conn:
            if conn.execute(HAS_CITUS).fetchone() is None:
                return False
            row = conn.execute("SELECT to_regclass('agent_tenants') IS NULL").fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])


def with_database(
    dsn: str | None, body: Callable[[str, IO[bytes], Path], int], limits: Limits | None = None
) -> int:
    """Run ``body(dsn, log, log_path)`` against ``dsn`` (migrated) or an embedded Postgres;
    return the exit status ``body`` returns.

    The processes' output goes to ``log`` (``log_path``, in a new temporary
    directory). The directory is removed when ``body`` returns 0, and kept for
    whoever reads a failure, a timeout or an interrupt (their messages name it).
    With ``limits``, migrating (and starting the embedded Postgres) is held to
    its deadline.

    Raises:
        MigrationError: the migrations failed.
        ConfigurationError: no ``dsn`` and pgserver is not installed.
        DemoTimeout, DemoStopped: the deadline passed, or a signal came, before ``body``.
        whatever ``body`` raises.
    """
    from agentdb.migrate import migrate
    from agentdb.tools.embedded import embedded_postgres

    def step(stage: str) -> AbstractContextManager[None]:
        return limits.interruptible(stage, "no task was created") if limits else nullcontext()

    log_path = Path(tempfile.mkdtemp(prefix="agentdb-run-")) / "processes.log"
    with ExitStack() as stack:
        if dsn:
            with step("migrating the database"):
                citus = _fresh_on_citus(dsn)
                if citus:
                    print(
                        "a Citus coordinator: agentdb's tables are distributed by tenant"
                        " (as agentdb migrate --citus does)",
                        file=sys.stderr,
                    )
                migrate(dsn, citus=citus)
        else:
            print("starting an embedded Postgres (no server to install)...", file=sys.stderr)
            with step("starting an embedded Postgres"):
                dsn = stack.enter_context(embedded_postgres())
        log = stack.enter_context(open(log_path, "ab"))
        status = body(dsn, log, log_path)
    if status == 0:
        shutil.rmtree(log_path.parent, ignore_errors=True)
    return status
