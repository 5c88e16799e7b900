"""Testing your handlers with agentdb's testing kit: pip install 'agentdb-pg[testing]'.

pytest test_my_handlers.py                                    # on an embedded Postgres
AGENTDB_TEST_DSN=postgresql://postgres@localhost/postgres pytest test_my_handlers.py
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import asyncpg
import pytest

from agentdb import Message, tasks
from agentdb.testing import (
    Database,
    NotIdempotent,
    RecordingProvider,
    assert_events,
    assert_operation,
    assert_outbox,
    assert_tasks,
    crash_test,
    drain,
)
from agentdb.worker import Job, Succeed

# A fake payment provider: it records every call in the test database and
# performs each idempotency key once, like a real payment API.
payments = RecordingProvider("payments")


async def send_invoice(job: Job) -> Succeed:
    """Reserve the charge (committed), call the provider with its key, record the outcome."""
    invoice = job.task.params["invoice"]
    res = await job.reserve(f"invoice-{invoice}/charge", "charge", {"invoice": invoice})
    if res.fresh:
        key = res.operation.idempotency_key
        ref = await payments.call("charge", {"invoice": invoice}, idempotency_key=key)
        await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
    return Succeed(outbox=(Message("invoice.paid", {"invoice": invoice}),))


async def send_invoice_charging_first(job: Job) -> Succeed:
    """The bug the crash test is for: the provider is called before anything is reserved."""
    invoice = job.task.params["invoice"]
    ref = await payments.call("charge", {"invoice": invoice})  # no key: nothing to key it by yet
    res = await job.reserve(f"invoice-{invoice}/charge", "charge", {"invoice": invoice})
    if res.fresh:
        await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
    return Succeed()


# What `agentdb worker test_my_handlers:HANDLERS` would run: the handlers, and the hook
# that asks the provider, after a crash, whether a charge happened.
HANDLERS = SimpleNamespace(
    handlers={"send_invoice": send_invoice}, reconcilers={"charge": payments.lookup}
)
CHARGING_FIRST = SimpleNamespace(
    handlers={"send_invoice": send_invoice_charging_first},
    reconcilers={"charge": payments.lookup},
)


@pytest.mark.asyncio
async def test_an_invoice_is_charged_once_and_announced(
    agentdb_pool: asyncpg.Pool, agentdb_tenant: uuid.UUID
) -> None:
    task = await tasks.create(agentdb_pool, agentdb_tenant, "send_invoice", params={"invoice": 42})

    result = await drain(agentdb_pool, HANDLERS)  # a real worker, in-process, until idle

    assert result.count("succeeded") == 1, result
    await assert_tasks(agentdb_pool, "succeeded", count=1, task_type="send_invoice")
    op = await assert_operation(agentdb_pool, "invoice-42/charge", outcome="succeeded")
    await assert_events(
        agentdb_pool,
        task.id,
        ["task.created", "task.claimed", "operation.reserved", "operation.succeeded",
         "task.succeeded"],
    )  # fmt: skip
    await assert_outbox(agentdb_pool, "invoice.paid", count=1, payload={"invoice": 42})
    [charge] = await payments.effects(agentdb_pool)
    assert charge.reference == op.provider_reference


@pytest.mark.asyncio
async def test_a_worker_killed_at_any_step_charges_once(agentdb_db: Database) -> None:
    # A worker process is SIGKILLed at each step, a fresh one recovers the task,
    # and the provider must have charged exactly as often as without a crash.
    report = await crash_test(agentdb_db, HANDLERS, [("send_invoice", {"invoice": 7})], payments)
    assert report.ok, report
    assert not report.not_reached, report  # every step was crashed at, none left out


@pytest.mark.asyncio
async def test_the_crash_test_catches_charging_before_reserving(agentdb_db: Database) -> None:
    with pytest.raises(NotIdempotent, match="not idempotent at after_reserve"):
        await crash_test(
            agentdb_db, CHARGING_FIRST, [("send_invoice", {"invoice": 7})], payments,
            points=["after_reserve"],
        )  # fmt: skip
