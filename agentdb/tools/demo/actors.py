"""The people and the clock around the demo's invoices, in the driving process.

Each acts, every round of the driver (about every 0.1 s), on what it reads
from the database, and keeps its own ledger in schema ``agentdb_demo`` (as
the provider does), so that the counts (:mod:`agentdb.tools.demo.checks`)
can hold agentdb's claims against what they did:

* :class:`Reviewer` - large invoices (above
  :data:`~agentdb.tools.demo.provider.REVIEW_ABOVE`) wait for its approval
  (G22). It reviews each one after a random latency once it sees it waiting
  for one - or, for one in five, as soon as it sees it at all, before the
  invoice asks - as ``reviewer`` (never a lease holder) with dedupe key
  ``review/<task>``: it approves most and rejects about one in six, and sends
  one review in four twice, as a retry would, which must be recorded once.
  Ledger ``reviews``.
* :class:`Canceller` - cancels about one invoice in ten (G20), each when it
  first sees it in the state picked for it (pending, running or waiting),
  after a random delay (none for running: a run is short); one it never
  sees there it cancels once it has finished (a cancel never undoes a
  finish). Ledger ``cancels``: ``at`` is
  read after the cancel returned, so every effect agentdb granted later than
  that is a breach.
* :class:`Ticker` - one schedule per tenant, a :data:`TICK_TYPE` task every
  second with ``catch_up="all"`` (G24). The workers fire due schedules in
  their maintenance rounds, as they start and every 10 s, and so are killed
  around them; the ticker fires them too, once a second, racing them. It
  pauses them after :data:`TICKING` seconds - ticks that outlived a slow run
  would only slow it more - or when the invoices are done, or on any other
  way out; and at the start of a run it pauses those an earlier run left
  running (killed with SIGKILL): each schedule's params say until when.

What each does to which invoice - approve or reject, twice or once, early,
its latency, whether and when to cancel - is drawn from the run's seed and
the invoice's number alone, so a seed gives the same plan whatever the
timing; what state a cancel then finds is the timing's.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from agentdb import _db, schedules, signals, tasks
from agentdb.errors import TaskFinished, TransientError
from agentdb.tools.demo.provider import APPROVAL, REVIEW_ABOVE, TICK_TYPE

__all__ = [
    "CANCEL_SHARE",
    "REVIEWER",
    "SCHEDULE",
    "TICKING",
    "Canceller",
    "Invoice",
    "Plan",
    "Reviewer",
    "Ticker",
]

#: Who approves: an identity that never holds a lease (the database refuses one that did).
REVIEWER = "reviewer"
#: The share of invoices the canceller cancels.
CANCEL_SHARE = 0.1
#: The name of each tenant's schedule.
SCHEDULE = "agentdb-demo-ticks"
#: Seconds the schedules tick for, at most (from their creation).
TICKING = 20.0
_FINISHED = tasks.FINISHED_STATES
_STATES = (
    "SELECT id, state, wait_signal FROM agent_tasks WHERE tenant_id = ANY ($1) AND id = ANY ($2)"
)
_REVIEWED = (
    "INSERT INTO agentdb_demo.reviews (task_id, tenant_id, decision, sends, outcome)"
    " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id) DO NOTHING"
)
_CANCELLED = (
    "INSERT INTO agentdb_demo.cancels (task_id, tenant_id, wanted, outcome)"
    " VALUES ($1, $2, $3, $4) ON CONFLICT (task_id) DO NOTHING"
)
# Schedules of earlier runs whose run is over (killed before it could pause them).
_LEFT_RUNNING = (
    "SELECT tenant_id FROM agent_schedules WHERE name = $1 AND task_type = $2 AND NOT paused"
    " AND params ? 'until' AND (params->>'until')::timestamptz < now()"
)


@dataclass(frozen=True)
class Invoice:
    """One seeded invoice task."""

    tenant_id: uuid.UUID
    task_id: uuid.UUID
    number: int
    amount: int


@dataclass(frozen=True)
class Plan:
    """What the reviewer and the canceller will do to one invoice (from the seed alone)."""

    decision: str
    twice: bool
    early: bool
    latency: float
    cancel: str | None  # the state to cancel it in, or None
    cancel_delay: float

    @classmethod
    def of(cls, seed: str, invoice: int) -> Plan:
        rng = random.Random(f"{seed}/{invoice}")
        return cls(
            decision="rejected" if rng.random() < 1 / 6 else "approved",
            twice=rng.random() < 0.25,
            early=rng.random() < 0.2,
            latency=rng.uniform(0.05, 0.6),
            cancel=rng.choice(("pending", "running", "waiting"))
            if rng.random() < CANCEL_SHARE
            else None,
            cancel_delay=rng.uniform(0.0, 0.3),
        )


def _tenants(invoices: list[Invoice]) -> list[uuid.UUID]:
    return sorted({i.tenant_id for i in invoices})


@dataclass
class _Actor:
    """An actor's invoices, which of them it is still to act on, and when."""

    invoices: list[Invoice]
    seed: str
    due: dict[uuid.UUID, float] = field(default_factory=dict)
    done: set[uuid.UUID] = field(default_factory=set)

    def plan(self, inv: Invoice) -> Plan:
        return Plan.of(self.seed, inv.number)

    async def _states(self, db: _db.Executor) -> dict[uuid.UUID, tuple[str, str | None]]:
        todo = [i for i in self.invoices if i.task_id not in self.done]
        if not todo:
            return {}
        rows = await db.fetch(_STATES, _tenants(todo), [i.task_id for i in todo])
        return {r["id"]: (r["state"], r["wait_signal"]) for r in rows}


class Reviewer(_Actor):
    """Approves (or rejects) the large invoices, each once, after a random latency."""

    def __init__(self, invoices: list[Invoice], seed: str) -> None:
        super().__init__([i for i in invoices if i.amount > REVIEW_ABOVE], seed)
        self.sends = 0

    async def step(self, db: _db.Executor, now: float) -> None:
        """Look at the invoices not reviewed yet; review those whose moment came.

        Raises:
            AgentDBError: the database refused a review for another reason than the
                task having finished (a bug: it never held a lease).
        """
        by_id = {i.task_id: i for i in self.invoices}
        for task_id, (state, waits_for) in (await self._states(db)).items():
            if state in _FINISHED:
                self.done.add(task_id)  # cancelled, or stopped, before its review
            elif task_id not in self.due and (
                waits_for == APPROVAL or self.plan(by_id[task_id]).early
            ):
                self.due[task_id] = now + self.plan(by_id[task_id]).latency
        for task_id, at in list(self.due.items()):
            if at <= now and task_id not in self.done:
                await self._review(db, by_id[task_id])

    async def _review(self, db: _db.Executor, inv: Invoice) -> None:
        plan = self.plan(inv)
        outcome = "recorded"
        sends = 0
        for _ in range(2 if plan.twice else 1):
            try:
                await signals.approve(
                    db, inv.tenant_id, inv.task_id, approver=REVIEWER, decision=plan.decision,
                    dedupe_key=f"review/{inv.task_id}",
                )  # fmt: skip
            except TaskFinished:
                outcome = outcome if sends else "too late"  # cancelled while it was reviewed
                break
            except TransientError:
                return  # the next round sends it again (the key makes it one review)
            sends += 1
        self.sends += sends
        self.done.add(inv.task_id)
        await db.execute(_REVIEWED, inv.task_id, inv.tenant_id, plan.decision, sends, outcome)


class Canceller(_Actor):
    """Cancels its share of the invoices, each in the state picked for it."""

    def __init__(self, invoices: list[Invoice], seed: str) -> None:
        super().__init__([i for i in invoices if Plan.of(seed, i.number).cancel], seed)

    async def step(self, db: _db.Executor, now: float) -> None:
        """Look at the invoices still to cancel; cancel those whose moment came.

        Raises:
            AgentDBError: the cancel was refused (it never is: it only ends tasks).
        """
        by_id = {i.task_id: i for i in self.invoices}
        for task_id, (state, _) in (await self._states(db)).items():
            plan = self.plan(by_id[task_id])
            if task_id in self.due:
                continue
            if state == plan.cancel:
                # A run is short: one caught running is cancelled at once, or it is gone.
                self.due[task_id] = now + (0.0 if state == "running" else plan.cancel_delay)
            elif state in _FINISHED:
                self.due[task_id] = now  # too late: it finished before it was seen there
        for task_id, at in list(self.due.items()):
            if at <= now and task_id not in self.done:
                await self._cancel(db, by_id[task_id])

    async def _cancel(self, db: _db.Executor, inv: Invoice) -> None:
        try:
            task = await tasks.cancel(
                db, inv.tenant_id, inv.task_id, reason="the customer asked", actor="support"
            )
        except TransientError:
            return  # the next round tries again
        self.done.add(inv.task_id)
        # Written once the cancel returned: its clock_timestamp() is after the cancel's commit.
        await db.execute(_CANCELLED, inv.task_id, inv.tenant_id, self.plan(inv).cancel, task.state)


@dataclass
class Ticker:
    """One schedule per tenant, fired by the workers and by this, racing."""

    tenants: list[uuid.UUID] = field(default_factory=list)
    paused: bool = False
    next_fire: float = 0.0
    fired: int = 0
    stops: float = 0.0  # when it pauses them (time.monotonic())

    @staticmethod
    async def pause_left_running(db: _db.Executor) -> int:
        """Pause the demo's schedules whose run is over; return how many."""
        rows = await db.fetch(_LEFT_RUNNING, SCHEDULE, TICK_TYPE)
        for r in rows:
            await schedules.pause(db, r["tenant_id"], SCHEDULE)
        return len(rows)

    async def create(self, db: _db.Executor, tenant_id: uuid.UUID) -> None:
        """Create the tenant's schedule, to tick for :data:`TICKING` seconds from now."""
        if not self.tenants:
            self.stops = time.monotonic() + TICKING
        # When a later run may take it for one left running (this one paused it by then).
        until = datetime.now(UTC) + timedelta(seconds=TICKING + 10)
        self.tenants.append(tenant_id)
        await schedules.create(
            db, tenant_id, SCHEDULE, TICK_TYPE, every=timedelta(seconds=1), catch_up="all",
            params={"until": until.isoformat()},
        )  # fmt: skip

    async def step(self, db: _db.Executor, now: float) -> None:
        """Fire the due schedules, once a second (whose ever they are, as a worker does);
        pause the run's once they have ticked for :data:`TICKING` seconds."""
        if self.paused or now < self.next_fire:
            return
        if now >= self.stops:
            await self.pause(db)
            return
        self.next_fire = now + 1.0
        with contextlib.suppress(TransientError):
            self.fired += len(await schedules.fire_due(db))

    async def pause(self, db: _db.Executor) -> None:
        """Stop the run's schedules: the ticks fired so far are all there will be."""
        for tenant_id in self.tenants:
            await schedules.pause(db, tenant_id, SCHEDULE)
        self.paused = True

    async def pause_quietly(self, dsn: str, within: float = 3.0) -> None:
        """Pause them on a connection of its own, once the run failed: at most ``within``
        seconds each to connect and to pause, and nothing raised."""
        if self.paused or not self.tenants:
            return
        # Anything: the run's own error is the one to raise (a terminated connection's is not).
        with contextlib.suppress(Exception):
            conn = await _db.connect(dsn, connect_timeout=within)
            # Terminated, not cancelled: a statement queued in PgBouncer ignores cancellation.
            timer = asyncio.get_running_loop().call_later(within, conn.terminate)
            try:
                await self.pause(conn)
            finally:
                timer.cancel()
                conn.terminate()
