"""Handlers the testing kit's own tests run (in-process and in crash-matrix worker processes)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from agentdb.testing import RecordingProvider
from agentdb.worker import MANUAL, Job, Retry, Succeed, Wait

psp = RecordingProvider("psp")
mailer = RecordingProvider("mailer")


async def charge_and_email(job: Job) -> Succeed:
    """Two effects at two providers, each reserved before its call."""
    order = job.task.params["order"]
    for action, provider in (("charge", psp), ("email", mailer)):
        res = await job.reserve(f"order-{order}/{action}", action, {"order": order})
        if res.fresh:
            ref = await provider.call(
                action, {"order": order}, idempotency_key=res.operation.idempotency_key
            )
            await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
    return Succeed()


async def ignores_fresh(job: Job) -> Succeed:
    """Reserves, then calls whatever the reservation said: a recovered attempt calls again
    for a charge agentdb had recorded done (the key hides it from the provider's effects)."""
    order = job.task.params["order"]
    res = await job.reserve(f"order-{order}/charge", "charge", {"order": order})
    ref = await psp.call("charge", {"order": order}, idempotency_key=res.operation.idempotency_key)
    if res.fresh:
        await job.complete(res.operation, result={"ref": ref}, provider_reference=ref)
    return Succeed()


_failures: dict[str, int] = {}


async def flaky(job: Job) -> Succeed:
    """Raises on its first attempt, succeeds on the second."""
    key = str(job.task.id)
    _failures[key] = _failures.get(key, 0) + 1
    if _failures[key] == 1:
        raise ConnectionError("first attempt refused")
    return Succeed()


async def always_raises(job: Job) -> None:
    raise ValueError("broken handler")


async def sleeps(job: Job) -> Wait:
    """Waits for an hour: a waiting task is not work left for a drain."""
    return Wait(datetime.now(UTC) + timedelta(hours=1))


async def later(job: Job) -> Retry:
    """Retries in an hour: not due, so not work left either."""
    return Retry("not yet", after=timedelta(hours=1))


async def hangs(job: Job) -> None:
    await asyncio.sleep(3600)


TWO_PROVIDERS = SimpleNamespace(
    handlers={"order": charge_and_email},
    reconcilers={"charge": psp.lookup, "email": mailer.lookup},
)
IGNORES_FRESH = SimpleNamespace(
    handlers={"order": ignores_fresh}, reconcilers={"charge": psp.lookup}
)
#: No reconcile hook: a crash after the reservation leaves the charge unknown, and the next
#: attempt calls the provider again with its key (which the provider answers from its key).
NO_HOOK = {"order": charge_and_email}
#: MANUAL: a crash after the reservation parks the task until an operator settles the charge.
MANUAL_CHARGE = SimpleNamespace(
    handlers={"order": charge_and_email}, reconcilers={"charge": MANUAL, "email": MANUAL}
)


def _plan(order: int) -> dict[str, int]:
    """A pure step: may run again after a crash mid-step, and that is fine."""
    return {"order": order, "items": 2}


async def durable_order(job: Job) -> Succeed:
    """Straight-line (G25): a step, a fan-out to two children, an effect, a durable sleep,
    another effect - each recorded, so every crash resumes where the last run stopped."""
    order = job.task.params["order"]
    plan = await job.step("plan", _plan, order)
    items = await job.run_children(
        "items", [("d-item", {"order": order, "n": n}) for n in range(plan["items"])],
        lease_ttl=timedelta(seconds=1),
    )  # fmt: skip
    total = sum(int(i.result["price"]) for i in items if i.result)
    await job.effect("charge", psp.call, "charge", {"order": order, "total": total})
    await job.sleep("settle", timedelta(milliseconds=20))
    await job.effect("email", mailer.call, "email", {"order": order})
    return Succeed(payload={"total": total})


async def durable_item(job: Job) -> Succeed:
    return Succeed(payload={"price": 10 + job.task.params["n"]})


#: No hooks at all: an unknown outcome is called again with its key.
DURABLE = {"d-order": durable_order, "d-item": durable_item}
