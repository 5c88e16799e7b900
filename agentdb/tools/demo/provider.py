"""The demo's outside world: a fake payment/email provider and a fake message consumer.

Both keep their own ledger in schema ``agentdb_demo``, apart from agentdb's
tables, so the report can check agentdb's claims against what the outside
world saw:

* ``provider_requests``: every request the provider received, with its
  outcome - 'received' (the request arrived and nothing came of it: its
  sender died), 'refused' (a 503 before anything was done), 'executed'
  (the effect happened now) or 'replayed' (the key had already been
  executed: the first effect's reference is returned and nothing happens);
* ``provider_effects``: the effects, one per idempotency key;
* ``consumer_ledger`` / ``consumer_redeliveries``: messages the consumer
  applied, and the repeats its inbox absorbed.

The worker runs :data:`WORKER` (the invoice handler and the reconcile hook
that asks the provider), the relay runs :data:`PUBLISHER` (the consumer).
Each process has its own connections, opened from ``$DATABASE_URL``.

An invoice with ``lines`` in its params prices each line in a child task
(:data:`LINE_TYPE`, G23) and charges their total once the last of them wakes
it; one above :data:`REVIEW_ABOVE` first waits for a reviewer's approval
(G22), and a rejection fails it with no effect. Every handler run notes the
signals it was handed in ``signal_reads`` (what the demo checks "read once"
against). An invoice without ``lines`` is charged as one amount, as before.
The driver's reviewer, canceller and schedules are :mod:`agentdb.tools.demo.actors`.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentdb import _db, _dsn, _faults, inbox
from agentdb.errors import BudgetExceeded
from agentdb.models import Message, Operation, OutboxMessage, Signal
from agentdb.tasks import FINISHED_STATES
from agentdb.worker import Fail, Handler, Job, Reconciled, ReconcileHook, Succeed, Wait

__all__ = [
    "ACTIONS",
    "APPROVAL",
    "LINE_TYPE",
    "PUBLISHER",
    "REJECTED",
    "REVIEW_ABOVE",
    "SCHEMA",
    "TASK_TYPE",
    "TICK_TYPE",
    "WORKER",
    "ProviderError",
    "ProviderTimeout",
    "invoice",
    "invoice_line",
    "provider_call",
    "provider_lookup",
    "publish",
    "tick",
]

TASK_TYPE = "demo.invoice"
#: One line item of an invoice, priced by a child task (G23).
LINE_TYPE = "demo.invoice_line"
#: What the demo's schedules create, one per tick (G24).
TICK_TYPE = "demo.tick"
#: Invoices of more than this many usd_cents wait for a reviewer's approval (G22).
REVIEW_ABOVE = 350
#: The signal a large invoice waits for, and how a rejected one ends.
APPROVAL = "approval"
REJECTED = "rejected by the reviewer"
ACTIONS = ("charge", "email")
#: The unit of the demo's budget (G19), and how a task it stopped ends.
BUDGET_UNIT = "usd_cents"
BUDGET_STOP = "budget exhausted"
# AGENTDB_DEMO_CALM=1 turns these off (the crash tests want exact counts).
_CALM = os.environ.get("AGENTDB_DEMO_CALM") == "1"
REFUSE_RATE = 0.0 if _CALM else 0.06  # the provider answers 503 before doing anything
TIMEOUT_RATE = 0.0 if _CALM else 0.04  # the provider does it, but the answer never arrives
BROKER_DOWN_RATE = 0.0 if _CALM else 0.03  # the consumer is unreachable: nothing delivered
ACK_LOST_RATE = 0.0 if _CALM else 0.03  # the consumer processed it; the relay never hears back

#: The provider's and the consumer's tables, dropped and created afresh (one run each).
SCHEMA = (
    "CREATE SCHEMA IF NOT EXISTS agentdb_demo",
    "DROP TABLE IF EXISTS agentdb_demo.provider_requests, agentdb_demo.provider_effects,"
    " agentdb_demo.consumer_ledger, agentdb_demo.consumer_redeliveries",
    "CREATE TABLE agentdb_demo.provider_requests (id bigserial PRIMARY KEY, key text NOT NULL,"
    " action text NOT NULL, task_id uuid NOT NULL, outcome text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE INDEX ON agentdb_demo.provider_requests (key, at)",
    "CREATE TABLE agentdb_demo.provider_effects (key text PRIMARY KEY, action text NOT NULL,"
    " task_id uuid NOT NULL, ref text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE agentdb_demo.consumer_ledger (tenant_id uuid NOT NULL, message_id uuid NOT NULL,"
    " invoice int NOT NULL, PRIMARY KEY (tenant_id, message_id))",
    "CREATE TABLE agentdb_demo.consumer_redeliveries (id bigserial PRIMARY KEY,"
    " message_id uuid NOT NULL)",
    # The invoice handler's notes: each signal each run was handed (lease_token: the run).
    "DROP TABLE IF EXISTS agentdb_demo.signal_reads, agentdb_demo.reviews, agentdb_demo.cancels",
    "CREATE TABLE agentdb_demo.signal_reads (id bigserial PRIMARY KEY, tenant_id uuid NOT NULL,"
    " task_id uuid NOT NULL, seq bigint NOT NULL, lease_token bigint NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    # The reviewer's and the canceller's own ledgers (agentdb.tools.demo.actors).
    "CREATE TABLE agentdb_demo.reviews (task_id uuid PRIMARY KEY, tenant_id uuid NOT NULL,"
    " decision text NOT NULL, sends int NOT NULL, outcome text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE agentdb_demo.cancels (task_id uuid PRIMARY KEY, tenant_id uuid NOT NULL,"
    " wanted text NOT NULL, outcome text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
)


class ProviderError(Exception):
    """The provider refused the request; nothing happened."""


class ProviderTimeout(Exception):
    """No answer in time; the effect may or may not have happened."""


_rng = random.Random()
_pool: _db.Pool | None = None


async def _provider_pool() -> _db.Pool:
    """The fake provider's and consumer's own connections (separate from agentdb's).

    Raises:
        ConfigurationError: ``$DATABASE_URL`` is unset or not a postgresql:// URL.
        DatabaseUnavailable: the database cannot be reached.
    """
    global _pool
    if _pool is None:
        seed = os.environ.get("AGENTDB_DEMO_SEED")
        # Per process: restarted workers must not replay their predecessor's faults.
        _rng.seed(f"{seed}:{os.getpid()}" if seed else None)
        _pool = await _db.create_pool(_dsn.from_env(None), min_size=1, max_size=2)
    return _pool


async def provider_call(key: str, action: str, task_id: uuid.UUID) -> str:
    """Perform ``action`` once per idempotency ``key``; return the provider's reference.

    Every request is logged on arrival, so the report can compare requests
    received with effects executed, and tell a repeat the key absorbed
    ('replayed') from a first execution.

    Raises:
        ProviderError: refused (503); nothing was done.
        ProviderTimeout: the effect happened (or was replayed) but the answer was lost.
    """
    pool = await _provider_pool()
    await asyncio.sleep(_rng.uniform(0.005, 0.04))
    request = await pool.fetchval(
        "INSERT INTO agentdb_demo.provider_requests (key, action, task_id, outcome)"
        " VALUES ($1, $2, $3, 'received') RETURNING id",
        key,
        action,
        task_id,
    )
    _faults.point("during_call")  # the provider has the request; no effect yet
    if _rng.random() < REFUSE_RATE:
        await pool.execute(
            "UPDATE agentdb_demo.provider_requests SET outcome = 'refused' WHERE id = $1", request
        )
        raise ProviderError("503 service unavailable")
    # Honour the idempotency key: a repeated key returns the first effect's reference.
    ref = await pool.fetchval(
        "WITH eff AS (INSERT INTO agentdb_demo.provider_effects (key, action, task_id, ref)"
        "             VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING RETURNING ref),"
        " req AS (UPDATE agentdb_demo.provider_requests"
        "         SET outcome = CASE WHEN EXISTS (SELECT 1 FROM eff) THEN 'executed'"
        "                            ELSE 'replayed' END WHERE id = $5)"
        " SELECT ref FROM eff UNION ALL"
        " SELECT ref FROM agentdb_demo.provider_effects WHERE key = $1",
        key,
        action,
        task_id,
        f"{action}_{uuid.uuid4().hex[:10]}",
        request,
    )
    if _rng.random() < TIMEOUT_RATE:
        raise ProviderTimeout("no answer within 30s")
    return str(ref)


async def provider_lookup(op: Operation) -> Reconciled | None:
    """Reconcile hook: ask the provider whether the effect for this key happened.

    Raises:
        ConfigurationError, DatabaseUnavailable: as for the provider's pool.
    """
    pool = await _provider_pool()
    ref = await pool.fetchval(
        "SELECT ref FROM agentdb_demo.provider_effects WHERE key = $1", op.idempotency_key
    )
    return None if ref is None else Reconciled(True, str(ref), {"ref": str(ref)})


async def _note_reads(job: Job, seen: list[Signal]) -> None:
    """Write down the signals this run was handed (the check of "read once" reads them)."""
    pool = await _provider_pool()
    await pool.execute(
        "INSERT INTO agentdb_demo.signal_reads (tenant_id, task_id, seq, lease_token)"
        " SELECT $1, $2, unnest($3::bigint[]), $4",
        job.task.tenant_id,
        job.task.id,
        [s.seq for s in seen],
        job.task.lease_token,
    )


def _decision(seen: list[Signal]) -> str | None:
    """The reviewer's decision among the signals read, if it came."""
    return next(
        (s.decision for s in reversed(seen) if s.kind == "approval" and s.name == APPROVAL), None
    )


async def _fan_out(job: Job, lines: list[int]) -> Wait:
    """One child per line item (once per key: a retried fan-out gets the same children)."""
    for i, amount in enumerate(lines):
        await job.spawn(
            LINE_TYPE, f"line-{i}", {"invoice": job.task.params["invoice"], "amount": amount},
            max_attempts=job.task.max_attempts, lease_ttl=job.task.lease_ttl,
        )  # fmt: skip
    return Wait(children=True)


async def invoice(job: Job) -> Succeed | Fail | Wait:
    """Review (large invoices), price the lines in child tasks, then charge and email.

    Each effect is reserved before the call and recorded after it. A charge the
    tenant's budget has no room for fails the task (no effect), and so does a
    rejection. Every run reads its unread signals first: the ``Wait`` it ends
    in marks them read, so a run woken by its last child is handed none.

    Raises:
        ProviderError, ProviderTimeout: the worker retries the task (a timeout
            leaves the operation 'unknown', reconciled by the next attempt).
        as :meth:`Job.reserve`, :meth:`Job.complete`, :meth:`Job.spawn`.
    """
    params = job.task.params
    seen = await job.signals()
    if seen:
        await _note_reads(job, seen)
    lines: list[int] | None = params.get("lines")
    kids = await job.children() if lines else []
    if not kids:
        # Children come only after the approval: none yet, so it is still to be read.
        if params["amount"] > REVIEW_ABOVE:
            decision = _decision(seen)
            if decision == "rejected":
                return Fail(REJECTED)
            if decision is None:
                return Wait(signal=APPROVAL)
        if lines:
            return await _fan_out(job, lines)
        total = int(params["amount"])
    elif lines and (len(kids) < len(lines) or any(k.task.state not in FINISHED_STATES
                                                  for k in kids)):  # fmt: skip
        return await _fan_out(job, lines)  # a run that died while spawning them
    else:
        unpriced = [k for k in kids if k.task.state != "succeeded" or not k.result]
        if unpriced:
            return Fail(f"{len(unpriced)} line item(s) could not be priced")
        total = sum(int(k.result["amount"]) for k in kids if k.result)
    for action in ACTIONS:
        key = f"{job.task.id}/{action}"
        # The charge costs its amount against the tenant's budget, if it has one (G19).
        cost = {BUDGET_UNIT: total} if action == "charge" else None
        try:
            res = await job.reserve(
                key, action, {"invoice": params["invoice"], "amount": total}, cost=cost
            )
        except BudgetExceeded as exc:
            left = exc.remaining.get(BUDGET_UNIT, 0)
            return Fail(f"{BUDGET_STOP}: {total} {BUDGET_UNIT} asked, {left} left")
        if not res.fresh:
            continue  # done by an earlier attempt (or reconciled just now)
        try:
            ref = await provider_call(key, action, job.task.id)
        except ProviderTimeout:
            await job.mark_unknown(res.operation, "provider timed out")
            raise
        except ProviderError as exc:
            await job.fail(res.operation, str(exc))
            raise
        await job.complete(res.operation, result={"ref": ref}, provider_reference=ref, cost=cost)
    return Succeed(
        payload={"total": total, "lines": len(kids)},
        outbox=(Message("invoice.paid", {"invoice": params["invoice"]}),),
    )


async def invoice_line(job: Job) -> Succeed:
    """Price one line item: its result is what the parent adds up."""
    return Succeed(payload={"amount": job.task.params["amount"]})


async def tick(job: Job) -> Succeed:
    """A schedule's task: nothing to do but be there once per tick."""
    return Succeed()


@dataclass(frozen=True)
class _Handlers:
    handlers: Mapping[str, Handler] = field(
        default_factory=lambda: {TASK_TYPE: invoice, LINE_TYPE: invoice_line, TICK_TYPE: tick}
    )
    reconcilers: Mapping[str, ReconcileHook] = field(
        default_factory=lambda: dict.fromkeys(ACTIONS, provider_lookup)
    )


#: ``agentdb worker agentdb.tools.demo.provider:WORKER``
WORKER = _Handlers()


async def publish(message: OutboxMessage) -> None:
    """The fake consumer: applies each message once, whatever the relay repeats.

    Raises:
        ConnectionError: the consumer was unreachable; nothing was applied.
        TimeoutError: applied (or absorbed), but the acknowledgement was lost.
    """
    pool = await _provider_pool()
    if _rng.random() < BROKER_DOWN_RATE:
        raise ConnectionError("consumer unreachable")

    async def apply(conn: _db.Conn) -> None:
        await conn.execute(
            "INSERT INTO agentdb_demo.consumer_ledger (tenant_id, message_id, invoice)"
            " VALUES ($1, $2, $3)",
            message.tenant_id,
            message.id,
            message.payload["invoice"],
        )

    first, _ = await inbox.process_once(pool, message.tenant_id, "ledger", message.id, apply)
    if not first:
        await pool.execute(
            "INSERT INTO agentdb_demo.consumer_redeliveries (message_id) VALUES ($1)", message.id
        )
    if _rng.random() < ACK_LOST_RATE:
        raise TimeoutError("acknowledgement lost")


#: ``agentdb relay agentdb.tools.demo.provider:PUBLISHER``
PUBLISHER = publish
