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

The invoice handler is straight-line code on the ledger (G25): a model
step assesses the invoice (the fake model notes every call in
``model_calls``, so the report can tell a step run once from one run again);
one above :data:`REVIEW_ABOVE` waits for a reviewer's approval (G22), and a
rejection fails it with no effect; an invoice with ``lines`` prices each line
in a child task (:data:`LINE_TYPE`, G23) and charges their total; a durable
sleep lets the charge settle before the receipt is emailed. Every run notes
the approval its review step returned in ``signal_reads`` (what the demo
checks "read once" against: one approval per task, the same on every
re-entry). The driver's reviewer, canceller and schedules are
:mod:`agentdb.tools.demo.actors`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from agentdb import _db, _dsn, _faults, inbox
from agentdb.errors import BudgetExceeded
from agentdb.models import Message, Operation, OutboxMessage, Signal
from agentdb.worker import Fail, Handler, Job, NotPerformed, Reconciled, ReconcileHook, Succeed

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
    "assess",
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
    # The fake model's notes: every call of the invoice handler's "assess" step, by run.
    "DROP TABLE IF EXISTS agentdb_demo.model_calls",
    "CREATE TABLE agentdb_demo.model_calls (id bigserial PRIMARY KEY, tenant_id uuid NOT NULL,"
    " task_id uuid NOT NULL, lease_token bigint NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    # The reviewer's and the canceller's own ledgers (agentdb.tools.demo.actors).
    "CREATE TABLE agentdb_demo.reviews (task_id uuid PRIMARY KEY, tenant_id uuid NOT NULL,"
    " decision text NOT NULL, sends int NOT NULL, outcome text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
    "CREATE TABLE agentdb_demo.cancels (task_id uuid PRIMARY KEY, tenant_id uuid NOT NULL,"
    " wanted text NOT NULL, outcome text NOT NULL,"
    " at timestamptz NOT NULL DEFAULT clock_timestamp())",
)


class ProviderError(NotPerformed):
    """The provider refused the request; nothing happened (so the next attempt calls again)."""


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


async def provider_call(
    action: str, task: str, request: Mapping[str, int], *, idempotency_key: str
) -> dict[str, str]:
    """Perform ``action`` for task ``task`` (its id) once per idempotency key; return the
    provider's reference. ``request`` is what is charged or sent (the invoice, the amount).

    Every request is logged on arrival, so the report can compare requests
    received with effects executed, and tell a repeat the key absorbed
    ('replayed') from a first execution.

    Raises:
        ProviderError: refused (503); nothing was done.
        ProviderTimeout: the effect happened (or was replayed) but the answer was lost.
    """
    key, task_id = idempotency_key, uuid.UUID(task)
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
    return {"ref": str(ref)}


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


async def assess(
    tenant_id: uuid.UUID, task_id: uuid.UUID, lease_token: int, invoice: int, amount: int
) -> dict[str, str]:
    """The fake model: sorts an invoice into a risk band, slowly, noting each call.

    Called through ``job.step`` with the run's own ids bound by
    :func:`functools.partial` (only the invoice and amount are the step's
    arguments, hashed with its name): the note says which run called it.
    """
    pool = await _provider_pool()
    await pool.execute(
        "INSERT INTO agentdb_demo.model_calls (tenant_id, task_id, lease_token)"
        " VALUES ($1, $2, $3)",
        tenant_id,
        task_id,
        lease_token,
    )
    await asyncio.sleep(_rng.uniform(0.005, 0.03))  # the model thinks
    return {"band": "review" if amount > REVIEW_ABOVE else "auto", "invoice": str(invoice)}


async def _note_read(job: Job, seen: Signal) -> None:
    """Write down the approval this run's review step returned (the "read once" check)."""
    pool = await _provider_pool()
    await pool.execute(
        "INSERT INTO agentdb_demo.signal_reads (tenant_id, task_id, seq, lease_token)"
        " VALUES ($1, $2, $3, $4)",
        job.task.tenant_id,
        job.task.id,
        seen.seq,
        job.task.lease_token,
    )


#: How long a charge settles before its receipt is emailed (a durable sleep).
SETTLE = timedelta(milliseconds=50)


async def invoice(job: Job) -> Succeed | Fail:
    """Assess, review (large invoices), price the lines in child tasks, charge, let the
    charge settle, email the receipt - written straight through: each named step is
    recorded, so a run re-entered after a wait or a crash picks up where the last left
    off (G25). A charge the tenant's budget has no room for fails the task (no effect),
    and so does a rejection.

    Raises:
        ProviderError, ProviderTimeout: the worker retries the task (a refusal was
            recorded failed and is called again; a timeout is unknown, and the reconcile
            hook asks the provider).
        as :meth:`Job.step`, :meth:`Job.effect`, :meth:`Job.wait_for_signal`.
    """
    params = job.task.params
    amount = int(params["amount"])
    model = functools.partial(assess, job.task.tenant_id, job.task.id, job.task.lease_token)
    await job.step("assess", model, params["invoice"], amount)
    if amount > REVIEW_ABOVE:
        review = await job.wait_for_signal("review", APPROVAL)
        await _note_read(job, review)
        if review.decision == "rejected":
            return Fail(REJECTED)
    lines: list[int] = params.get("lines") or []
    total = amount
    if lines:
        priced = await job.run_children(
            "lines",
            [(LINE_TYPE, {"invoice": params["invoice"], "amount": a}) for a in lines],
            max_attempts=job.task.max_attempts, lease_ttl=job.task.lease_ttl,
        )  # fmt: skip
        unpriced = [k for k in priced if not k.succeeded or not k.result]
        if unpriced:
            return Fail(f"{len(unpriced)} line item(s) could not be priced")
        total = sum(int(k.result["amount"]) for k in priced if k.result)
    request = {"invoice": params["invoice"], "amount": total}
    try:
        # The charge costs its amount against the tenant's budget, if it has one (G19).
        await job.effect("charge", provider_call, "charge", str(job.task.id), request,
                         cost={BUDGET_UNIT: total})  # fmt: skip
    except BudgetExceeded as exc:
        left = exc.remaining.get(BUDGET_UNIT, 0)
        return Fail(f"{BUDGET_STOP}: {total} {BUDGET_UNIT} asked, {left} left")
    await job.sleep("settle", SETTLE)
    await job.effect("email", provider_call, "email", str(job.task.id), request)
    return Succeed(
        payload={"total": total, "lines": len(lines)},
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
