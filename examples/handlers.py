"""The handlers the README shows, section by section: each of its handler blocks is an excerpt
of this file (tests/test_readme.py checks it), and the suite runs every handler here against
Postgres with the fake providers below.

    agentdb worker examples.handlers:HANDLERS --dsn "$DATABASE_URL"
"""

from __future__ import annotations

import uuid
from typing import Any

from agentdb import Message
from agentdb.worker import Fail, Job, NotPerformed, Succeed, Wait


class Declined(NotPerformed):
    """The card was declined: nothing happened, so a retry may call again."""


class FakePSP:
    """A payment API that performs each idempotency key once (as Stripe's does)."""

    Declined = Declined

    def __init__(self) -> None:
        self.charges: dict[str, dict[str, Any]] = {}

    async def charge(self, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        return self.charges.setdefault(
            idempotency_key, {"id": f"ch_{uuid.uuid4().hex[:8]}", "amount": amount}
        )


class FakeMail:
    def __init__(self) -> None:
        self.sent: dict[str, str] = {}

    async def send(self, to: str, body: str, *, idempotency_key: str) -> dict[str, str]:
        self.sent.setdefault(idempotency_key, to)
        return {"message": idempotency_key[-8:]}


psp = FakePSP()
mail = FakeMail()


def price_lines(lines: list[int]) -> int:
    """A computation: safe to run again if a crash lands mid-call, so a step."""
    return sum(lines)


# ---- Workers and relays --------------------------------------------------------------------


async def send_invoice(job: Job) -> Succeed:
    inv = job.task.params["invoice"]
    total = await job.step("price", price_lines, job.task.params["lines"])  # once, then replayed
    charge = await job.effect("charge", psp.charge, total)  # reserved, committed, then called
    await job.effect("receipt", mail.send, job.task.params["email"], f"paid {total}")
    return Succeed(payload={"charge": charge["id"]},
                   outbox=(Message("invoice.paid", {"invoice": inv}),))  # fmt: skip


# ---- Signals and approvals -----------------------------------------------------------------


async def pay_invoice(job: Job) -> Succeed | Fail:
    review = await job.wait_for_signal("review", "approval")  # sleeps until one arrives
    if review.decision != "approved":
        return Fail(f"rejected by {review.sender}: {review.payload.get('comment')}")
    charge = await job.effect("charge", psp.charge, job.task.params["amount"])
    return Succeed(payload={"charge": charge["id"], "approved_by": review.sender})


# The same, by hand: read the unread signals, and Wait for one when the approval is not
# among them. The cursor moves past what a run read only when it waits for a signal.
async def pay_invoice_by_hand(job: Job) -> Wait | Succeed:
    seen = await job.signals()  # unread signals, in order
    if not any(s.kind == "approval" and s.decision == "approved" for s in seen):
        return Wait(signal="approval")  # sleep until one arrives (until= is a timeout)
    return Succeed()


# ---- Child tasks ---------------------------------------------------------------------------


async def invoice(job: Job) -> Succeed:
    lines = await job.run_children(
        "lines", [("invoice_line", {"line": line}) for line in job.task.params["lines"]]
    )  # spawned once; returns when all have finished (quorum=2: when two have)
    return Succeed(payload={"total": sum(c.result["amount"] for c in lines if c.result)})


async def invoice_line(job: Job) -> Succeed:
    return Succeed(payload={"amount": job.task.params["line"]})


HANDLERS = {
    "send_invoice": send_invoice,
    "pay_invoice": pay_invoice,
    "pay_invoice_by_hand": pay_invoice_by_hand,
    "invoice": invoice,
    "invoice_line": invoice_line,
}
