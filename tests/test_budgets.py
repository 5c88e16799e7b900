"""Spend budgets and rate limits refused at reserve (G19).

Every test runs against real Postgres; the races use separate connections,
and the rate-limit load comes from separate worker processes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agentdb import budgets, operations, retention, tasks
from agentdb.errors import BudgetExceeded, ConfigurationError, InvariantViolation, RateLimited
from agentdb.models import Operation
from agentdb.testing._postgres import ON_CITUS
from tests import factories as F
from tests._procs import stop_workers, worker_processes
from tests.conftest import RUNTIME, Database, Tenants
from tests.test_model import Harness

ROOT = Path(__file__).resolve().parent.parent


async def _task(conn: asyncpg.Connection | asyncpg.Pool, tenant: uuid.UUID) -> uuid.UUID:
    return (await tasks.create(conn, tenant, "llm", params={"n": uuid.uuid4().hex})).id


async def _books(conn: asyncpg.Connection, tenant: uuid.UUID) -> dict[str, Any]:
    """The budget row and the sums of its holds, read in one snapshot."""
    row = await conn.fetchrow(
        "SELECT b.limit_amount, b.spent, b.held,"
        " (SELECT coalesce(sum(h.amount), 0) FROM agent_budget_holds h"
        "   WHERE h.tenant_id = b.tenant_id AND h.budget_id = b.id AND h.state = 'held') AS holds,"
        " (SELECT coalesce(sum(h.settled), 0) FROM agent_budget_holds h"
        "   WHERE h.tenant_id = b.tenant_id AND h.budget_id = b.id) AS settled"
        " FROM agent_budgets b WHERE b.tenant_id = $1 AND b.task_id IS NULL",
        tenant,
    )
    assert row is not None
    return dict(row)


async def test_G19_fifty_concurrent_reservations_against_a_budget_that_fits_ten(
    db: Database, tenants: Tenants
) -> None:
    """50 reservations of 1,000 tokens from 50 connections against a 10,000 budget:
    exactly 10 succeed; spent + held never exceeds the limit (sampled from another
    connection all along); after settlement the books balance exactly."""
    admin = await db.connect()
    conns = [await db.connect(RUNTIME) for _ in range(50)]
    try:
        await budgets.set_budget(admin, tenants.a, "tokens", 10_000)
        task_ids = [await _task(admin, tenants.a) for _ in range(50)]
        gate = asyncio.Event()
        done = asyncio.Event()
        samples: list[tuple[int, int]] = []

        async def sample() -> None:
            sampler = await db.connect()
            try:
                while not done.is_set():
                    b = await _books(sampler, tenants.a)
                    samples.append((b["spent"], b["held"]))
                    assert b["spent"] + b["held"] <= b["limit_amount"], b
                    await asyncio.sleep(0)
            finally:
                await sampler.close()

        async def one(i: int) -> Operation | BudgetExceeded:
            await gate.wait()
            try:
                res = await operations.reserve(
                    conns[i], tenants.a, task_ids[i], f"call-{i}", "llm", {"i": i},
                    cost={"tokens": 1_000},
                )  # fmt: skip
            except BudgetExceeded as exc:
                return exc
            return res.operation

        sampler = asyncio.create_task(sample())
        racers = [asyncio.create_task(one(i)) for i in range(50)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(*racers)
        won = [r for r in results if isinstance(r, Operation)]
        refused = [r for r in results if isinstance(r, BudgetExceeded)]
        assert (len(won), len(refused)) == (10, 40)
        assert all(r.remaining == {"tokens": 0} for r in refused)
        assert {r.guarantee for r in refused} == {"G19"}
        # Settle them from as many connections: 4 spend 700, 3 fail, 3 spend all.
        settles = []
        for n, op in enumerate(won):
            c = conns[n]
            if n < 4:
                settles.append(operations.complete(c, op, cost={"tokens": 700}))
            elif n < 7:
                settles.append(operations.fail(c, op, "provider said no"))
            else:
                settles.append(operations.complete(c, op))
        await asyncio.gather(*settles)
        done.set()
        await sampler
        assert len(samples) > 10  # the sampler really ran during the race
        books = await _books(admin, tenants.a)
        assert books == {
            "limit_amount": 10_000,
            "spent": 4 * 700 + 3 * 1_000,
            "held": 0,
            "holds": 0,
            "settled": 4 * 700 + 3 * 1_000,
        }
        events = await admin.fetchval(
            "SELECT count(*) FROM agent_events WHERE tenant_id = $1"
            " AND event_type = 'operation.refused' AND payload->>'reason' = 'budget'",
            tenants.a,
        )
        assert events == 40
        ops = await admin.fetchval(
            "SELECT count(*) FROM agent_operations WHERE tenant_id = $1", tenants.a
        )
        assert ops == 10  # a refused reservation leaves no operation behind
    finally:
        for c in conns:
            await c.close()
        await admin.close()


async def test_G19_unknown_keeps_the_hold_until_reconciled(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await budgets.set_budget(pool, tenants.a, "usd_micros", 5_000)
    task = await _task(pool, tenants.a)
    res = await operations.reserve(
        pool, tenants.a, task, "k", "charge", {}, cost={"usd_micros": 3_000}
    )
    op = await operations.mark_unknown(pool, res.operation, error="timeout")
    [b] = await budgets.list_budgets(pool, tenants.a)
    assert (b.spent, b.held, b.remaining) == (0, 3_000, 2_000)
    with pytest.raises(BudgetExceeded) as refused:
        await operations.reserve(
            pool, tenants.a, task, "k2", "charge", {}, cost={"usd_micros": 2_001}
        )
    assert refused.value.remaining == {"usd_micros": 2_000}
    assert refused.value.requested == {"usd_micros": 2_001}
    await operations.reconcile(
        pool, op, succeeded=True, provider_reference="ch_1", cost={"usd_micros": 2_500}
    )
    [b] = await budgets.list_budgets(pool, tenants.a)
    assert (b.spent, b.held) == (2_500, 0)


async def test_G19_a_task_budget_and_the_tenant_budget_both_hold(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    other = await _task(pool, tenants.a)
    await budgets.set_budget(pool, tenants.a, "tokens", 1_000)
    await budgets.set_budget(pool, tenants.a, "tokens", 300, task_id=task)
    await operations.reserve(pool, tenants.a, task, "a", "llm", {}, cost={"tokens": 300})
    with pytest.raises(BudgetExceeded) as refused:
        await operations.reserve(pool, tenants.a, task, "b", "llm", {}, cost={"tokens": 1})
    assert refused.value.remaining == {"tokens": 0}  # the tighter one
    await operations.reserve(pool, tenants.a, other, "c", "llm", {}, cost={"tokens": 700})
    by_task = {b.task_id: (b.held, b.limit) for b in await budgets.list_budgets(pool, tenants.a)}
    assert by_task == {None: (1_000, 1_000), task: (300, 300)}
    # Another tenant's budget is untouched by all of it.
    await operations.reserve(
        pool, tenants.b, await _task(pool, tenants.b), "a", "llm", {}, cost={"tokens": 10**6}
    )


async def test_G19_settling_more_than_was_held_is_refused(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await budgets.set_budget(pool, tenants.a, "tokens", 1_000)
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 100})
    with pytest.raises(InvariantViolation) as refused:
        await operations.complete(pool, res.operation, cost={"tokens": 101})
    assert refused.value.constraint == "agent_budget_holds_settled_valid"
    op = await operations.get(pool, tenants.a, res.operation.id)
    assert op.state == "reserved"  # nothing was recorded
    await operations.complete(pool, res.operation, cost={"tokens": 100})  # the control


async def test_G19_a_failed_operation_retried_holds_again(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await budgets.set_budget(pool, tenants.a, "tokens", 1_000)
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 600})
    await operations.fail(pool, res.operation, "503")
    again = await operations.reserve(pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 600})
    assert again.fresh
    assert again.operation.attempts == 2
    [b] = await budgets.list_budgets(pool, tenants.a)
    assert b.held == 600
    await operations.fail(pool, again.operation, "503")
    await operations.reserve(pool, tenants.a, task, "other", "llm", {}, cost={"tokens": 500})
    with pytest.raises(BudgetExceeded):  # the re-arm needs 600, 500 are left
        await operations.reserve(pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 600})
    op = await operations.get(pool, tenants.a, res.operation.id)
    assert (op.state, op.attempts) == ("failed", 2)


async def test_G19_bad_costs_and_budgets_are_refused_before_the_database(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    task = await _task(pool, tenants.a)
    for cost in ({"Tokens": 1}, {"tokens": -1}, {"tokens": 1.5}, {"tokens": True}):
        with pytest.raises(ConfigurationError):
            await operations.reserve(pool, tenants.a, task, "k", "llm", {}, cost=cost)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        await budgets.set_budget(pool, tenants.a, "tokens", 10, period="week")
    with pytest.raises(ConfigurationError):
        await budgets.set_rate_limit(pool, tenants.a, "llm", 1, timedelta(0))
    await operations.reserve(
        pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 1}
    )  # no budget: free


async def test_G19_a_day_budget_starts_again_in_a_new_window(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    b = await budgets.set_budget(admin_conn, tenants.a, "tokens", 100, period="day")
    task = await _task(admin_conn, tenants.a)
    res = await operations.reserve(
        admin_conn, tenants.a, task, "k", "llm", {}, cost={"tokens": 100}
    )
    await operations.complete(admin_conn, res.operation)
    with pytest.raises(BudgetExceeded):
        await operations.reserve(admin_conn, tenants.a, task, "k2", "llm", {}, cost={"tokens": 1})
    # Yesterday's window (as the owner with the guard off: time cannot be moved otherwise;
    # the instant computed first, as Citus refuses a STABLE operator on a column in a SET).
    start = await admin_conn.fetchval("SELECT window_start FROM agent_budgets WHERE id = $1", b.id)
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_budgets SET window_start = $2 WHERE id = $1",
            b.id,
            start - timedelta(days=1),
        )
    await operations.reserve(admin_conn, tenants.a, task, "k2", "llm", {}, cost={"tokens": 100})
    [now] = await budgets.list_budgets(admin_conn, tenants.a)
    assert (now.spent, now.held) == (0, 100)


@pytest.mark.parametrize("outcome", ["succeeded", "reconciled", "failed"])
async def test_G19_a_hold_settled_after_its_window_rolled_over_is_charged_to_the_new_window(
    outcome: str, admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Blind class "windows the suite never ran" (issue 35): the test above rolls a day
    budget over through a reserve; here the first write of the new window is the
    settlement of a hold made in the old one (a call in flight, or unknown until it is
    reconciled, across midnight UTC).

    The first write in a new window starts ``spent`` again from 0 and what is held stays
    held (docs/guides/budgets.md, "Windows"; agentdb_guard_budget does it). A hold settled
    then is that write, so its actual cost is charged to the window it is settled in -
    the new window's whole spend - and the old window's spend is not carried over; a
    failed one releases its hold and the new window starts at 0. Its room is then the
    limit less its own spend. Kills windows-rollover-drops-the-settlement (the rollover
    resets ``spent`` to 0 on a write that spends too: the settled cost is lost, a free
    call) and windows-rollover-keeps-the-old-spend (it keeps the old window's spend on
    such a write: yesterday's spend is charged again today).
    """
    b = await budgets.set_budget(admin_conn, tenants.a, "tokens", 100, period="day")
    task = await _task(admin_conn, tenants.a)
    earlier = await operations.reserve(
        admin_conn, tenants.a, task, "k0", "llm", {}, cost={"tokens": 40}
    )
    await operations.complete(admin_conn, earlier.operation)
    res = await operations.reserve(
        admin_conn, tenants.a, task, "k1", "llm", {}, cost={"tokens": 60}
    )
    op = res.operation
    if outcome == "reconciled":
        op = await operations.mark_unknown(admin_conn, op, error="timeout")
    [old] = await budgets.list_budgets(admin_conn, tenants.a)
    assert (old.spent, old.held) == (40, 60)
    # Yesterday's window, as the day test moves it (the guard off: time cannot move).
    async with admin_conn.transaction():
        await F.replica_mode(admin_conn)
        await admin_conn.execute(
            "UPDATE agent_budgets SET window_start = $2 WHERE id = $1",
            b.id,
            old.window_start - timedelta(days=1),
        )
    if outcome == "succeeded":
        await operations.complete(admin_conn, op, cost={"tokens": 50})
    elif outcome == "reconciled":
        await operations.reconcile(
            admin_conn, op, succeeded=True, provider_reference="r1", cost={"tokens": 50}
        )
    else:
        await operations.fail(admin_conn, op, "503")
    charged = 0 if outcome == "failed" else 50
    [now] = await budgets.list_budgets(admin_conn, tenants.a)
    assert (now.spent, now.held) == (charged, 0)
    assert now.window_start == await admin_conn.fetchval("SELECT date_trunc('day', now(), 'UTC')")
    # The new window's room is what its own spend leaves, to the unit.
    await operations.reserve(
        admin_conn, tenants.a, task, "k2", "llm", {}, cost={"tokens": 100 - charged}
    )
    with pytest.raises(BudgetExceeded):
        await operations.reserve(admin_conn, tenants.a, task, "k3", "llm", {}, cost={"tokens": 1})


# ---- the stateful model ---------------------------------------------------------------

LIMIT = 5_000


@dataclass
class MOp:
    op: Operation
    estimate: int
    state: str = "reserved"


@dataclass
class BudgetModel:
    spent: int = 0
    held: int = 0
    ops: dict[str, MOp] = field(default_factory=dict)


def run_budget_machine(h: Harness, *, max_examples: int) -> None:
    class BudgetMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tenant = uuid.uuid4()
            h.run(
                h.admin.execute(
                    "INSERT INTO agent_tenants (id, name) VALUES ($1, 'b ' || $1::uuid::text)",
                    self.tenant,
                )
            )
            h.run(budgets.set_budget(h.admin, self.tenant, "tokens", LIMIT))
            self.task = h.run(_task(h.admin, self.tenant))
            self.m = BudgetModel()
            self.n = 0

        def _with(self, state: str) -> list[str]:
            return sorted(k for k, o in self.m.ops.items() if o.state == state)

        @rule(cost=st.integers(0, 2_500), w=st.integers(0, 1))
        def reserve(self, cost: int, w: int) -> None:
            self.n += 1
            key = f"k{self.n}"
            conn = h.conns[w]
            if self.m.spent + self.m.held + cost > LIMIT:
                with pytest.raises(BudgetExceeded) as refused:
                    h.run(
                        operations.reserve(
                            conn, self.tenant, self.task, key, "llm", {}, cost={"tokens": cost}
                        )
                    )
                assert refused.value.remaining == {"tokens": LIMIT - self.m.spent - self.m.held}
                return
            res = h.run(
                operations.reserve(
                    conn, self.tenant, self.task, key, "llm", {}, cost={"tokens": cost}
                )
            )
            assert res.fresh
            self.m.held += cost
            self.m.ops[key] = MOp(res.operation, cost)

        @precondition(lambda self: self._with("reserved") or self._with("unknown"))
        @rule(data=st.data(), frac=st.floats(0, 1), w=st.integers(0, 1))
        def complete(self, data: st.DataObject, frac: float, w: int) -> None:
            key = data.draw(st.sampled_from(self._with("reserved") + self._with("unknown")))
            o = self.m.ops[key]
            actual = int(o.estimate * frac)
            if o.state == "unknown":
                h.run(
                    operations.reconcile(
                        h.conns[w],
                        o.op,
                        succeeded=True,
                        provider_reference="r",
                        cost={"tokens": actual},
                    )
                )
            else:
                h.run(operations.complete(h.conns[w], o.op, cost={"tokens": actual}))
            o.state = "succeeded"
            self.m.held -= o.estimate
            self.m.spent += actual

        @precondition(lambda self: self._with("reserved") or self._with("unknown"))
        @rule(data=st.data(), w=st.integers(0, 1))
        def fail(self, data: st.DataObject, w: int) -> None:
            key = data.draw(st.sampled_from(self._with("reserved") + self._with("unknown")))
            o = self.m.ops[key]
            if o.state == "unknown":
                h.run(
                    operations.reconcile(h.conns[w], o.op, succeeded=False, provider_reference="r")
                )
            else:
                h.run(operations.fail(h.conns[w], o.op, "no"))
            o.state = "failed"
            self.m.held -= o.estimate

        @precondition(lambda self: self._with("reserved"))
        @rule(data=st.data())
        def unknown(self, data: st.DataObject) -> None:
            key = data.draw(st.sampled_from(self._with("reserved")))
            o = self.m.ops[key]
            o.op = h.run(operations.mark_unknown(h.pool, o.op, error="timeout"))
            o.state = "unknown"  # still held

        @precondition(lambda self: self._with("failed"))
        @rule(data=st.data())
        def retry(self, data: st.DataObject) -> None:
            key = data.draw(st.sampled_from(self._with("failed")))
            o = self.m.ops[key]
            if self.m.spent + self.m.held + o.estimate > LIMIT:
                with pytest.raises(BudgetExceeded):
                    h.run(
                        operations.reserve(
                            h.pool,
                            self.tenant,
                            self.task,
                            key,
                            "llm",
                            {},
                            cost={"tokens": o.estimate},
                        )
                    )
                return
            res = h.run(
                operations.reserve(
                    h.pool, self.tenant, self.task, key, "llm", {}, cost={"tokens": o.estimate}
                )
            )
            assert res.fresh
            o.op, o.state = res.operation, "reserved"
            self.m.held += o.estimate

        @invariant()
        def the_books_match_the_model_and_the_limit(self) -> None:
            b = h.run(_books(h.admin, self.tenant))
            assert b["spent"] + b["held"] <= LIMIT
            assert (b["spent"], b["held"]) == (self.m.spent, self.m.held)
            assert (b["holds"], b["settled"]) == (b["held"], b["spent"])

    run_state_machine_as_test(
        BudgetMachine,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_G19_stateful_model_of_reserve_complete_fail_unknown_reconcile(db: Database) -> None:
    h = Harness(db)
    try:
        run_budget_machine(h, max_examples=60)
    finally:
        h.close()


# ---- lock order -------------------------------------------------------------------------


async def budgets_lock_before_rate_limits(
    hold: asyncpg.Connection,
    reserver: asyncpg.Connection | asyncpg.Pool,
    probe: asyncpg.Connection,
    tenant: uuid.UUID,
    waiting: str,
) -> None:
    """Explicit interleaving: ``hold`` locks the tenant's budget; a costed reservation
    then waits for it (``waiting``: a query that is true once some session waits for a
    lock). While it waits it must not hold the action's rate limit: budgets are locked
    before rate limits everywhere (a re-armed retry locks them in that order), or a
    reservation and a retry each hold what the other waits for. Shared with the Citus
    suite, whose reservation is several statements."""
    await budgets.set_budget(reserver, tenant, "tokens", 1_000)
    await budgets.set_rate_limit(reserver, tenant, "ordered", 5, timedelta(hours=1))
    task = await _task(reserver, tenant)
    locked = hold.transaction()
    await locked.start()
    await hold.fetch("SELECT id FROM agent_budgets WHERE tenant_id = $1 FOR UPDATE", tenant)
    reserving = asyncio.ensure_future(
        operations.reserve(reserver, tenant, task, "k", "ordered", {}, cost={"tokens": 1})
    )
    try:
        deadline = time.monotonic() + 60
        while not await probe.fetchval(waiting):
            assert not reserving.done(), reserving.result()  # it should be waiting
            assert time.monotonic() < deadline, "the reservation never waited for the budget"
            await asyncio.sleep(0.05)
        async with probe.transaction():
            free = await probe.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM agent_rate_limits"
                " WHERE tenant_id = $1 AND action = 'ordered' FOR UPDATE NOWAIT) AS l",
                tenant,
            )
        assert free == 1
    finally:
        await locked.rollback()
        res = await reserving
    assert res.fresh  # control: once the budget is free the reservation goes through
    [rl] = await budgets.list_rate_limits(reserver, tenant)
    assert rl.used == 1


_LOCK_WAIT = (
    "SELECT count(*) > 0 FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


@pytest.mark.plain_postgres(
    "it watches pg_stat_activity; on Citus the lock is waited for on a worker:"
    " tests/citus/test_citus_budgets.py runs the same interleaving with citus_lock_waits"
)
async def test_G19_a_reservation_locks_budgets_before_rate_limits(
    db: Database, pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    probe = await db.connect()
    try:
        await budgets_lock_before_rate_limits(admin_conn, pool, probe, tenants.a, _LOCK_WAIT)
    finally:
        await probe.close()


# ---- rate limits ------------------------------------------------------------------------


async def test_G19_a_rate_limit_refuses_the_call_over_it_and_says_when(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    await budgets.set_rate_limit(pool, tenants.a, "chat", 3, timedelta(hours=1))
    task = await _task(pool, tenants.a)
    for i in range(3):
        await operations.reserve(pool, tenants.a, task, f"k{i}", "chat", {})
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenants.a, task, "k3", "chat", {})
    assert (refused.value.guarantee, refused.value.action) == ("G19", "chat")
    assert refused.value.retry_after is not None
    assert refused.value.retry_after > datetime.now(UTC)
    assert refused.value.retry_after.minute == 0  # the aligned hour
    # Another action, and another tenant, are not limited by it.
    await operations.reserve(pool, tenants.a, task, "x", "email", {})
    await operations.reserve(pool, tenants.b, await _task(pool, tenants.b), "k3", "chat", {})
    [rl] = await budgets.list_rate_limits(pool, tenants.a)
    assert (rl.max_calls, rl.used) == (3, 3)


async def test_G19_a_call_is_counted_against_its_own_limits_only(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Found running the generated mutants of this rate-limit code (issue 35): the call's
    count is written back to its tenant's limit of its action only. Another action's
    limit of the same tenant, and another tenant's limit of the same action, keep their
    count and their window (both would otherwise be refused, or let through, by calls
    they never saw). Kills gen-0009.budgets-agentdb_count_call-tenant-2 (the write
    names no tenant) and gen-0009.budgets-agentdb_count_call-and-5 (no action).
    """
    for tenant, action in ((tenants.a, "chat"), (tenants.a, "email"), (tenants.b, "chat")):
        await budgets.set_rate_limit(pool, tenant, action, 3, timedelta(hours=1))
    task = await _task(pool, tenants.a)
    for i in range(3):
        await operations.reserve(pool, tenants.a, task, f"k{i}", "chat", {})
    used = {
        (rl.tenant_id, rl.action): rl.used
        for t in (tenants.a, tenants.b)
        for rl in await budgets.list_rate_limits(pool, t, include_global=False)
    }
    assert used == {(tenants.a, "chat"): 3, (tenants.a, "email"): 0, (tenants.b, "chat"): 0}
    # ...and each still has all its room.
    await operations.reserve(pool, tenants.a, task, "e", "email", {})
    await operations.reserve(pool, tenants.b, await _task(pool, tenants.b), "c", "chat", {})


async def test_G19_a_retry_over_the_rate_limit_is_refused_with_its_event_and_when(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Re-arming a failed key is a call (it counts against the limit): over the limit it is
    refused as a fresh call is - the refusal says when to retry, and its event is written."""
    await budgets.set_rate_limit(pool, tenants.a, "chat", 1, timedelta(hours=1))
    task = await _task(pool, tenants.a)
    first = await operations.reserve(pool, tenants.a, task, "k", "chat", {})
    await operations.fail(pool, first.operation, "502")
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenants.a, task, "k", "chat", {})
    assert refused.value.retry_after is not None
    assert refused.value.retry_after > datetime.now(UTC)
    events = await admin_conn.fetch(
        "SELECT payload->>'idempotency_key' AS key, payload->>'reason' AS reason"
        " FROM agent_events WHERE tenant_id = $1 AND event_type = 'operation.refused'",
        tenants.a,
    )
    assert [(e["key"], e["reason"]) for e in events] == [("k", "rate_limit")]
    [op] = await admin_conn.fetch(
        "SELECT state FROM agent_operations WHERE tenant_id = $1", tenants.a
    )
    assert op["state"] == "failed"  # nothing re-armed


@pytest.mark.plain_postgres(
    "global rate limits are refused on Citus by design (every reservation would be a"
    " two-phase commit); tests/citus/test_citus_budgets.py checks that refusal"
)
async def test_G19_a_global_rate_limit_spans_tenants(pool: asyncpg.Pool, tenants: Tenants) -> None:
    action = f"provider-{uuid.uuid4().hex[:8]}"
    await budgets.set_global_rate_limit(pool, action, 2, timedelta(hours=1))
    await operations.reserve(pool, tenants.a, await _task(pool, tenants.a), "k", action, {})
    await operations.reserve(pool, tenants.b, await _task(pool, tenants.b), "k", action, {})
    with pytest.raises(RateLimited):
        await operations.reserve(pool, tenants.a, await _task(pool, tenants.a), "k2", action, {})


async def _waiting_for_a_lock(
    probe: asyncpg.Connection, pid: int, racing: asyncio.Future[Any]
) -> None:
    """Until the session ``pid`` waits on a lock; it must not be done first."""
    while not await probe.fetchval(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
    ):
        assert not racing.done(), racing.result()  # it went through instead of waiting
        await asyncio.sleep(0.02)


# A window no run of the test straddles (bins of ten years from 2000-01-01): the two
# reservations must count in one window, whenever the test runs.
_LONG = timedelta(days=3650)


@pytest.mark.plain_postgres(
    "global rate limits are refused on Citus by design, and the wait is watched in"
    " pg_stat_activity (on Citus the lock is waited for on a worker)"
)
@pytest.mark.parametrize("room", [1, 2], ids=["last-call", "room-for-both"])
@pytest.mark.parametrize("scope", ["global", "tenant"])
async def test_G19_two_reservers_racing_for_the_last_call_of_a_rate_limit(
    scope: str, room: int, db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Blind class "races the suite never ran" (issue 35): the rate limit under
    concurrent reservers, where every other test reserves one call at a time.

    An explicit interleaving on two connections: the first reserves the limit's last
    call and holds its transaction open; the second reserves and must wait for the
    limit's row lock; the first commits; the second is then refused - or, the control,
    goes through when the limit has room for both. Kills
    gen-0009.budgets-agentdb_count_call-lock-2 (global) and
    gen-0009.budgets-agentdb_count_call-lock-1 (tenant): without the FOR UPDATE the
    second reads the count before the first's call, waits only at its own UPDATE and
    then writes that same count back - two calls counted as one, the CHECK none the
    wiser.
    """
    action = f"provider-{uuid.uuid4().hex[:8]}"
    # Global: two tenants share the provider's limit; per tenant: one tenant, twice.
    second_tenant = tenants.b if scope == "global" else tenants.a
    if scope == "global":
        await budgets.set_global_rate_limit(pool, action, room, _LONG)
    else:
        await budgets.set_rate_limit(pool, tenants.a, action, room, _LONG)
    task_a, task_b = await _task(pool, tenants.a), await _task(pool, second_tenant)
    first, second = await db.connect(RUNTIME), await db.connect(RUNTIME)
    probe = await db.connect()  # the superuser: every session's wait, every tenant's events
    try:
        held = first.transaction()
        await held.start()
        await operations.reserve(first, tenants.a, task_a, "k1", action, {})
        racing = asyncio.ensure_future(
            operations.reserve(second, second_tenant, task_b, "k2", action, {})
        )
        await _waiting_for_a_lock(probe, second.get_server_pid(), racing)
        await held.commit()
        if room == 1:
            with pytest.raises(RateLimited) as refused:
                await racing
            assert refused.value.action == action
        else:
            assert (await racing).fresh
        counted = await probe.fetchval(
            "SELECT count(*) FROM agent_events WHERE event_type = 'operation.reserved'"
            " AND payload->>'action' = $1",
            action,
        )
    finally:
        for c in (first, second, probe):
            await c.close()
    limits = await budgets.list_rate_limits(pool, None if scope == "global" else tenants.a)
    [limit] = [rl for rl in limits if rl.action == action]
    assert (limit.used, counted) == (room, room)


@pytest.mark.plain_postgres("global rate limits are refused on Citus by design")
async def test_G19_a_call_its_tenant_s_limit_refuses_does_not_wait_for_the_global_one(
    db: Database, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenant a has paused the action (0 calls); the provider's global limit has room,
    and b's reservation of the action holds its row lock, its transaction open. a's
    reservation is refused by a's own limit at once: it never queues behind b for a
    limit it will not be counted in (the second session's locks wait at most 5 s).
    Kills generated ``gen-0009.budgets-agentdb_count_call-and-6`` (the global limit
    read, under its row lock, after the tenant's had refused the call)."""
    action = f"provider-{uuid.uuid4().hex[:8]}"
    await budgets.set_global_rate_limit(pool, action, 10, _LONG)
    await budgets.set_rate_limit(pool, tenants.a, action, 0, _LONG)
    task_a, task_b = await _task(pool, tenants.a), await _task(pool, tenants.b)
    first, second = await db.connect(RUNTIME), await db.connect(RUNTIME)
    try:
        held = first.transaction()
        await held.start()
        assert (await operations.reserve(first, tenants.b, task_b, "kb", action, {})).fresh
        await second.execute("SET lock_timeout = '5s'")
        with pytest.raises(RateLimited) as refused:
            await operations.reserve(second, tenants.a, task_a, "ka", action, {})
        assert refused.value.action == action
        await held.commit()
    finally:
        for c in (first, second):
            await c.close()
    limits = await budgets.list_rate_limits(pool, None)
    # The global limit counted b's call alone; a's paused limit, nothing.
    assert {(rl.tenant_id, rl.used) for rl in limits if rl.action == action} == {
        (None, 1),
        (tenants.a, 0),
    }


@pytest.mark.parametrize(
    "scope",
    [
        "tenant",
        "tenant-rearm",
        pytest.param(
            "global",
            marks=pytest.mark.plain_postgres("global rate limits are refused on Citus by design"),
        ),
    ],
)
async def test_G19_a_call_that_waited_past_its_window_is_refused_not_counted_in_the_next(
    scope: str, pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The interleaving behind the load test: a transaction begins in one window (its
    event will carry that instant), another call starts the next window, then the first
    one reserves. Counted in the new window it would let the old one hold more than the
    limit, as the events tell it; it is refused, and its retry is counted where its own
    event lies. ``tenant-rearm``: the late call re-arms a failed key (an UPDATE, where
    the others insert)."""
    if scope.startswith("tenant"):
        await budgets.set_rate_limit(pool, tenants.a, "tick", 5, timedelta(seconds=1))
    else:
        await budgets.set_global_rate_limit(pool, "tick", 5, timedelta(seconds=1))
    task = await _task(pool, tenants.a)
    if scope == "tenant-rearm":
        failed = await operations.reserve(pool, tenants.a, task, "late", "tick", {})
        await operations.fail(pool, failed.operation, "502")
    async with pool.acquire() as late:
        began = late.transaction()
        await began.start()
        at = await late.fetchval("SELECT now()")
        # Sleep past the end of its window, by the database's clock.
        left = await pool.fetchval(
            "SELECT extract(epoch FROM date_bin(interval '1 second', $1::timestamptz,"
            " timestamptz '2000-01-01 00:00:00+00') + interval '1 second' - clock_timestamp())",
            at,
        )
        await asyncio.sleep(float(left) + 0.05)
        await operations.reserve(pool, tenants.a, task, "next", "tick", {})  # the next window
        with pytest.raises(RateLimited) as refused:
            await operations.reserve(late, tenants.a, task, "late", "tick", {})
        assert refused.value.sqlstate == "AG011"
        # Citus drops the constraint field of an error a worker's trigger raised.
        trigger = "agent_operations_rate_limit" + ("_retry" if scope == "tenant-rearm" else "")
        assert refused.value.constraint == (None if ON_CITUS else trigger)
        await began.rollback()
    retried = await operations.reserve(pool, tenants.a, task, "late", "tick", {})
    assert retried.fresh  # control: the same call in a transaction of its own is counted
    # counted in a window after the one its transaction began in
    assert await pool.fetchval(_WINDOW_START[scope]) > at


_WINDOW_START = {
    "tenant": "SELECT window_start FROM agent_rate_limits WHERE action = 'tick'",
    "tenant-rearm": "SELECT window_start FROM agent_rate_limits WHERE action = 'tick'",
    "global": "SELECT window_start FROM agent_global_rate_limits WHERE action = 'tick'",
}


# A limit's window moved by hand (no guard stands on a limit's row): its start and count.
_SET_WINDOW = {
    "tenant": "UPDATE agent_rate_limits SET window_start = $2, used = $3 WHERE action = $1",
    "global": "UPDATE agent_global_rate_limits SET window_start = $2, used = $3 WHERE action = $1",
}
_LIMIT_ROW = {
    "tenant": "SELECT used, window_start FROM agent_rate_limits WHERE action = $1",
    "global": "SELECT used, window_start FROM agent_global_rate_limits WHERE action = $1",
}
_SCOPES = [
    "tenant",
    pytest.param(
        "global",
        marks=pytest.mark.plain_postgres("global rate limits are refused on Citus by design"),
    ),
]


async def _limited(
    conn: asyncpg.Connection, scope: str, tenant: uuid.UUID, action: str, max_calls: int
) -> None:
    if scope == "tenant":
        await budgets.set_rate_limit(conn, tenant, action, max_calls, timedelta(hours=1))
    else:
        await budgets.set_global_rate_limit(conn, action, max_calls, timedelta(hours=1))


async def _limit_row(conn: asyncpg.Connection, scope: str, action: str) -> tuple[int, datetime]:
    row = await conn.fetchrow(_LIMIT_ROW[scope], action)
    assert row is not None
    return row["used"], row["window_start"]


@pytest.mark.parametrize("scope", _SCOPES)
async def test_G19_a_window_that_starts_after_the_clock_counts_the_call_in_it(
    scope: str, admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Blind class "windows the suite never ran" (issue 35): a limit whose current window
    starts after this transaction's clock - started by a server whose clock ran ahead,
    or before this one's stepped back. The call is counted in that window rather than
    refused as late until the clock catches up (agentdb_count_call, "a clock that
    stepped back"): it is late only when its window has really begun. Kills
    gen-0009.budgets-agentdb_count_call-and-4 (tenant) and -and-10 (global), which drop
    the clock_timestamp() check and refuse every such call for up to a window.
    """
    action = f"tick-{uuid.uuid4().hex[:8]}"
    await _limited(admin_conn, scope, tenants.a, action, 2)
    # The next window of the hour, one call in it already; computed first (Citus
    # refuses a STABLE function in the SET of a distributed UPDATE).
    ahead = await admin_conn.fetchval(
        "SELECT date_bin(interval '1 hour', now() + interval '1 hour',"
        " timestamptz '2000-01-01 00:00:00+00')"
    )
    await admin_conn.execute(_SET_WINDOW[scope], action, ahead, 1)
    task = await _task(admin_conn, tenants.a)
    assert (await operations.reserve(admin_conn, tenants.a, task, "k1", action, {})).fresh
    assert await _limit_row(admin_conn, scope, action) == (2, ahead)
    with pytest.raises(RateLimited):  # the control: that window is full now
        await operations.reserve(admin_conn, tenants.a, task, "k2", action, {})


@pytest.mark.parametrize("scope", _SCOPES)
async def test_G19_a_call_at_the_instant_its_window_starts_is_counted_in_it(
    scope: str, admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Blind class "windows the suite never ran" (issue 35): the boundary of the late
    call. A call is late - refused, since its window's count is gone - only when its
    transaction began before the current window; one that began at the very instant
    the window starts belongs to it and is counted. Here the window is made to start at
    this transaction's own start. Kills gen-0009.budgets-agentdb_count_call-cmp-4
    (tenant) and -cmp-10 (global): ``<=`` for ``<`` refuses it.
    """
    action = f"tick-{uuid.uuid4().hex[:8]}"
    await _limited(admin_conn, scope, tenants.a, action, 2)
    task = await _task(admin_conn, tenants.a)
    async with admin_conn.transaction():
        at = await admin_conn.fetchval("SELECT now()")
        await admin_conn.execute(_SET_WINDOW[scope], action, at, 0)
        assert (await operations.reserve(admin_conn, tenants.a, task, "k1", action, {})).fresh
    assert await _limit_row(admin_conn, scope, action) == (1, at)


async def test_G19_a_call_at_the_instant_its_window_ends_starts_the_next_one(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Blind class "windows the suite never ran" (issue 35): the other boundary. A window
    of ``per`` from its start holds the calls before start + per; a call at that very
    instant is the next window's first (agentdb_rate_step), even when the one ending is
    full. Here a full window is made to end at this transaction's own start. Kills
    gen-0009.budgets-agentdb_rate_step-cmp-1 (``<`` for ``<=``: it is counted in the
    window that ended, and refused).
    """
    action = f"tick-{uuid.uuid4().hex[:8]}"
    await budgets.set_rate_limit(admin_conn, tenants.a, action, 2, timedelta(hours=1))
    task = await _task(admin_conn, tenants.a)
    async with admin_conn.transaction():
        at = await admin_conn.fetchval("SELECT now()")
        await admin_conn.execute(_SET_WINDOW["tenant"], action, at - timedelta(hours=1), 2)
        assert (await operations.reserve(admin_conn, tenants.a, task, "k1", action, {})).fresh
        bin_of_at = await admin_conn.fetchval(
            "SELECT date_bin(interval '1 hour', $1::timestamptz,"
            " timestamptz '2000-01-01 00:00:00+00')",
            at,
        )
    assert await _limit_row(admin_conn, "tenant", action) == (1, bin_of_at)


def test_G19_a_rate_limit_holds_under_load_from_worker_processes(
    db: Database, tenants: Tenants
) -> None:
    """3 ``agentdb worker`` processes run 40 tasks whose one call is limited to 5 per
    second: counted from the reservation events per aligned second, never more than 5;
    the tasks that were held back waited and succeeded without losing an attempt."""
    asyncio.run(_seed_rated(db, tenants.a, 40))
    procs = worker_processes(db.url(RUNTIME), "tests.fixture_handlers:RATED", 3, 8)
    try:
        result = asyncio.run(_wait_rated(db, tenants.a))
    finally:
        errs = stop_workers(procs)
    assert all(p.returncode == 0 for p in procs), errs
    per_second, attempts, waits = result
    assert sum(per_second) == 40
    assert max(per_second) <= 5, per_second
    assert waits > 0  # the limit really held tasks back
    assert attempts == {1}  # ...and none of them lost an attempt to it


async def _seed_rated(db: Database, tenant: uuid.UUID, n: int) -> None:
    conn = await db.connect()
    try:
        await budgets.set_rate_limit(conn, tenant, "rated.call", 5, timedelta(seconds=1))
        for i in range(n):
            await tasks.create(conn, tenant, "rated", params={"i": i}, max_attempts=2)
    finally:
        await conn.close()


async def _wait_rated(db: Database, tenant: uuid.UUID) -> tuple[list[int], set[int], int]:
    conn = await db.connect()
    try:
        deadline = time.monotonic() + 120
        while await conn.fetchval(
            "SELECT count(*) FROM agent_tasks WHERE tenant_id = $1 AND state <> 'succeeded'", tenant
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        per_second = [
            r[0]
            for r in await conn.fetch(
                "SELECT count(*) FROM agent_events WHERE tenant_id = $1"
                " AND event_type = 'operation.reserved' AND payload->>'action' = 'rated.call'"
                " GROUP BY date_bin(interval '1 second', created_at,"
                " timestamptz '2000-01-01 00:00:00+00')",
                tenant,
            )
        ]
        attempts = {
            r[0]
            for r in await conn.fetch(
                "SELECT attempts FROM agent_tasks WHERE tenant_id = $1", tenant
            )
        }
        waits = await conn.fetchval(
            "SELECT count(*) FROM agent_events"
            " WHERE tenant_id = $1 AND event_type = 'task.rate_limited'",
            tenant,
        )
        return per_second, attempts, waits
    finally:
        await conn.close()


async def test_G19_retention_purges_the_books_of_what_it_purges(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """Settled holds and a finished task's budget do not block the purge (G9): they go
    with their operation and task; an open hold keeps its operation."""
    conn = admin_conn
    budget = await budgets.set_budget(conn, tenants.a, "tokens", 1_000)
    old = datetime.now(UTC) - timedelta(days=90)
    # Rows past every retention, as they are after their events expired: written with
    # the guards off, since no writer may backdate them otherwise.
    backdating = conn.transaction()
    await backdating.start()
    await F.replica_mode(conn)
    task = await F.insert(conn, "agent_tasks", F.task_row(tenants.a, state="succeeded",
                                                         updated_at=old))  # fmt: skip
    done = await F.insert(conn, "agent_operations", F.operation_row(
        tenants.a, task, state="succeeded", updated_at=old))  # fmt: skip
    open_ = await F.insert(conn, "agent_operations", F.operation_row(
        tenants.a, task, state="unknown", updated_at=old))  # fmt: skip
    for op, state, settled in ((done, "settled", 40), (open_, "held", None)):
        await conn.execute(
            "INSERT INTO agent_budget_holds (tenant_id, operation_id, attempt, budget_id, unit,"
            " amount, state, settled) VALUES ($1, $2, 1, $3, 'tokens', 50, $4, $5)",
            tenants.a, op, budget.id, state, settled,
        )  # fmt: skip
    await backdating.commit()
    ages = {"operations": timedelta(days=30), "tasks": timedelta(days=30)}
    await retention.purge(conn, ages=ages, classes=("operations",))
    left = {r[0] for r in await conn.fetch(
        "SELECT operation_id FROM agent_budget_holds WHERE tenant_id = $1", tenants.a)}  # fmt: skip
    assert left == {open_}  # the settled hold went with its operation; the open one stays
    assert await conn.fetchval(
        "SELECT array_agg(id) FROM agent_operations WHERE tenant_id = $1", tenants.a
    ) == [open_]
    # A finished task's own budget goes with the task, once its operations are gone.
    async with conn.transaction():
        await F.replica_mode(conn)
        await conn.execute("DELETE FROM agent_budget_holds WHERE tenant_id = $1", tenants.a)
        await conn.execute("DELETE FROM agent_operations WHERE tenant_id = $1", tenants.a)
    await budgets.set_budget(conn, tenants.a, "tokens", 100, task_id=task)
    await retention.purge(conn, ages=ages, classes=("tasks",))
    assert [b.task_id for b in await budgets.list_budgets(conn, tenants.a)] == [None]
    assert await conn.fetchval("SELECT count(*) FROM agent_tasks WHERE id = $1", task) == 0


async def test_G19_retention_of_many_settled_operations_in_small_batches(
    admin_conn: asyncpg.Connection, tenants: Tenants
) -> None:
    """More purgeable operations with books than one batch: every batch finds the books
    of whatever operations it takes gone. (The books step takes the books of every
    purgeable operation: one bounded apart from the purge could take other operations'
    books than the purge takes - plan order decides - and the purge would then fail.)"""
    conn = admin_conn
    budget = await budgets.set_budget(conn, tenants.a, "tokens", 1_000_000)
    old = datetime.now(UTC) - timedelta(days=90)
    backdating = conn.transaction()
    await backdating.start()
    await F.replica_mode(conn)
    task = await F.insert(conn, "agent_tasks", F.task_row(tenants.a, state="succeeded",
                                                         updated_at=old))  # fmt: skip
    ops = [
        await F.insert(
            conn,
            "agent_operations",
            F.operation_row(tenants.a, task, state="succeeded", updated_at=old),
        )
        for _ in range(7)
    ]
    # The books in the opposite order to the operations: a step that took "the
    # first" books would take other operations' than the purge takes.
    for op in reversed(ops):
        for attempt in (1, 2):  # two attempts' books per operation
            await conn.execute(
                "INSERT INTO agent_budget_holds (tenant_id, operation_id, attempt, budget_id,"
                " unit, amount, state, settled) VALUES ($1, $2, $3, $4, 'tokens', 5, 'settled', 5)",
                tenants.a, op, attempt, budget.id,
            )  # fmt: skip
    await backdating.commit()
    report = await retention.purge(
        conn, batch=2, ages={"operations": timedelta(days=30)}, classes=("operations",)
    )
    assert report.removed["operations"] == 7
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM agent_budget_holds WHERE tenant_id = $1", tenants.a
        )
        == 0
    )


async def test_G19_a_refusal_in_a_day_window_counts_today_s_spend_as_remaining_less(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The "remaining" of a BudgetExceeded for a day budget: what today's window has
    spent counts (the window that started today is the current one, not one that rolled
    over). Kills generated ``gen-budgets-budget_left-cmp-2`` (``<=``: today's window
    read as rolled over, its spend forgotten)."""
    await budgets.set_budget(pool, tenants.a, "tokens", 100, period="day")
    task = await _task(pool, tenants.a)
    res = await operations.reserve(pool, tenants.a, task, "k", "chat", {}, cost={"tokens": 60})
    await operations.complete(pool, res.operation, result={}, cost={"tokens": 60})
    with pytest.raises(BudgetExceeded) as refused:
        await operations.reserve(pool, tenants.a, task, "k2", "chat", {}, cost={"tokens": 50})
    assert refused.value.remaining == {"tokens": 40}


async def _second_call_s_retry_after(
    pool: asyncpg.Pool, tenant: uuid.UUID, task: uuid.UUID, action: str
) -> datetime:
    """Call ``action`` once, then again: the second is refused; when it may be retried."""
    await operations.reserve(pool, tenant, task, "k", action, {})
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenant, task, "k2", action, {})
    assert refused.value.retry_after is not None
    return refused.value.retry_after


@pytest.mark.plain_postgres("global rate limits are refused on Citus by design")
async def test_G19_a_global_refusal_s_retry_after_is_not_the_tenant_limit_s_with_room(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The tenant's own limit of the action has room (1 of 100 a day); the global limit,
    1 a minute, refuses. retry_after is the global window's end, within the minute - the
    tenant's day-long window, not used up, says nothing about it. Kills generated
    ``gen-budgets-rate_window-and-2`` (every limit of the action read, used up or not)."""
    await budgets.set_rate_limit(pool, tenants.a, "chat-g", 100, timedelta(days=1))
    await budgets.set_global_rate_limit(pool, "chat-g", 1, timedelta(minutes=1))
    retry_after = await _second_call_s_retry_after(
        pool, tenants.a, await _task(pool, tenants.a), "chat-g"
    )
    assert retry_after <= datetime.now(UTC) + timedelta(minutes=1, seconds=5)


async def test_G19_a_rate_limit_s_retry_after_is_its_own_not_another_tenant_s(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Tenant b's limit of the same action, used up for a day, says nothing about when
    tenant a may call again. Kills generated ``gen-budgets-rate_window-tenant-1``."""
    await budgets.set_rate_limit(pool, tenants.a, "chat", 1, timedelta(minutes=1))
    await budgets.set_rate_limit(pool, tenants.b, "chat", 1, timedelta(days=1))
    task_b = await _task(pool, tenants.b)
    await operations.reserve(pool, tenants.b, task_b, "k", "chat", {})
    retry_after = await _second_call_s_retry_after(
        pool, tenants.a, await _task(pool, tenants.a), "chat"
    )
    assert retry_after <= datetime.now(UTC) + timedelta(minutes=1, seconds=5)


@pytest.mark.plain_postgres("global rate limits are refused on Citus by design")
async def test_G19_a_global_refusal_s_retry_after_is_its_own_action_s_window(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """Another action's global limit - shut (0 calls) in windows of a day - says nothing
    about when this action, refused by its own 1-a-minute global limit, may be called
    again: retry_after is within the minute. Kills generated
    ``gen-budgets-global_rate_window-and-1`` (every global limit's window read)."""
    await budgets.set_global_rate_limit(pool, "shut-g", 0, timedelta(days=1))
    await budgets.set_global_rate_limit(pool, "chat-m", 1, timedelta(minutes=1))
    retry_after = await _second_call_s_retry_after(
        pool, tenants.a, await _task(pool, tenants.a), "chat-m"
    )
    assert retry_after <= datetime.now(UTC) + timedelta(minutes=1, seconds=5)


@pytest.mark.plain_postgres("global rate limits are refused on Citus by design")
async def test_G19_a_used_up_limit_whose_window_passed_says_nothing_of_a_global_refusal(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """Tenant a's limit of the action, 1 call a day, was used up in a window that has
    passed: the next call opens a new day. The action's global limit, shut after that
    call, refuses it (and the refusal undoes the tenant's new window, so its row still
    reads used up). retry_after is the end of the global minute, not of the tenant's new
    day. Kills generated ``gen-budgets-rate_window-and-4`` (a used-up limit read as
    refusing whatever its window)."""
    await budgets.set_rate_limit(pool, tenants.a, "chat-day", 1, timedelta(days=1))
    task = await _task(pool, tenants.a)
    await operations.reserve(pool, tenants.a, task, "k", "chat-day", {})
    await admin_conn.execute(
        "UPDATE agent_rate_limits SET window_start = window_start - interval '2 days'"
        " WHERE tenant_id = $1 AND action = 'chat-day'",
        tenants.a,
    )
    await budgets.set_global_rate_limit(pool, "chat-day", 0, timedelta(minutes=1))
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenants.a, task, "k2", "chat-day", {})
    assert refused.value.retry_after is not None
    assert refused.value.retry_after <= datetime.now(UTC) + timedelta(minutes=1, seconds=5)
    used = await admin_conn.fetchval(
        "SELECT used FROM agent_rate_limits WHERE tenant_id = $1 AND action = 'chat-day'",
        tenants.a,
    )
    assert used == 1  # still used up, in its past window: what the mutant reads as shut


@pytest.mark.plain_postgres("global rate limits are refused on Citus by design")
async def test_G19_a_used_up_global_limit_whose_window_passed_says_nothing_of_a_refusal(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """The global limit of the action, 1 call a day, was used up in a window that has
    passed. The tenant's own limit, shut after that call, refuses the next one (and the
    refusal undoes the global limit's new window, so its row still reads used up).
    retry_after is the end of the tenant's minute, not of the global limit's new day.
    Kills generated ``gen-budgets-global_rate_window-and-4`` (a used-up global limit read
    as refusing whatever its window)."""
    await budgets.set_global_rate_limit(pool, "chat-gday", 1, timedelta(days=1))
    task = await _task(pool, tenants.a)
    await operations.reserve(pool, tenants.a, task, "k", "chat-gday", {})
    await admin_conn.execute(
        "UPDATE agent_global_rate_limits SET window_start = window_start - interval '2 days'"
        " WHERE action = 'chat-gday'"
    )
    await budgets.set_rate_limit(pool, tenants.a, "chat-gday", 0, timedelta(minutes=1))
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenants.a, task, "k2", "chat-gday", {})
    assert refused.value.retry_after is not None
    assert refused.value.retry_after <= datetime.now(UTC) + timedelta(minutes=1, seconds=5)
    used = await admin_conn.fetchval(
        "SELECT used FROM agent_global_rate_limits WHERE action = 'chat-gday'"
    )
    assert used == 1  # still used up, in its past window: what the mutant reads as shut


async def test_G19_a_re_armed_operation_holds_on_its_own_task_s_budget_not_another_s(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A failed operation re-armed with a cost holds it on the budgets that cover its own
    task: not on the budget of a sibling task with an operation of its own, nor on that of
    a's task whose id is the task of tenant b's operation of the same id (ids are the
    caller's: reserve_many's ``operation_id``, create's ``task_id``). Kills generated
    ``gen-budgets-budget_hold-and-1`` (every task of the tenant with an operation) and
    ``-tenant-1`` (the operation's id looked up in every tenant)."""
    from agentdb import leases
    from agentdb.operations import ReserveRequest

    b_task = await tasks.create(pool, tenants.b, "t-b")
    b_op = (await operations.reserve(pool, tenants.b, b_task.id, "k", "llm", {})).operation
    namesake = await tasks.create(pool, tenants.a, "t-namesake", task_id=b_task.id)
    sibling = await tasks.create(pool, tenants.a, "t-sibling")
    await operations.reserve(pool, tenants.a, sibling.id, "k-sibling", "llm", {})
    mine = await tasks.create(pool, tenants.a, "t-mine")
    for task in (namesake, sibling, mine):
        await budgets.set_budget(pool, tenants.a, "usd", 100, task_id=task.id)
    [held] = await leases.claim(pool, "w", task_types=["t-mine"])
    assert held.lease is not None
    [res] = await operations.reserve_many(
        pool, [ReserveRequest(held.lease, "k-mine", "llm", {}, operation_id=b_op.id)]
    )
    assert not isinstance(res, Exception)
    await operations.fail(pool, res.operation, "503", lease=held.lease)
    again = await operations.reserve(
        pool, tenants.a, mine.id, "k-mine", "llm", {}, cost={"usd": 5}, lease=held.lease
    )
    assert (again.fresh, again.operation.id) == (True, b_op.id)
    books = await admin_conn.fetch(
        "SELECT task_id, held FROM agent_budgets WHERE tenant_id = $1", tenants.a
    )
    assert {r["task_id"]: r["held"] for r in books} == {namesake.id: 0, sibling.id: 0, mine.id: 5}


async def test_G19_a_shut_limit_whose_window_has_passed_still_says_when_it_next_opens(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A limit of 0 calls refuses every call, in every window: its refusal's retry_after is
    the end of the current window even when the window it last counted in has long passed
    (nothing was counted since). Kills generated ``gen-budgets-rate_window-int-2``
    (``max_calls = -1``: a shut limit read only while its last window runs)."""
    await budgets.set_rate_limit(pool, tenants.a, "shut", 0, _LONG)
    # Its window never opened (window_start is -infinity until a call is counted): the
    # window it last counted in is as long past as can be.
    start = await admin_conn.fetchval(
        "SELECT window_start = '-infinity' FROM agent_rate_limits"
        " WHERE tenant_id = $1 AND action = 'shut'",
        tenants.a,
    )
    assert start
    task = await _task(pool, tenants.a)
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenants.a, task, "k", "shut", {})
    assert refused.value.retry_after is not None
    assert refused.value.retry_after > datetime.now(UTC) + timedelta(days=1)


async def test_G19_a_window_that_ends_this_instant_counts_no_calls(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """A rate window is over at its end instant (``window_start + per <= now()``, as the
    count that opens a new window says): listed in the transaction whose now() is that
    end, its calls count 0. Kills generated ``gen-budgets-rate_limit_list-cmp-1`` (``<``:
    the used-up window still shown full)."""
    await budgets.set_rate_limit(pool, tenants.a, "chat", 1, timedelta(minutes=1))
    await operations.reserve(pool, tenants.a, await _task(pool, tenants.a), "k", "chat", {})
    async with admin_conn.transaction():
        # now() - per, computed here (Citus refuses a STABLE operator on a column in an
        # UPDATE); the transaction's now() is the one the listing reads.
        row = await admin_conn.fetchrow(
            "SELECT now(), per FROM agent_rate_limits WHERE tenant_id = $1", tenants.a
        )
        assert row is not None
        now, per = row
        await admin_conn.execute(
            "UPDATE agent_rate_limits SET window_start = $2 WHERE tenant_id = $1",
            tenants.a,
            now - per,
        )
        [limit] = await budgets.list_rate_limits(admin_conn, tenants.a, include_global=False)
        assert limit.used == 0


async def test_G19_a_reservation_holds_each_cost_on_its_own_unit_s_budget(
    pool: asyncpg.Pool, tenants: Tenants, admin_conn: asyncpg.Connection
) -> None:
    """With budgets in two units, a cost in one of them is held on that unit's budget
    alone, and a cost in both holds each amount on its own unit. Kills generated
    ``gen-operations-operation_reserve-and-4`` (every budget of the task held for every
    unit of the cost)."""
    await budgets.set_budget(pool, tenants.a, "usd", 100)
    await budgets.set_budget(pool, tenants.a, "tokens", 10_000)
    task = await _task(pool, tenants.a)
    await operations.reserve(pool, tenants.a, task, "one", "llm", {}, cost={"usd": 5})

    async def held() -> dict[str, int]:
        rows = await admin_conn.fetch(
            "SELECT unit, held FROM agent_budgets WHERE tenant_id = $1", tenants.a
        )
        return {r["unit"]: r["held"] for r in rows}

    assert await held() == {"usd": 5, "tokens": 0}
    await operations.reserve(pool, tenants.a, task, "two", "llm", {},
                             cost={"usd": 2, "tokens": 300})  # fmt: skip
    assert await held() == {"usd": 7, "tokens": 300}
    holds = await admin_conn.fetch(
        "SELECT unit, amount FROM agent_budget_holds WHERE tenant_id = $1 ORDER BY unit, amount",
        tenants.a,
    )
    assert [(h["unit"], h["amount"]) for h in holds] == [("tokens", 300), ("usd", 2), ("usd", 5)]


async def test_G19_a_refusal_s_remaining_is_that_of_the_budgets_covering_its_own_task(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The tenant's budget (1 000 tokens) and the task's own (300) cover the task; a
    sibling task's budget of 5 does not. A reservation of 301 on the task is refused with
    300 remaining - the tighter of its own two, not the sibling's 5. Kills generated
    ``gen-budgets-budget_left-and-3`` (every task budget of the tenant read as covering
    the task)."""
    task = await _task(pool, tenants.a)
    sibling = await _task(pool, tenants.a)
    await budgets.set_budget(pool, tenants.a, "tokens", 1_000)
    await budgets.set_budget(pool, tenants.a, "tokens", 300, task_id=task)
    await budgets.set_budget(pool, tenants.a, "tokens", 5, task_id=sibling)
    with pytest.raises(BudgetExceeded) as refused:
        await operations.reserve(pool, tenants.a, task, "k", "llm", {}, cost={"tokens": 301})
    assert refused.value.remaining == {"tokens": 300}


@pytest.mark.plain_postgres("global rate limits are refused on Citus by design")
async def test_G19_a_refusal_s_retry_after_skips_a_global_limit_of_one_with_room(
    pool: asyncpg.Pool, tenants: Tenants
) -> None:
    """The tenant's limit of the action is paused (0 calls a minute) and refuses; the
    global limit of the action, one call a day, has its call still to make. retry_after
    is the end of the tenant's minute - the global day, not used up, says nothing about
    it. Kills generated ``gen-budgets-global_rate_window-int-1`` (``max_calls = 1``: a
    global limit of one call read as shut)."""
    await budgets.set_rate_limit(pool, tenants.a, "chat-1", 0, timedelta(minutes=1))
    await budgets.set_global_rate_limit(pool, "chat-1", 1, timedelta(days=1))
    with pytest.raises(RateLimited) as refused:
        await operations.reserve(pool, tenants.a, await _task(pool, tenants.a), "k", "chat-1", {})
    assert refused.value.retry_after is not None
    assert refused.value.retry_after <= datetime.now(UTC) + timedelta(minutes=1, seconds=5)
